"""Point-to-point message passing between rank programs: a small simulator that finds deadlocks
and hangs (seed 002 ch2, "Point-to-Point Communication": "The Blocking vs Non-Blocking Dance"
and "Common Pitfalls").

`jax.lax.ppermute` names every (source, target) pair at once, so an SPMD program can neither
deadlock nor leave a receive unmatched. torch's send/recv can; this simulator shows how.

Semantics (MPI-like): messages between a pair of ranks match in posting order. A blocking `Send`
is a rendezvous by default: it returns once the matching receive is posted (mode="eager" buffers
it and returns at once, which is why small-message deadlocks often hide). `Recv` blocks until the
matching send is posted. `Isend`/`Irecv` post and return a handle; `Wait` blocks until the handle's
message is matched, and only then does an `Irecv` write its variable (reading earlier sees the old
value: pitfall 3). A send carries its variable's value at posting time.

When no rank can move and some are unfinished, the wait-for graph decides: a cycle of blocked
ranks is a deadlock; a chain that ends at a finished rank is a hang (an unmatched receive or send).
"""

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Send:
    dst: int
    var: str = "x"


@dataclass(frozen=True)
class Recv:
    src: int
    var: str = "x"


@dataclass(frozen=True)
class Isend:
    dst: int
    var: str = "x"
    handle: str = "send"


@dataclass(frozen=True)
class Irecv:
    src: int
    var: str = "x"
    handle: str = "recv"


@dataclass(frozen=True)
class Wait:
    handle: str


@dataclass(frozen=True)
class Compute:
    var: str
    fn: Callable[[float], float]
    label: str = "compute"


@dataclass(frozen=True)
class Read:
    """Record the current value of a variable (to show reads before/after a Wait)."""

    var: str
    label: str


Op = Send | Recv | Isend | Irecv | Wait | Compute | Read


@dataclass
class _Msg:  # one posted send or receive
    rank: int
    peer: int
    var: str
    value: float | None = None
    matched: "_Msg | None" = None


@dataclass(frozen=True)
class P2PResult:
    status: str  # "ok" | "deadlock" | "hang"
    env: tuple[dict, ...]  # final variables per rank
    trace: tuple[str, ...]  # "t=<round> rank r: …" events
    blocked: dict = field(default_factory=dict)  # rank -> the op it is stuck on
    cycle: tuple[int, ...] = ()  # ranks in the wait-for cycle (deadlock)
    reads: tuple[tuple[int, str, float], ...] = ()
    message: str = ""


