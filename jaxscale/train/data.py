"""Data: a byte-level tokenizer, text corpora, a synthetic task with a known optimal loss, and
batches placed as global arrays sharded over the data-like mesh axes.

Every batch is a pure function of (seed, step, row): a process generates only the rows its
devices hold, so the same code serves one process or many (jax.make_array_from_process_local_data),
and a resumed run sees exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

EVAL_STEP_OFFSET = 1 << 30  # eval batches use steps no training run reaches


class ByteTokenizer:
    """One token per UTF-8 byte: vocab 256, no unknown tokens, lossless round trip."""

    vocab = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


def stdlib_source_files() -> list[Path]:
    """The running Python's standard-library .py files, in a deterministic (sorted) order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts))


def load_stdlib_corpus(max_bytes: int = 4_000_000) -> bytes:
    """Concatenated stdlib sources up to `max_bytes` (present on every machine; no download)."""
    chunks, total = [], 0
    for path in stdlib_source_files():
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"\n".join(chunks)[:max_bytes]


@dataclass(frozen=True)
class TextData:
    """Random windows of a byte corpus; the last `eval_fraction` is held out for eval loss."""

    train_ids: np.ndarray
    eval_ids: np.ndarray
    name: str = "text"

    @classmethod
    def from_bytes(cls, data: bytes, name: str, eval_fraction: float = 0.05) -> TextData:
        ids = np.frombuffer(data, dtype=np.uint8).astype(np.int32)
        cut = int(len(ids) * (1 - eval_fraction))
        return cls(train_ids=ids[:cut], eval_ids=ids[cut:], name=name)

    @classmethod
    def from_path(cls, path: str | Path) -> TextData:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"--data {path}: no such file (or 'stdlib', 'markov', 'copy')")
        return cls.from_bytes(path.read_bytes(), name=path.name)

    def rows(self, seed: int, step: int, rows: range, seq_len: int) -> np.ndarray:
        """int32 [len(rows), seq_len + 1]: inputs are [:, :-1], targets [:, 1:]."""
        ids = self.eval_ids if step >= EVAL_STEP_OFFSET else self.train_ids
        if len(ids) <= seq_len + 1:
            raise ValueError(f"corpus {self.name!r} has {len(ids)} tokens, need > {seq_len + 1}")
        out = np.empty((len(rows), seq_len + 1), np.int32)
        for i, row in enumerate(rows):
            start = np.random.default_rng([seed, step, row]).integers(0, len(ids) - seq_len - 1)
            out[i] = ids[start : start + seq_len + 1]
        return out


@dataclass(frozen=True)
class MarkovData:
    """Sequences from a fixed random Markov chain over `n_states` tokens.

    Each state has `fanout` possible successors with Dirichlet probabilities. The first token is
    drawn from the stationary distribution pi, so every target token's distribution is the
    transition row of its predecessor, and the best achievable cross-entropy is exactly the
    chain's entropy rate  H = sum_i pi_i * H(P_i)  (nats per token). A model that learns the
    bigram statistics reaches it; this gives learning curves with an unambiguous floor.
    """

    n_states: int = 16
    fanout: int = 4
    task_seed: int = 1234
    name: str = "markov"

    def transition_matrix(self) -> np.ndarray:
        rng = np.random.default_rng(self.task_seed)
        P = np.zeros((self.n_states, self.n_states))
        for i in range(self.n_states):
            succ = rng.choice(self.n_states, size=self.fanout, replace=False)
            P[i, succ] = rng.dirichlet(np.ones(self.fanout))
        return P

    def stationary(self) -> np.ndarray:
        P = self.transition_matrix()
        vals, vecs = np.linalg.eig(P.T)
        pi = np.real(vecs[:, np.argmin(np.abs(vals - 1))])
        return pi / pi.sum()

    def optimal_loss(self) -> float:
        """The entropy rate in nats: the loss floor no predictor can beat."""
        P, pi = self.transition_matrix(), self.stationary()
        with np.errstate(divide="ignore", invalid="ignore"):
            row_entropy = -np.nansum(np.where(P > 0, P * np.log(P), 0.0), axis=1)
        return float(pi @ row_entropy)

    def rows(self, seed: int, step: int, rows: range, seq_len: int) -> np.ndarray:
        P, pi = self.transition_matrix(), self.stationary()
        cdf = np.cumsum(P, axis=1)
        out = np.empty((len(rows), seq_len + 1), np.int32)
        for i, row in enumerate(rows):
            rng = np.random.default_rng([seed, step, row])
            u = rng.random(seq_len + 1)
            state = int(np.searchsorted(np.cumsum(pi), u[0]))
            out[i, 0] = state
            for t in range(1, seq_len + 1):
                state = min(int(np.searchsorted(cdf[state], u[t])), self.n_states - 1)
                out[i, t] = state
        return out


