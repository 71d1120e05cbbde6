"""`jaxscale launch -n N -- <command>`: N local processes joined by `jax.distributed` on loopback.

The launcher plays torch's `mp.spawn`: it picks a free 127.0.0.1 port, gives each child 1/N of
the CPU devices (JAX_NUM_CPU_DEVICES) and the rendezvous in environment variables, prefixes each
child's output lines with `[pK]`, and, if one child fails or the run exceeds --timeout, stops
the others and exits non-zero naming the process. A child joins by calling
`maybe_initialize_distributed()` before jax starts its backend (CPU collectives over gloo).

This module imports jax only inside functions, so the CLI stays fast.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

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
    return list(cmd)


def child_env(total_devices: int, num_processes: int, process_id: int, port: int) -> dict:
    if num_processes < 1:
        raise ValueError(f"need at least one process, got {num_processes}")
    if total_devices < 1 or total_devices % num_processes:
        raise ValueError(
            f"{total_devices} devices do not split evenly over {num_processes} processes"
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


def _forward(proc: subprocess.Popen, prefix: str, lock: threading.Lock) -> None:
    for line in proc.stdout:
        with lock:
            print(f"{prefix} {line.rstrip()}", flush=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each still-running child's process group, then SIGKILL after a grace period."""
    for sig, grace_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
            time.sleep(0.05)


def run_processes(cmd: list[str], num_processes: int, total_devices: int, timeout_s: float) -> int:
    """Start the children, forward their output, and supervise them. Returns the exit code."""
    argv = child_command(cmd)
    port = _free_port()
    envs = [child_env(total_devices, num_processes, i, port) for i in range(num_processes)]
    lock = threading.Lock()
    procs, readers = [], []
    for i, env in enumerate(envs):
        p = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            bufsize=1, start_new_session=True,
        )  # fmt: skip
        procs.append(p)
        t = threading.Thread(target=_forward, args=(p, f"[p{i}]", lock), daemon=True)
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
    finally:
        _stop(procs)
        for t in readers:
            t.join(timeout=2.0)
    if failure is None:
        return 0
    message, code = failure
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
    if args.timeout <= 0:
        args.parser.error(f"--timeout must be positive, got {args.timeout}")
    return run_processes(args.cmd, args.num_processes, total, args.timeout)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "launch",
        help="run a jaxscale command in N local processes (jax.distributed on loopback)",
        description="Example: jaxscale launch -n 2 -- jaxscale hello",
    )
    p.add_argument("-n", "--num-processes", type=int, default=2, help="processes (default 2)")
    p.add_argument(
        "--devices", type=int, default=None,
        help="CPU devices in total, split evenly (default: $JAX_NUM_CPU_DEVICES or 8)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before stopping all")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command to run")
    p.set_defaults(func=_launch_main, parser=p)