def simulate(
    programs: list[list[Op]], env: list[dict] | None = None, mode: str = "rendezvous"
) -> P2PResult:
    """Run rank programs to completion, deadlock or hang."""
    if mode not in ("rendezvous", "eager"):
        raise ValueError(f"mode must be 'rendezvous' or 'eager', got {mode!r}")
    n = len(programs)
    _check_peers(programs)
    env_r = [dict(e) for e in (env or [{} for _ in range(n)])]
    if len(env_r) != n:
        raise ValueError(f"{n} programs but {len(env_r)} environments")
    pc = [0] * n
    sends: dict[tuple[int, int], list[_Msg]] = {}  # (src, dst) -> posted, in order
    recvs: dict[tuple[int, int], list[_Msg]] = {}
    posted: list[dict[int, _Msg]] = [{} for _ in range(n)]  # rank -> {pc: its message}
    handles: list[dict[str, tuple[str, _Msg]]] = [{} for _ in range(n)]
    trace, reads, rnd = [], [], 0

    def post(kind, msg):
        own, other = (sends, recvs) if kind == "send" else (recvs, sends)
        key = (msg.rank, msg.peer) if kind == "send" else (msg.peer, msg.rank)
        own.setdefault(key, []).append(msg)
        i = len(own[key]) - 1
        if i < len(other.get(key, [])):  # the i-th send meets the i-th receive
            mate = other[key][i]
            msg.matched, mate.matched = mate, msg

    def step(r) -> bool:
        op = programs[r][pc[r]]
        if isinstance(op, Compute | Read):
            if isinstance(op, Compute):
                env_r[r][op.var] = op.fn(env_r[r].get(op.var, 0.0))
                trace.append(f"t={rnd} rank {r}: {op.label} -> {op.var}={env_r[r][op.var]}")
            else:
                reads.append((r, op.label, env_r[r].get(op.var, 0.0)))
                trace.append(f"t={rnd} rank {r}: read {op.var}={reads[-1][2]} ({op.label})")
            return True
        if isinstance(op, Send | Recv):
            msg = posted[r].get(pc[r])
            if msg is None:
                kind = "send" if isinstance(op, Send) else "recv"
                peer = op.dst if kind == "send" else op.src
                msg = _Msg(r, peer, op.var, env_r[r].get(op.var, 0.0) if kind == "send" else None)
                posted[r][pc[r]] = msg
                post(kind, msg)
                if not (msg.matched or (kind == "send" and mode == "eager")):
                    trace.append(f"t={rnd} rank {r}: {_describe(op)} posted, blocks")
            if isinstance(op, Send) and (mode == "eager" or msg.matched):
                trace.append(f"t={rnd} rank {r}: send {op.var}={msg.value} to {op.dst}")
                return True
            if isinstance(op, Recv) and msg.matched:
                env_r[r][op.var] = msg.matched.value
                trace.append(f"t={rnd} rank {r}: recv {op.var}={msg.matched.value} from {op.src}")
                return True
            return False
        if isinstance(op, Isend | Irecv):
            kind = "send" if isinstance(op, Isend) else "recv"
            peer = op.dst if kind == "send" else op.src
            msg = _Msg(r, peer, op.var, env_r[r].get(op.var, 0.0) if kind == "send" else None)
            post(kind, msg)
            handles[r][op.handle] = (kind, msg)
            trace.append(
                f"t={rnd} rank {r}: i{kind} {op.var} {'to' if kind == 'send' else 'from'} "
                f"{peer} -> handle {op.handle}"
            )
            return True
        if isinstance(op, Wait):
            if op.handle not in handles[r]:
                raise ValueError(f"rank {r} waits on unknown handle {op.handle!r}")
            kind, msg = handles[r][op.handle]
            if not (msg.matched or (kind == "send" and mode == "eager")):
                return False
            if kind == "recv":
                env_r[r][msg.var] = msg.matched.value
            trace.append(f"t={rnd} rank {r}: wait {op.handle} done")
            return True
        raise TypeError(f"unknown op {op!r}")

    while True:
        progressed = False
        for r in range(n):
            while pc[r] < len(programs[r]) and step(r):
                pc[r] += 1
                progressed = True
        if all(pc[r] == len(programs[r]) for r in range(n)):
            return P2PResult(
                "ok",
                tuple(env_r),
                tuple(trace),
                reads=tuple(reads),
                message=f"all {n} ranks finished",
            )
        if not progressed:
            return _stuck(programs, pc, handles, env_r, trace, reads)
        rnd += 1


def _check_peers(programs):
    n = len(programs)
    for r, prog in enumerate(programs):
        for op in prog:
            peer = getattr(op, "dst", getattr(op, "src", None))
            if peer is not None and not 0 <= peer < n:
                raise ValueError(f"rank {r}: peer {peer} is not a rank of a {n}-rank world")
            if peer == r:
                raise ValueError(f"rank {r} sends to or receives from itself")


def _describe(op) -> str:
    if isinstance(op, Send | Recv):
        peer = f"dst={op.dst}" if isinstance(op, Send) else f"src={op.src}"
        return f"{type(op).__name__.lower()}({peer})"
    return f"wait({op.handle})"


def _waits_for(op, r, handles) -> int:
    if isinstance(op, Send):
        return op.dst
    if isinstance(op, Recv):
        return op.src
    return handles[r][op.handle][1].peer


