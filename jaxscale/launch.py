"""Placeholder hook: replaced by the module that implements these commands."""


def add_commands(sub):
    pass


def add_parser(sub):
    pass
