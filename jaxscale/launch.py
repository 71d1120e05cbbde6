"""`jaxscale launch -n N -- <command>`: N local processes joined by `jax.distributed` on loopback.

The launcher plays torch's `mp.spawn`: it picks a free 127.0.0.1 port, gives each child 1/N of
the CPU devices (JAX_NUM_CPU_DEVICES) and the rendezvous in environment variables, and, if one
child fails or the run exceeds --timeout, stops the others (SIGTERM, then SIGKILL) and exits
non-zero naming the process. Output: process 0's lines as they are (so JSON stays parseable);
`--all-ranks` shows every process's, prefixed `[pK]`; a failing process's last lines are shown
either way. Gloo's connection lines are hidden unless `--verbose`. A child joins by calling
`maybe_initialize_distributed()` before jax starts its backend (CPU collectives over gloo).

This module imports jax only inside functions, so the CLI stays fast.
"""

import argparse
import collections
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from jaxscale.cliutil import positive_float, positive_int

ENV_COORDINATOR = "JAXSCALE_COORDINATOR"
ENV_NUM_PROCESSES = "JAXSCALE_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXSCALE_PROCESS_ID"
INIT_TIMEOUT_S = 60  # a peer that never arrives fails the child instead of hanging it


def maybe_initialize_distributed() -> bool:
    """Join the launcher's process group if the environment names one; True if joined.

    Call before any jax computation (jax.distributed must initialise before the backend).
    Safe to call twice. Outside `jaxscale launch` it does nothing.
    """
    coordinator = os.environ.get(ENV_COORDINATOR)
    if not coordinator:
        return False
    import jax

    if jax.distributed.is_initialized():
        return True
    num_processes = int(os.environ[ENV_NUM_PROCESSES])
    process_id = int(os.environ[ENV_PROCESS_ID])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator, num_processes, process_id, initialization_timeout=INIT_TIMEOUT_S
    )
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_command(cmd: list[str]) -> list[str]:
    """`jaxscale …` and `python …` run with this interpreter; anything else runs as given."""
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ValueError("nothing to launch: give a command after --, e.g. -- jaxscale hello")
    if cmd[0] == "jaxscale":
        return [sys.executable, "-m", "jaxscale", *cmd[1:]]
    if cmd[0] in ("python", "python3"):
        return [sys.executable, *cmd[1:]]
    if shutil.which(cmd[0]) is None:
        raise ValueError(f"command not found: {cmd[0]!r} (e.g. -- jaxscale doctor)")
    return list(cmd)