def _stuck(programs, pc, handles, env_r, trace, reads) -> P2PResult:
    n = len(programs)
    blocked = {r: programs[r][pc[r]] for r in range(n) if pc[r] < len(programs[r])}
    waits = {r: _waits_for(op, r, handles) for r, op in blocked.items()}
    for start in blocked:  # follow the wait-for chain from each blocked rank
        path, cur = [], start
        while cur in waits and cur not in path:
            path.append(cur)
            cur = waits[cur]
        if cur in path:
            cycle = tuple(path[path.index(cur) :])
            chain = " -> ".join(str(c) for c in cycle + (cycle[0],))
            msg = f"ranks {chain} each wait for the next (blocking sends/receives)"
            return P2PResult(
                "deadlock", tuple(env_r), tuple(trace), blocked, cycle, tuple(reads), msg
            )
    # Some blocked rank waits directly on a finished one: that operation can never be matched.
    r = next(r for r in blocked if waits[r] not in blocked)
    others = sorted(set(blocked) - {r})
    msg = (
        f"rank {r} is stuck on {_describe(blocked[r])} but rank {waits[r]} finished without the "
        "matching operation (mismatched src/dst)"
        + (f"; blocked behind it: rank(s) {', '.join(map(str, others))}" if others else "")
    )
    return P2PResult("hang", tuple(env_r), tuple(trace), blocked, (), tuple(reads), msg)


# --- the seed's patterns ------------------------------------------------------------------


def chain(world_size: int, init: float = 42.0, add: float = 10.0):
    """Seed 002 ch2 send_recv_basic.py: 0 sends; 1..W-2 receive, add, forward; W-1 receives."""
    if world_size < 2:
        raise ValueError("the chain needs at least 2 ranks")
    last = world_size - 1
    programs = [[Send(1)]]
    for r in range(1, last):
        programs.append([Recv(r - 1), Compute("x", lambda v: v + add, f"add {add:g}"), Send(r + 1)])
    programs.append([Recv(last - 1)])
    env = [{"x": init}] + [{"x": 0.0} for _ in range(last)]
    return programs, env


def ring(world_size: int, init: float = 0.0, add: float = 10.0):
    """Ch2 Ex1: r sends to r+1 mod W; rank 0 starts and ends with init + add x (W-1)."""
    if world_size < 2:
        raise ValueError("the ring needs at least 2 ranks")
    add_op = Compute("x", lambda v: v + add, f"add {add:g}")
    programs = [[Send(1), Recv(world_size - 1)]]
    programs += [[Recv(r - 1), add_op, Send((r + 1) % world_size)] for r in range(1, world_size)]
    return programs, [{"x": init}] + [{"x": 0.0} for _ in range(world_size - 1)]


def both_send_first():
    """Ch2's blocking example: both send, then receive. Rendezvous: deadlock. Eager: completes."""
    return [[Send(1), Recv(1, "y")], [Send(0), Recv(0, "y")]], [{"x": 0.0}, {"x": 1.0}]


def interleaved():
    """The same section's fix: rank 0 sends then receives, rank 1 receives then sends."""
    return [[Send(1), Recv(1, "y")], [Recv(0, "y"), Send(0)]], [{"x": 0.0}, {"x": 1.0}]


def nonblocking_swap(world_size: int = 4):
    """Ch2 Ex2: even<->odd with isend/irecv and waits: no ordering puzzle, no deadlock."""
    programs = [
        [Isend(r ^ 1, "x", "s"), Irecv(r ^ 1, "y", "r"), Wait("s"), Wait("r")]
        for r in range(world_size)
    ]
    return programs, [{"x": float(100 * r)} for r in range(world_size)]


def mismatched():
    """Ch2 "Pitfall 1": rank 0 sends to 1, but rank 1 receives from 2, which is idle."""
    return [[Send(1)], [Recv(2)], []], [{"x": 7.0}, {}, {}]


def forgot_wait():
    """Ch2 "Pitfall 3": reading an irecv buffer before wait sees the old contents."""
    programs = [
        [Send(1)],
        [Irecv(0, "x", "h"), Read("x", "before wait"), Wait("h"), Read("x", "after wait")],
    ]
    return programs, [{"x": 42.0}, {"x": 0.0}]


def format_trace(result: P2PResult) -> str:
    lines = list(result.trace) + [f"=> {result.status.upper()}: {result.message}"]
    lines += [f"   rank {r} blocked on {_describe(op)}" for r, op in result.blocked.items()]
    return "\n".join(lines)
