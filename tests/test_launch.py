"""`jaxscale launch` (N local processes over jax.distributed) and `jaxscale hello` (seed ch1).

The 2-process test runs real processes with a bounded time; the failure tests check that the
launcher stops the others and names the failing process.
"""

import json
import subprocess
import sys
import time

import pytest

from jaxscale import launch
from jaxscale.cli import main as cli_main
from jaxscale.lessons import ranks as demos

LAUNCH_TIMEOUT_S = 120  # generous on a loaded 2-core machine; a hang fails the test, not CI


def _launch(*args, timeout=LAUNCH_TIMEOUT_S + 30):
    cmd = [sys.executable, "-m", "jaxscale", "launch", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_hello_in_two_processes_matches_one_process_with_eight_devices():
    out = _launch(
        "-n", "2", "--timeout", str(LAUNCH_TIMEOUT_S), "--", "jaxscale", "hello", "--json"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    payload = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(payload) == 1, out.stdout  # one JSON object, from process 0 only, unprefixed
    assert "[Gloo]" not in out.stdout  # the connection chatter is hidden by default
    multi = json.loads(payload[0])
    single = demos.hello(demos.line_mesh(8))  # this test process: 1 process x 8 devices
    assert multi["processes"] == 2 and multi["world_size"] == 8
    assert multi["gathered"] == single.gathered.tolist()
    assert multi["rank_sum"] == single.rank_sum == 28.0  # seed 002 ch1: W(W-1)/2
    assert multi["correct"] is True


def test_doctor_sees_eight_devices_across_two_processes():
    """What `jaxscale launch -n 2 -- jaxscale doctor` runs once __main__ joins the group first."""
    script = (
        "import sys; from jaxscale.launch import maybe_initialize_distributed as join; join(); "
        "from jaxscale.cli import main; sys.exit(main(['doctor', '--json']))"
    )
    out = _launch(
        "-n", "2", "--timeout", str(LAUNCH_TIMEOUT_S), "--all-ranks", "--", "python", "-c", script
    )
    assert out.returncode == 0, out.stderr[-2000:]
    reports = [
        json.loads(line.split("] ", 1)[1])
        for line in out.stdout.splitlines()
        if line.startswith(("[p0] {", "[p1] {"))
    ]
    assert sorted(r["process_index"] for r in reports) == [0, 1]
    for r in reports:
        assert (r["device_count"], r["local_device_count"], r["process_count"]) == (8, 4, 2)
        assert r["psum_smoke"]["ok"]


def test_a_failing_child_stops_the_others_and_is_named():
    script = (
        "import os, sys, time; pid = int(os.environ['JAXSCALE_PROCESS_ID']); "
        "assert os.environ['JAX_NUM_CPU_DEVICES'] == '4'; "
        "time.sleep(60) if pid == 0 else sys.exit(3)"
    )
    start = time.monotonic()
    out = _launch("-n", "2", "--", "python", "-c", script, timeout=60)
    assert time.monotonic() - start < 30  # p0's 60 s sleep was cut short
    assert out.returncode == 3
    assert "process 1 exited with code 3" in out.stderr


def test_timeout_stops_everyone():
    out = _launch("-n", "2", "--timeout", "1", "--", "python", "-c", "import time; time.sleep(60)")
    assert out.returncode == 124
    assert "timed out after 1 s" in out.stderr and "p0, p1" in out.stderr


def test_process_0_speaks_by_default_and_every_rank_with_all_ranks():
    script = "import os; print('rank', os.environ['JAXSCALE_PROCESS_ID'])"
    out = _launch("-n", "2", "--", "python", "-c", script, timeout=60)
    assert out.returncode == 0
    assert out.stdout.splitlines() == ["rank 0"]
    out = _launch("-n", "2", "--all-ranks", "--", "python", "-c", script, timeout=60)
    assert "[p0] rank 0" in out.stdout and "[p1] rank 1" in out.stdout


def test_a_failing_quiet_rank_shows_its_last_lines():
    script = (
        "import os, sys; pid = os.environ['JAXSCALE_PROCESS_ID']; "
        "print('boom from', pid); sys.exit(4 if pid == '1' else 0)"
    )
    out = _launch("-n", "2", "--", "python", "-c", script, timeout=60)
    assert out.returncode == 4 and "[p1] boom from 1" in out.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["launch", "-n", "3", "--", "jaxscale", "hello"], "do not split evenly"),
        (["launch", "-n", "0", "--", "jaxscale", "hello"], "argument -n/--num-processes"),
        (["launch", "-n", "2", "--", "jaxscal", "doctor"], "command not found: 'jaxscal'"),
        (["launch", "-n", "2"], "nothing to launch"),
        (["launch", "--timeout", "0", "--", "jaxscale", "hello"], "--timeout"),
        (["hello", "-w", "9"], "--world-size 9"),
    ],
)
def test_bad_input_exits_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_child_command_and_environment():
    assert launch.child_command(["--", "jaxscale", "doctor"]) == [
        sys.executable,
        "-m",
        "jaxscale",
        "doctor",
    ]
    assert launch.child_command(["python", "x.py"]) == [sys.executable, "x.py"]
    env = launch.child_env(8, 2, 1, 12345)
    assert env["JAX_NUM_CPU_DEVICES"] == "4"
    assert env[launch.ENV_COORDINATOR] == "127.0.0.1:12345"
    assert (env[launch.ENV_NUM_PROCESSES], env[launch.ENV_PROCESS_ID]) == ("2", "1")


