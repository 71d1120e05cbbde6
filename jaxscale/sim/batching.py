"""Static vs continuous batching on a step clock (one step = one token for every busy slot).

Follows seed 000's Exercise 3 ("Continuous Batching Simulator"): the same 50-request workload
(np.random.seed(42); lengths N(80, 60) cast to int and clipped to [10, 300]), the same slot
semantics, and its metrics — total steps, utilisation per step (busy slots / batch size),
"latency" as the notebook defines it (steps from the start of service: the batch's longest
request for static, the request's own length for continuous) and the wasted slot-steps of
static batching. Added: completion time from t=0 (all requests are queued at t=0, so this is
what a client waits, queueing included) and throughput in tokens per step.
"""

from dataclasses import dataclass

import numpy as np

# Seed 003 (lesson plan), "Examples Planned": the lesson's 8-request static-batch example.
SEED_003_LENGTHS = (20, 45, 200, 15, 80, 150, 30, 200)


@dataclass(frozen=True)
class Workload:
    num_requests: int = 50
    seed: int = 42
    mean_length: float = 80.0
    std_length: float = 60.0
    min_length: int = 10
    max_length: int = 300

    def lengths(self) -> np.ndarray:
        """Token counts per request, drawn exactly as the notebook's Exercise 3 does."""
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.std_length < 0:
            raise ValueError(f"std_length must be >= 0, got {self.std_length}")
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(
                f"need 1 <= min_length <= max_length, got {self.min_length}, {self.max_length}"
            )
        # RandomState(seed) is the generator np.random.seed(seed) resets. The notebook truncates
        # toward zero, then clips to integer bounds >= 1: clipping first gives the same lengths
        # and never casts a huge draw (--mean-length 1e20) out of int range.
        rng = np.random.RandomState(self.seed)
        raw = rng.normal(loc=self.mean_length, scale=self.std_length, size=self.num_requests)
        return np.clip(raw, self.min_length, self.max_length).astype(int)


@dataclass(frozen=True)
class BatchingResult:
    strategy: str  # "static" or "continuous"
    batch_size: int
    total_steps: int
    utilization: tuple  # busy slots / batch_size at each step
    service_latency: tuple  # per request: steps from its service start to its batch's/own end
    completion_step: tuple  # per request: step at which its result is returned (from t=0)
    useful_tokens: int  # sum of request lengths

    @property
    def avg_utilization(self) -> float:
        return float(np.mean(self.utilization))

    @property
    def avg_service_latency(self) -> float:
        return float(np.mean(self.service_latency))

    @property
    def avg_completion(self) -> float:
        return float(np.mean(self.completion_step))

    @property
    def slot_steps(self) -> int:
        """Slot-steps the accelerator computes: every slot of a static batch, busy or not;
        only filled slots for continuous batching (the batch shrinks when the queue is empty)."""
        if self.strategy == "static":
            return self.total_steps * self.batch_size
        return int(round(sum(self.utilization) * self.batch_size))

    @property
    def wasted_slot_steps(self) -> int:
        return self.slot_steps - self.useful_tokens

    @property
    def waste_fraction(self) -> float:
        return self.wasted_slot_steps / self.slot_steps

    @property
    def tokens_per_step(self) -> float:
        return self.useful_tokens / self.total_steps


def _check(lengths, batch_size: int) -> np.ndarray:
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.size == 0:
        raise ValueError("need a non-empty 1-D list of request lengths")
    if not np.issubdtype(lengths.dtype, np.integer) or (lengths < 1).any():
        raise ValueError(f"request lengths must be positive integers, got {lengths.tolist()}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    return lengths.astype(int)


def simulate_static(lengths, batch_size: int) -> BatchingResult:
    """Fixed batches in queue order; run to the longest (seed simulate_static_batching)."""
    lengths = _check(lengths, batch_size)
    utilization, latency, completion = [], [], []
    clock = 0
    for lo in range(0, len(lengths), batch_size):
        batch = lengths[lo : lo + batch_size]
        longest = int(batch.max())
        utilization += [int(np.sum(batch > step)) / batch_size for step in range(longest)]
        clock += longest
        latency += [longest] * len(batch)  # everyone waits for the longest (notebook's metric)
        completion += [clock] * len(batch)
    return BatchingResult(
        "static",
        batch_size,
        clock,
        tuple(utilization),
        tuple(latency),
        tuple(completion),
        int(lengths.sum()),
    )


def simulate_continuous(lengths, batch_size: int) -> BatchingResult:
    """A finished request's slot takes the next in queue (simulate_continuous_batching)."""
    lengths = _check(lengths, batch_size)
    n = len(lengths)
    start = [0] * n
    end = [0] * n
    slots = [(i, int(lengths[i])) for i in range(min(batch_size, n))]  # (request, remaining)
    next_req = len(slots)
    utilization = []
    step = 0
    while slots:
        utilization.append(len(slots) / batch_size)
        refilled = []
        for req, remaining in slots:
            if remaining - 1 > 0:
                refilled.append((req, remaining - 1))
                continue
            end[req] = step + 1
            if next_req < n:
                start[next_req] = step + 1
                refilled.append((next_req, int(lengths[next_req])))
                next_req += 1
        slots = refilled
        step += 1
    latency = tuple(e - s for s, e in zip(start, end, strict=True))
    return BatchingResult(
        "continuous",
        batch_size,
        step,
        tuple(utilization),
        latency,
        tuple(end),
        int(lengths.sum()),
    )


def seed_003_claimed_waste() -> float:
    """Seed 003's "2 finish at 20 = 22.5% wasted" ("Modalities Planned"): 2*(200-20)/(8*200),
    which counts only two requests (defect 21; the full static waste is 860/1600 = 53.75%)."""
    longest = max(SEED_003_LENGTHS)
    return 2 * (longest - 20) / (len(SEED_003_LENGTHS) * longest)


def sparkline(values, width: int = 60, levels: str = " .:-=+*#%@") -> str:
    """Utilisation over time as one text line: the mean of each of `width` equal chunks."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return ""
    chunks = np.array_split(values, min(width, values.size))
    top = len(levels) - 1
    return "".join(levels[int(round(float(np.mean(c)) * top))] for c in chunks)
