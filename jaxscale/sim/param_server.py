"""Asynchronous parameter server with stale gradients vs synchronous updates (seed 004 §9).

Toy problem: least squares f(x) = |A x - b|^2 / (2n), A an n x d Gaussian matrix (seeded),
rescaled so that the Hessian H = A^T A / n has largest eigenvalue 1 (then `lr` is lr * lambda_max);
b = A x_true + noise. Reported: the optimality gap f(x) - f(x_ls).

sync   every round all W workers compute a gradient at the current x; the server averages them
       and applies one update. A round lasts as long as its slowest worker.
async  the seed's ParameterServer ("Synchronous vs Asynchronous Training"): a worker pulls x,
       computes a gradient for its compute time and pushes; the server applies x -= lr * g at once.
       The gradient is stale by tau = the updates other workers applied in between. Equal compute
       times settle into round-robin with tau = W - 1.

Delayed gradient descent on a quadratic, e_{t+1} = e_t - lr * lambda * e_{t-tau}, is stable iff
lr * lambda < 2 sin(pi / (2 (2 tau + 1))): 2 for tau = 0, 1 for tau = 1, 0.445 for tau = 3.
The case the tests use: lr = 0.9 on the default problem. Sync converges (rate 0.55 per update);
tau = 1 converges more slowly (0.95); tau >= 2 diverges (W = 4 workers give tau = 3).
"""

import heapq
from dataclasses import dataclass

import numpy as np

DIVERGED_GAP_RATIO = 1e8  # stop once the gap exceeds the initial gap by this factor