def test_maybe_initialize_is_a_no_op_outside_launch(monkeypatch):
    monkeypatch.delenv(launch.ENV_COORDINATOR, raising=False)
    assert launch.maybe_initialize_distributed() is False


@pytest.mark.parametrize("w, expected", [(8, 28), (4, 6)])
def test_hello_command_json(w, expected, capsys):
    assert cli_main(["hello", "-w", str(w), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["rank_sum"] == expected and payload["processes"] == 1
    assert payload["gathered"][-1] == [10.0 * (w - 1), 10.0 * (w - 1) + 1]


def test_hello_command_table(capsys):
    assert cli_main(["hello", "-w", "4"]) == 0
    out = capsys.readouterr().out
    assert "[Rank 3/4] Hello!" in out and "I handle odd data!" in out
    assert "From rank 3: [30.0, 31.0]" in out and "Correct: True" in out


GLOO = "[Gloo] Rank {} is connected to 1 peer ranks. Expected number of connected peer ranks is : "


@pytest.mark.parametrize(
    "stream",
    [
        # one line per rank, as a quiet start prints them
        [GLOO.format(0) + "1", "hello from the program"],
        # two ranks' threads interleaved: one line holds both, the last digit on its own
        [GLOO.format(0) + GLOO.format(1) + "1", "1", "hello from the program"],
        # the digit first, then the line that lost it
        ["1", GLOO.format(1), "hello from the program"],
        # three threads' lines woven character-wise into one (seen on CI)
        [
            "[Gloo] Rank 1[Gloo] Rank [Gloo] Rank  is connected to 723 peer ranks. Expected "
            "number of connected peer ranks is :  is connected to  is connected to 777 peer "
            "ranks.  peer ranks. Expected number of connected peer ranks is : Expected number "
            "of connected peer ranks is : 77",
            "",
            "hello from the program",
        ],
    ],
    ids=["separate", "interleaved", "digit-first", "woven"],
)
def test_gloos_start_up_lines_and_their_stray_digits_are_dropped(stream):
    """The child's output as gloo's threads leave it (the fragments a user saw leak): every
    start-up line and stray digit before the program's first line is dropped, the program's
    own lines, a bare number among them included, are kept; --verbose keeps everything."""
    import collections
    import threading
    import types

    def forward(lines, verbose=False):
        proc = types.SimpleNamespace(stdout=[line + "\n" for line in lines])
        tail = collections.deque(maxlen=100)
        launch._forward(proc, "", threading.Lock(), False, verbose, tail)
        return list(tail)

    program = ["hello from the program", "7", "done"]
    assert forward([*stream[:-1], *program]) == program
    assert forward([*stream[:-1], *program], verbose=True) == [*stream[:-1], *program]