@dataclass(frozen=True)
class CopyData:
    """Random tokens, then the same tokens again: the second half of every window copies the
    first, `period` = (seq_len + 1) // 2 positions back.

    The Markov task needs only the previous token; this one cannot be learned without
    attention. The first half's targets are uniform over `n_symbols` (log n_symbols nats each),
    the copied half's are determined by a token `period` back, so the loss floor is
    (period - 1) / seq_len * log(n_symbols); a model that cannot look back (no attention, or an
    attention that sees only the current token) stays at log(n_symbols) on the copied half.
    """

    n_symbols: int = 16
    name: str = "copy"

    def optimal_loss(self, seq_len: int) -> float:
        return ((seq_len + 1) // 2 - 1) / seq_len * math.log(self.n_symbols)

    def rows(self, seed: int, step: int, rows: range, seq_len: int) -> np.ndarray:
        period = (seq_len + 1) // 2
        out = np.empty((len(rows), seq_len + 1), np.int32)
        for i, row in enumerate(rows):
            first = np.random.default_rng([seed, step, row]).integers(0, self.n_symbols, period)
            out[i] = np.resize(first, seq_len + 1)  # repeats `first` to the window's length
        return out


def vocab_of(dataset) -> int:
    """How many distinct token ids the data uses (ids are 0..vocab-1)."""
    if isinstance(dataset, MarkovData):
        return dataset.n_states
    if isinstance(dataset, CopyData):
        return dataset.n_symbols
    return ByteTokenizer.vocab


def optimal_loss(dataset, seq_len: int) -> float | None:
    """The data's known loss floor (Markov: its entropy rate; copy: its random half), or None."""
    if isinstance(dataset, MarkovData):
        return dataset.optimal_loss()
    if isinstance(dataset, CopyData):
        return dataset.optimal_loss(seq_len)
    return None


def check(dataset, seq_len: int, vocab: int) -> None:
    """Raise ValueError, naming the flags, if the data cannot feed this model and window."""
    if vocab_of(dataset) > vocab:
        raise ValueError(
            f"--vocab {vocab} is smaller than the {vocab_of(dataset)} token ids of "
            f"--data {dataset.name}"
        )
    if isinstance(dataset, TextData):
        for split, ids in (("training", dataset.train_ids), ("held-out (eval)", dataset.eval_ids)):
            if len(ids) <= seq_len + 1:
                raise ValueError(
                    f"--data {dataset.name}: its {split} split has {len(ids)} bytes, "
                    f"fewer than one window of --seq-len {seq_len} + 1"
                )


def make_dataset(name_or_path: str | None):
    """'stdlib' (default), 'markov', 'copy', or a path to any text file."""
    if name_or_path in (None, "stdlib"):
        return TextData.from_bytes(load_stdlib_corpus(), name="stdlib")
    if name_or_path == "markov":
        return MarkovData()
    if name_or_path == "copy":
        return CopyData()
    return TextData.from_path(name_or_path)


def local_rows(sharding, global_shape: tuple[int, int]) -> range:
    """The contiguous batch rows held by this process's devices under `sharding`."""
    idx = sharding.addressable_devices_indices_map(global_shape).values()
    starts = [s[0].start or 0 for s in idx]
    stops = [global_shape[0] if s[0].stop is None else s[0].stop for s in idx]
    lo, hi = min(starts), max(stops)
    covered = sum(b - a for a, b in {(a, b) for a, b in zip(starts, stops, strict=True)})
    if covered != hi - lo:
        raise ValueError("this process's batch rows are not contiguous; use a data-major mesh")
    return range(lo, hi)


def global_batch(dataset, sharding, seed: int, step: int, batch: int, seq_len: int):
    """A [batch, seq_len + 1] int32 global array sharded by `sharding` (rows over data axes)."""
    import jax

    shape = (batch, seq_len + 1)
    rows = local_rows(sharding, shape)
    local = dataset.rows(seed, step, rows, seq_len)
    return jax.make_array_from_process_local_data(sharding, local, shape)


def eval_steps(n: int) -> list[int]:
    return [EVAL_STEP_OFFSET + i for i in range(n)]


def tokens_per_step(batch: int, seq_len: int) -> int:
    return math.prod((batch, seq_len))