@dataclass(frozen=True)
class ParamServerConfig:
    workers: int = 4  # W
    lr: float = 0.9  # in units of 1 / lambda_max(H)
    updates: int = 200  # server updates per run
    batch_size: int = 0  # rows per gradient; 0 = all rows (deterministic gradients)
    samples: int = 512  # n
    dim: int = 16  # d
    noise: float = 0.0  # std of the label noise
    jitter: float = 0.0  # worker compute time ~ U(1 - jitter, 1 + jitter), jitter in [0, 1)
    seed: int = 0

    def validate(self) -> None:
        for name in ("workers", "updates", "samples", "dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.samples < self.dim:
            raise ValueError(
                f"need samples >= dim for a unique minimiser ({self.samples} < {self.dim})"
            )
        if not 0 <= self.batch_size <= self.samples:
            raise ValueError(f"batch_size must be in [0, samples], got {self.batch_size}")
        if self.noise < 0:
            raise ValueError(f"noise must be >= 0, got {self.noise}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")


@dataclass(frozen=True)
class Problem:
    a_nd: np.ndarray
    b_n: np.ndarray
    x_ls: np.ndarray  # least-squares minimiser
    f_star: float

    def loss(self, x: np.ndarray) -> float:
        with np.errstate(over="ignore", invalid="ignore"):  # divergence is detected by the caller
            r = self.a_nd @ x - self.b_n
            return float(r @ r) / (2 * len(self.b_n))

    def gap(self, x: np.ndarray) -> float:
        # Clamped: at the optimum, rounding can put loss(x) a hair below f*.
        return max(self.loss(x) - self.f_star, 0.0)

    def grad(self, x: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        a, b = (self.a_nd, self.b_n) if rows is None else (self.a_nd[rows], self.b_n[rows])
        return a.T @ (a @ x - b) / len(b)

    def hessian_eigenvalues(self) -> np.ndarray:
        return np.linalg.eigvalsh(self.a_nd.T @ self.a_nd / len(self.b_n))


def make_problem(cfg: ParamServerConfig) -> Problem:
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    a = rng.standard_normal((cfg.samples, cfg.dim))
    a /= np.sqrt(np.linalg.eigvalsh(a.T @ a / cfg.samples).max())  # lambda_max(H) = 1
    b = a @ rng.standard_normal(cfg.dim) + cfg.noise * rng.standard_normal(cfg.samples)
    x_ls = np.linalg.lstsq(a, b, rcond=None)[0]
    r = a @ x_ls - b
    return Problem(a, b, x_ls, float(r @ r) / (2 * cfg.samples))


@dataclass(frozen=True)
class RunResult:
    mode: str
    gaps: tuple  # f(x) - f* before the first update and after each one
    times: tuple  # simulated time of each update (worker compute time units)
    staleness: tuple  # per update
    gradients: int  # gradient evaluations used
    diverged: bool

    @property
    def final_gap(self) -> float:
        return self.gaps[-1]

    def updates_to(self, tol: float) -> int | None:
        """First update count after which the gap is <= tol (None if never)."""
        hits = [i for i, g in enumerate(self.gaps) if g <= tol]
        return hits[0] if hits else None


def _compute_time(cfg: ParamServerConfig, rng: np.random.Generator) -> float:
    return 1.0 if cfg.jitter == 0 else float(rng.uniform(1 - cfg.jitter, 1 + cfg.jitter))


def _rows(cfg: ParamServerConfig, rng: np.random.Generator) -> np.ndarray | None:
    if cfg.batch_size in (0, cfg.samples):
        return None
    return rng.choice(cfg.samples, cfg.batch_size, replace=False)


def _diverging(gap: float, gap0: float) -> bool:
    return not np.isfinite(gap) or gap > DIVERGED_GAP_RATIO * max(gap0, 1e-300)


def run_sync(cfg: ParamServerConfig, problem: Problem) -> RunResult:
    rng = np.random.default_rng([cfg.seed, 1])
    x = np.zeros(cfg.dim)
    gaps, times = [problem.gap(x)], []
    clock = 0.0
    for _ in range(cfg.updates):
        grads = [problem.grad(x, _rows(cfg, rng)) for _ in range(cfg.workers)]
        clock += max(_compute_time(cfg, rng) for _ in range(cfg.workers))  # wait for stragglers
        x = x - cfg.lr * np.mean(grads, axis=0)
        gaps.append(problem.gap(x))
        times.append(clock)
        if _diverging(gaps[-1], gaps[0]):
            break
    n = len(times)
    return RunResult("sync", tuple(gaps), tuple(times), (0,) * n, n * cfg.workers, n < cfg.updates)


def run_async(cfg: ParamServerConfig, problem: Problem) -> RunResult:
    rng = np.random.default_rng([cfg.seed, 2])
    x = np.zeros(cfg.dim)
    version = 0  # updates applied so far
    # (finish time, worker, version pulled, gradient); ties resolve by worker id (round-robin).
    events = []
    for w in range(cfg.workers):
        heapq.heappush(events, (_compute_time(cfg, rng), w, 0, problem.grad(x, _rows(cfg, rng))))
    gaps, times, staleness = [problem.gap(x)], [], []
    while version < cfg.updates:
        clock, w, pulled, g = heapq.heappop(events)
        staleness.append(version - pulled)
        x = x - cfg.lr * g  # push: applied without waiting for anyone
        version += 1
        gaps.append(problem.gap(x))
        times.append(clock)
        if _diverging(gaps[-1], gaps[0]):
            break
        # pull the fresh x and start the next gradient
        g_next = problem.grad(x, _rows(cfg, rng))
        heapq.heappush(events, (clock + _compute_time(cfg, rng), w, version, g_next))
    n = len(times)
    gradients = n + len(events)  # those applied plus those in flight
    return RunResult(
        "async", tuple(gaps), tuple(times), tuple(staleness), gradients, n < cfg.updates
    )


def run_delayed(problem: Problem, lr: float, tau: int, updates: int) -> RunResult:
    """Full-batch gradient descent whose update t uses x(t - tau) (x_0 while t < tau)."""
    if not isinstance(tau, int) or tau < 0:
        raise ValueError(f"staleness must be a non-negative integer, got {tau!r}")
    history = [np.zeros(problem.a_nd.shape[1])]
    gaps = [problem.gap(history[0])]
    for t in range(updates):
        x = history[-1] - lr * problem.grad(history[max(t - tau, 0)])
        history.append(x)
        gaps.append(problem.gap(x))
        if _diverging(gaps[-1], gaps[0]):
            break
    n = len(gaps) - 1
    return RunResult(
        f"delayed tau={tau}",
        tuple(gaps),
        tuple(float(i + 1) for i in range(n)),
        tuple(min(i, tau) for i in range(n)),
        n,
        n < updates,
    )


def critical_lr(tau: int) -> float:
    """Largest stable lr * lambda for delayed gradient descent with staleness tau."""
    if not isinstance(tau, int) or tau < 0:
        raise ValueError(f"staleness must be a non-negative integer, got {tau!r}")
    return 2.0 * np.sin(np.pi / (2 * (2 * tau + 1)))


def delayed_rate(lr: float, tau: int, eigenvalues) -> float:
    """Asymptotic error contraction per update: the largest root modulus of
    z^(tau+1) - z^tau + lr*lambda = 0 over the Hessian's eigenvalues (> 1 means divergence)."""
    worst = 0.0
    for lam in np.asarray(eigenvalues, dtype=float):
        coeffs = np.zeros(tau + 2)
        coeffs[0], coeffs[1], coeffs[-1] = 1.0, -1.0, lr * lam
        if tau == 0:
            coeffs = np.array([1.0, -1.0 + lr * lam])
        worst = max(worst, float(np.max(np.abs(np.roots(coeffs)))))
    return worst
