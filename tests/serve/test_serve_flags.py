"""`jaxscale serve`'s flags and address, refused before anything compiles or listens."""

import socket

import pytest

from jaxscale.cli import main as cli_main


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--port", "70000"], "1..65535"),
        (["--port", "0"], "positive"),
        (["--model-name", ""], "non-empty"),
        (["--model-name", "my model"], "without spaces"),
        (["--kv-dtype", "fp8"], "invalid choice"),  # no fp8 KV cache (docs/serving.md)
    ],
)
def test_bad_flags_exit_2_naming_the_flag(flags, says, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["serve", *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and flags[0] in err and says in err


def test_a_port_in_use_is_one_line_before_the_banner(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        rc = cli_main(["serve", "--port", str(port)])
    err = capsys.readouterr().err
    assert rc == 2 and f"cannot listen on 127.0.0.1:{port}" in err
    assert "on http://" not in err and "Traceback" not in err  # no banner


def test_help_states_the_defaults_and_keeps_the_example_lines(capsys):
    with pytest.raises(SystemExit):
        cli_main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "(default 8000)" in out and "(default jaxscale)" in out
    assert "\n  jaxscale serve --ckpt-dir" in out and "\n  curl localhost:8000" in out


def test_a_mesh_the_engine_cannot_run_is_refused_in_one_line(capsys):
    rc = cli_main(["serve", "--mesh", "dp=2,fsdp=2", "--port", str(_free_port())])
    err = capsys.readouterr().err
    assert rc == 2 and "no use for fsdp" in err and "Traceback" not in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_start_up_signal_handlers_are_undone_when_it_does_not_serve(capsys):
    """Serve's start-up ends the process on Ctrl-C or SIGTERM (nothing to keep yet); a command
    that returns without serving (here a port in use, exit 2) leaves the handlers it found."""
    import signal

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        assert cli_main(["serve", "--port", str(taken.getsockname()[1])]) == 2
    assert {s: signal.getsignal(s) for s in before} == before
