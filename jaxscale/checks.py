"""Input checks shared by the calculators and simulators: one ValueError wording per kind of bad
value, naming the argument (`positive(d_model=0)` -> "d_model must be > 0, got 0"). The first bad
value, in argument order, is the one reported. Pure Python (no jax, nothing else of ours)."""


def positive(**values: float) -> None:
    """Each value > 0 (NaN fails)."""
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def non_negative(**values: float) -> None:
    """Each value >= 0 (NaN fails)."""
    for name, value in values.items():
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")


def positive_ints(**values: int) -> None:
    """Each value an int >= 1 (a bool is not a count)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def positive_fields(config, *names: str) -> None:
    """The named fields of a dataclass instance: a positive integer where the field's default is
    an int, > 0 otherwise."""
    for name in names:
        value = {name: getattr(config, name)}
        if isinstance(getattr(type(config), name), int):
            positive_ints(**value)
        else:
            positive(**value)


def at_most(limit: int, unit: str, why: str, **sizes: int) -> None:
    """Refuse a run whose size, the product of `sizes`, is over `limit` (a simulation that would
    run for minutes), naming the command's flags: at_most(4096, "ops", why, pp=1000,
    microbatches=1000) says "--pp 1000 x --microbatches 1000 = 1,000,000 ops: at most 4,096 (why)".
    """
    size = 1
    for value in sizes.values():
        size *= value
    if size > limit:
        given = " x ".join(f"--{name.replace('_', '-')} {value}" for name, value in sizes.items())
        if len(sizes) == 1:
            raise ValueError(f"{given}: at most {limit:,} {unit} ({why})")
        raise ValueError(f"{given} = {size:,} {unit}: at most {limit:,} ({why})")