def child_env(total_devices: int, num_processes: int, process_id: int, port: int) -> dict:
    if num_processes < 1:
        raise ValueError(f"--num-processes: need at least one process, got {num_processes}")
    if total_devices < 1 or total_devices % num_processes:
        raise ValueError(
            f"--num-processes {num_processes}: {total_devices} devices (--devices) "
            f"do not split evenly over {num_processes} processes"
        )
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")  # the loopback lab runs on CPU devices
    env.update(
        JAX_NUM_CPU_DEVICES=str(total_devices // num_processes),
        PYTHONUNBUFFERED="1",
        **{
            ENV_COORDINATOR: f"127.0.0.1:{port}",
            ENV_NUM_PROCESSES: str(num_processes),
            ENV_PROCESS_ID: str(process_id),
        },
    )
    return env


_GLOO = re.compile(
    r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. Expected number of "
    r"connected peer ranks is : ?\d*"
)


def _forward(proc, prefix: str, lock, show: bool, verbose: bool, tail: collections.deque):
    """Copy a child's lines to stdout (prefixed, or bare when `prefix` is empty), keeping its last
    lines in `tail`. Gloo's start-up lines (which its threads interleave, leaving stray digits)
    are dropped unless `verbose`."""
    preamble = True
    for line in proc.stdout:
        line = line.rstrip("\n")
        if not verbose:
            # its threads can interleave several lines into one (or split one into several):
            # any line holding a piece of one goes
            cleaned = _GLOO.sub("", line).strip()
            gloo = cleaned != line.strip() or "[Gloo]" in line or "peer ranks" in line
            if gloo or (preamble and (cleaned.isdigit() or not cleaned)):  # its leftovers
                continue
            preamble = preamble and not cleaned
        tail.append(line)
        if show:
            with lock:
                print(f"{prefix} {line}" if prefix else line, flush=True)


def _stop(procs: list[subprocess.Popen], grace_s: float = 3.0) -> None:
    """SIGTERM each still-running child's process group (a training run stops after its step
    and saves), then SIGKILL what is left after `grace_s` -- at once on a Ctrl-C meanwhile."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 3.0)):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        try:
            while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
                time.sleep(0.05)
        except KeyboardInterrupt:  # the second Ctrl-C: kill now
            print("jaxscale launch: killing the processes now", file=sys.stderr, flush=True)


def run_processes(
    cmd: list[str],
    num_processes: int,
    total_devices: int,
    timeout_s: float,
    all_ranks: bool = False,
    verbose: bool = False,
    grace_s: float = 120.0,
) -> int:
    """Start the children, forward their output, and supervise them. Returns the exit code.
    On Ctrl-C (or SIGTERM, via `jaxscale launch`) the children get SIGTERM and `grace_s`
    seconds to finish their step and save."""
    argv = child_command(cmd)
    port = _free_port()
    envs = [child_env(total_devices, num_processes, i, port) for i in range(num_processes)]
    lock = threading.Lock()
    procs, readers, tails = [], [], []
    for i, env in enumerate(envs):
        p = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        procs.append(p)
        tails.append(collections.deque(maxlen=20))
        prefix = f"[p{i}]" if all_ranks else ""
        t = threading.Thread(
            target=_forward,
            args=(p, prefix, lock, all_ranks or i == 0, verbose, tails[-1]),
            daemon=True,
        )
        t.start()
        readers.append(t)
    deadline = time.monotonic() + timeout_s
    failure = None  # (message, exit code)
    try:
        while True:
            failed = next(((i, p.poll()) for i, p in enumerate(procs) if p.poll()), None)
            if failed:
                i, code = failed
                failure = (f"process {i} exited with code {code}", code if code > 0 else 1)
                break
            running = [str(i) for i, p in enumerate(procs) if p.poll() is None]
            if not running:
                break
            if time.monotonic() > deadline:
                still = ", ".join(f"p{i}" for i in running)
                failure = (f"timed out after {timeout_s:g} s; still running: {still}", 124)
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        failure = ("interrupted", 130)
        print(
            f"\njaxscale launch: interrupted; waiting up to {grace_s:g} s for the processes to "
            "finish their step and save (Ctrl-C again to kill them now)",
            file=sys.stderr,
            flush=True,
        )
    finally:
        _stop(procs, grace_s if failure and failure[1] == 130 else 3.0)
        for t in readers:
            t.join(timeout=2.0)
    if failure is None:
        return 0
    message, code = failure
    failed = re.match(r"process (\d+) exited", message)
    if failed and not all_ranks and failed.group(1) != "0":  # its output was not shown: its end
        i = int(failed.group(1))
        for line in tails[i]:
            print(f"[p{i}] {line}", file=sys.stderr)
    codes = ", ".join(f"p{i}={p.returncode}" for i, p in enumerate(procs))
    print(
        f"jaxscale launch: {message}; stopped the remaining processes ({codes})",
        file=sys.stderr,
        flush=True,
    )
    return code


def _launch_main(args) -> int:
    total = args.devices or int(os.environ.get("JAX_NUM_CPU_DEVICES") or 8)
    try:
        child_env(total, args.num_processes, 0, 0)
        child_command(args.cmd)
    except ValueError as e:
        args.parser.error(str(e))
    # SIGTERM (a scheduler's stop) is a Ctrl-C to the launcher: the children run in their own
    # sessions, so the launcher killed by it would leave them training with nobody to stop them
    main = threading.current_thread() is threading.main_thread()  # where handlers can be set
    previous = signal.signal(signal.SIGTERM, _interrupt) if main else None
    try:
        code = run_processes(
            args.cmd,
            args.num_processes,
            total,
            args.timeout,
            args.all_ranks,
            args.verbose,
            args.grace,
        )
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    if code == 130 and main:  # stopped: a further Ctrl-C while the interpreter cleans up ends
        # the process at once, quietly (the children are down)
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    return code


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def add_parser(sub) -> None:
    p = sub.add_parser(
        "launch",
        help="run a jaxscale command in N local processes (jax.distributed on loopback)",
        description="Run a command in N local processes joined by jax.distributed on loopback "
        "(the multi-host path on one machine).",
        epilog="example: jaxscale launch -n 2 -- jaxscale train --mesh dp=2,fsdp=2,tp=2 --steps 50",
    )
    p.add_argument(
        "-n", "--num-processes", type=positive_int, default=2, help="processes (default 2)"
    )
    p.add_argument(
        "--devices",
        type=positive_int,
        default=None,
        help="CPU devices in total, split evenly (default: $JAX_NUM_CPU_DEVICES or 8)",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=600.0,
        help="seconds before stopping all (default 600)",
    )
    p.add_argument(
        "--all-ranks",
        action="store_true",
        help="show every process's output, prefixed [pK] (default: process 0's)",
    )
    p.add_argument(
        "--grace",
        type=positive_float,
        default=120.0,
        help="on Ctrl-C, seconds the processes get to finish their step and save before they "
        "are killed (default 120; a second Ctrl-C kills them at once)",
    )
    p.add_argument("--verbose", action="store_true", help="also show gloo's connection lines")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command to run")
    p.set_defaults(func=_launch_main, parser=p)
