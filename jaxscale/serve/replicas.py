"""The engines' threads, and data-parallel serving: several engines behind one server (seed
001 §9's load balancing across replicas).

`EngineThread` steps one engine in its own thread. `jaxscale serve --mesh dp=2,tp=2` builds one
engine per replica, each on its own devices (a tensor mesh of tp devices; tp=1: one device) with
its own KV pool and prefix cache, each stepped by its own thread. `Router` sends a request to the
replica with the fewest requests in flight (ties: the lowest index). A request's tokens depend
only on its prompt, seed and settings, never on what shares its batch, so every replica answers
as one device would.

`Router` has `EngineThread`'s interface (submit, abort, stop, errors) and the server always talks
to one: it does not know how many engines it drives. A replica whose step fails ends its own
requests with the error; the others keep serving.
"""

from __future__ import annotations

import queue
import threading

from jaxscale.serve.engine import Engine
from jaxscale.serve.scheduler import Request


def replica_meshes(spec: str | None, devices) -> list:
    """The meshes of `--mesh SPEC` over `devices`: [None] (one engine, one device) without a
    spec; else one mesh per data-parallel replica (consecutive devices): tensor-parallel (tp=N)
    or, for an MoE model, expert-parallel (ep=N; `program.place` checks the model). Any other
    axis is refused (ValueError naming it)."""
    if spec is None:
        return [None]
    import math

    from jaxscale.mesh import build_mesh, parse_mesh

    try:
        parsed = parse_mesh(spec)
    except ValueError as e:
        raise ValueError(f"--mesh {spec}: {e}") from None
    sizes = dict(parsed.axes)
    other = sorted(set(sizes) - {"data", "tensor", "expert"})
    if other:
        raise ValueError(
            f"--mesh {spec}: the engine runs tensor-parallel (tp=N) or expert-parallel (ep=N) "
            f"decode in data-parallel replicas (dp=N); it has no use for {', '.join(other)}"
        )
    if -1 in sizes.values():
        raise ValueError(f"--mesh {spec}: give every axis its size (the engine uses N devices)")
    n = math.prod(sizes.values())
    if n > len(devices):
        raise ValueError(f"--mesh {spec} needs {n} devices; this process has {len(devices)}")
    dp, tp, ep = sizes.get("data", 1), sizes.get("tensor", 1), sizes.get("expert", 1)
    if tp > 1 and ep > 1:
        raise ValueError(f"--mesh {spec}: the engine splits one model over tp or ep, not both")
    one = parse_mesh(f"ep={ep}" if ep > 1 else f"tp={tp}")
    k = tp * ep
    return [build_mesh(one, devices=devices[i * k : (i + 1) * k]) for i in range(dp)]


class EngineError(RuntimeError):
    """An engine step failed while this request was in flight (a 500, not the client's fault)."""


class EngineThread:
    """The engine's own loop: takes submissions and aborts from a queue, steps while there is
    work, and hands each event to the callback its request was submitted with."""

    def __init__(self, engine: Engine, profile=None):
        self.engine = engine
        self.profile = profile  # profiling.StepWindow: a trace of the first busy steps
        self.inbox: queue.Queue = queue.Queue()
        self.callbacks: dict[str, callable] = {}
        self.stopped = threading.Event()
        self.errors = 0  # engine steps that raised
        self.thread = threading.Thread(target=self._loop, name="jaxscale-engine", daemon=True)
        self.thread.start()

    def submit(self, req: Request, callback) -> None:
        self.inbox.put(("add", req, callback))

    def abort(self, request_id: str) -> None:
        self.inbox.put(("abort", request_id, None))

    def stop(self) -> None:
        self.stopped.set()
        self.inbox.put(("stop", None, None))
        self.thread.join(timeout=30)

    def _handle(self, kind, item, callback) -> None:
        if kind == "add":
            try:
                self.engine.add(item)
                self.callbacks[item.id] = callback
            except ValueError as e:
                callback(e)
        elif kind == "abort" and self.engine.abort(item):
            self.callbacks.pop(item, None)

    def _loop(self) -> None:
        while not self.stopped.is_set():
            busy = self.engine.has_work()
            try:  # block only when idle
                self._handle(*self.inbox.get(timeout=None if not busy else 0))
                while True:
                    self._handle(*self.inbox.get_nowait())
            except queue.Empty:
                pass
            if self.stopped.is_set() or not self.engine.has_work():
                continue
            try:
                events = self.engine.step()
            except Exception as e:  # noqa: BLE001 - reported to every client, the loop goes on
                self._fail_all(e)
                continue
            if self.profile is not None:
                self.profile.step(self.engine.pool)
            for ev in events:
                cb = self.callbacks.get(ev.request_id)
                if cb is not None:
                    cb(ev)
                if ev.finish_reason is not None:
                    self.callbacks.pop(ev.request_id, None)

    def _fail_all(self, error: Exception) -> None:
        """An engine step raised: every request in flight ends with the error (a 500 to its
        client) and is aborted, so the engine is empty and serves the next requests."""
        self.errors += 1
        for rid, cb in list(self.callbacks.items()):
            self.engine.abort(rid, "error")
            cb(EngineError(f"the engine failed: {type(error).__name__}: {error}"))
        self.callbacks.clear()


class Router:
    """The replicas' engine threads and where each request in flight went."""

    def __init__(self, engines: list[Engine], profile=None):
        # the profiler is the process's: one window, on the first replica's steps
        self.threads = [EngineThread(e, profile if i == 0 else None) for i, e in enumerate(engines)]
        self.where: dict[str, int] = {}  # request id -> replica
        self.lock = threading.Lock()

    @property
    def errors(self) -> int:
        return sum(t.errors for t in self.threads)

    def loads(self) -> list[int]:
        """Requests in flight per replica."""
        with self.lock:
            counts = [0] * len(self.threads)
            for i in self.where.values():
                counts[i] += 1
        return counts

    def submit(self, req: Request, callback) -> int:
        """Send `req` to the least-loaded replica; returns its index."""
        loads = self.loads()
        i = loads.index(min(loads))
        with self.lock:
            self.where[req.id] = i

        def relay(ev):
            # the request's last event (or its error) ends it on that replica
            if isinstance(ev, Exception) or ev.finish_reason is not None:
                with self.lock:
                    self.where.pop(req.id, None)
            callback(ev)

        self.threads[i].submit(req, relay)
        return i

    def abort(self, request_id: str) -> None:
        with self.lock:
            i = self.where.pop(request_id, None)
        if i is not None:
            self.threads[i].abort(request_id)

    def stop(self) -> None:
        for t in self.threads:
            t.stop()
