"""Context parallelism's arithmetic (pure Python): the bytes each form moves per layer and step,
and the attention scores each form holds.

The sequence of T tokens is split over cp devices (seed 001 §6 "Context Parallel (CP)": split the
sequence, all-gather for attention; §7 names the all-gather as CP's collective). Each device keeps
whole rows and T/cp of their tokens, so per layer it holds one K block and one V block of
[B_l, T/cp, G/tp, K] (KV bytes each, in the compute dtype) and its queries [B_l, T/cp, H/tp, K]
(Q bytes). Per layer and training step (forward and backward), three forms:

  ring     ring attention (Liu et al. 2023; the scaling book's note on context parallelism in
           "How to Parallelize a Transformer for Training": gather KVs around a ring, overlapped
           with the block FLOPs): 2(cp-1) K/V block sends forward; backward, the blocks travel
           again (2(cp-1) KV) with their gradients dK/dV, which take one more hop home in the
           accumulators' f32 (2cp KV32). Collective-permutes.
  gather   all-gather CP (Llama 3, "The Llama 3 Herd of Models"): an all-gather of K and one of V
           forward (the census counts each output, cp x KV), two reduce-scatters of dK, dV
           backward (each input, cp x KV).
  ulysses  DeepSpeed-Ulysses (Jacobs et al. 2023): all-to-alls of q, k, v to head-sharded
           [B_l, T, H/cp, K] and of the output back: 4 forward (2Q + 2KV), their 4 transposes
           backward. Heads and kv heads per tensor shard must divide by cp.

Recomputing the forward (remat) sends the forward's collectives again. The step adds one
all-reduce over the axis of every gradient the axis replicates, and of the loss (one f32 scalar).

Byte sizes follow the census convention of `jaxscale.analysis.hlo` (collective-permute and
all-to-all count their operand, all-gather its output, reduce-scatter its input), so these are the
formulas of `jaxscale.parallel.cp.predict_comm`, restated here without jax;
`cp.predict_comm` is the check against the compiled program's census (tests/parallel/test_cp.py),
and tests/calc/test_context.py holds the two equal. Bytes one device puts on the wire: a permute
sends its operand, the other three (cp-1)/cp of their census size on a ring.
"""

from dataclasses import dataclass

from jaxscale.checks import positive_ints

FORMS = ("ring", "gather", "ulysses")
F32 = 4  # the ring backward's dK/dV accumulators, the scores' softmax, the loss scalar
CENSUS_OP = {  # the collectives each form issues, as the census names them
    "ring": ("collective-permute",),
    "gather": ("all-gather", "reduce-scatter"),
    "ulysses": ("all-to-all",),
}


def check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"unknown context-parallel form {form!r}; choose one of {FORMS}")


@dataclass(frozen=True)
class ContextShape:
    """One layer's attention on one device of a context group of cp devices."""

    batch_local: int  # B_l: rows per device (whole on every device of the context axis)
    seq_len: int  # T: the whole sequence
    n_heads: int  # H
    n_kv_heads: int  # G (== H without GQA)
    head_dim: int  # K
    cp: int  # devices on the context axis
    tp: int = 1  # a tensor axis beside it splits the heads
    act_bytes: int = 2  # the compute dtype's bytes (bf16)
    remat: bool = False  # the forward recomputed in the backward: its collectives again

    def __post_init__(self):
        positive_ints(
            batch_local=self.batch_local,
            seq_len=self.seq_len,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            cp=self.cp,
            tp=self.tp,
            act_bytes=self.act_bytes,
        )
        if self.seq_len % self.cp:
            raise ValueError(f"sequence length {self.seq_len} does not split over cp={self.cp}")
        for name, heads in (("heads", self.n_heads), ("kv_heads", self.n_kv_heads)):
            if heads % self.tp:
                raise ValueError(f"{name}={heads} does not split over tp={self.tp}")

    @property
    def tokens_local(self) -> int:  # B_l * T/cp
        return self.batch_local * self.seq_len // self.cp

    @property
    def kv_block_bytes(self) -> int:
        """One K (or V) block of one layer: [B_l, T/cp, G/tp, K] in the compute dtype."""
        return self.tokens_local * self.n_kv_heads // self.tp * self.head_dim * self.act_bytes

    @property
    def q_block_bytes(self) -> int:
        """The local queries (and the attention output) of one layer: [B_l, T/cp, H/tp, K]."""
        return self.tokens_local * self.n_heads // self.tp * self.head_dim * self.act_bytes


def ulysses_problem(shape: ContextShape) -> str | None:
    """Why Ulysses cannot split these heads over cp (None when it can)."""
    for name, heads in (("heads", shape.n_heads), ("kv_heads", shape.n_kv_heads)):
        per = heads // shape.tp
        if per % shape.cp:
            where = f" per tensor shard (tp={shape.tp})" if shape.tp > 1 else ""
            return (
                f"Ulysses splits the heads over cp={shape.cp}: {name}{where} = {per}, "
                f"not a multiple of {shape.cp}"
            )
    return None


def layer_census(shape: ContextShape, form: str) -> dict[str, float]:
    """{op: bytes per device} of one layer's attention over the context axis, forward and
    backward (and the recomputed forward with remat); {} on one device. The per-layer part of
    `jaxscale.parallel.cp.predict_comm` (the compiled-program check), term for term."""
    check_form(form)
    c, kv = shape.cp, shape.kv_block_bytes
    if c == 1:
        return {}
    again = 1 if shape.remat else 0
    if form == "ring":
        kv32 = kv * F32 / shape.act_bytes  # dK, dV travel in their f32 accumulators
        # forward 2(c-1) sends of K and V; backward 2(c-1) again (none at c = 2: there the
        # backward's one hop is the forward's, sent once) plus 2c of dK, dV (one more hop)
        back_kv = 0 if c == 2 else 1
        return {"collective-permute": 2 * (c - 1) * kv * (1 + back_kv + again) + 2 * c * kv32}
    if form == "gather":
        # all-gather of K and of V (output c x KV each); reduce-scatters of dK, dV (input c x KV)
        return {"all-gather": 2 * c * kv * (1 + again), "reduce-scatter": 2 * c * kv}
    problem = ulysses_problem(shape)
    if problem:
        raise ValueError(problem)
    # q, k, v to head-sharded and the output back (2Q + 2KV); the backward's transposes
    return {"all-to-all": (2 * shape.q_block_bytes + 2 * kv) * (2 + again)}


def layer_collectives(shape: ContextShape, form: str) -> int:
    """Collectives one layer issues per step (each pays one start-up latency)."""
    check_form(form)
    c, again = shape.cp, 1 if shape.remat else 0
    if c == 1:
        return 0
    if form == "ring":  # one permute each of K, V per hop; dK, dV beside them backward
        back_kv = 0 if c == 2 else 2 * (c - 1)  # c = 2: the forward's hop serves the backward
        return 2 * (c - 1) * (1 + again) + back_kv + 2 * (c - 1) + 2
    return 4 + 2 * again if form == "gather" else 8 + 4 * again


def wire_bytes(census: dict[str, float], cp: int) -> float:
    """Bytes one device sends for census-sized collectives on a ring: a permute sends its
    operand; an all-gather, reduce-scatter or all-to-all (cp-1)/cp of its census size."""
    share = (cp - 1) / cp
    return sum(b if op == "collective-permute" else b * share for op, b in census.items())


def step_census(
    shape: ContextShape, form: str, n_layers: int, replicated_grads: float, grad_bytes: float = F32
) -> dict[str, float]:
    """{op: bytes per device} of one step over the context axis: n_layers x `layer_census`, plus
    the all-reduce of the `replicated_grads` gradient values the axis replicates (every
    parameter on this device: CP splits none) and of the f32 loss. With the lab's f32 gradients
    this is `jaxscale.parallel.cp.predict_comm`."""
    positive_ints(n_layers=n_layers)
    if shape.cp == 1:
        return {}
    out = {op: n_layers * b for op, b in layer_census(shape, form).items()}
    out["all-reduce"] = grad_bytes * replicated_grads + F32
    return out


# --- the attention scores each form holds -----------------------------------------------------


@dataclass(frozen=True)
class AttentionScores:
    """One device's attention-score buffers: `heads` x [rows, cols] per row of the batch, in
    `score_bytes`, held for `layers_kept` layers."""

    form: str  # ring | gather | ulysses | none (no context parallelism)
    heads: int  # heads this device scores
    rows: int  # queries per score block
    cols: int  # keys per score block
    batch: int  # rows of the batch
    layers_kept: int  # 1: one layer's at a time; L: every layer's, kept for the backward
    score_bytes: int = F32

    @property
    def per_layer_bytes(self) -> float:
        return self.batch * self.heads * self.rows * self.cols * self.score_bytes

    @property
    def bytes(self) -> float:
        return self.per_layer_bytes * self.layers_kept


def attention_scores(
    form: str,
    *,
    batch: int,
    seq_len: int,
    n_heads: int,
    cp: int,
    n_layers: int,
    tp: int = 1,
    checkpointing: bool = False,
    score_bytes: int = F32,
) -> AttentionScores:
    """The score buffers of one form on one device (zigzag split: 2cp chunks of T/(2cp)):

    ring     one chunk pair at a time, [T/(2cp)]^2 per head on H/tp heads; its backward
             recomputes them from the log-sum-exp, so one layer's is all it holds;
    gather   the local queries against every key, [T/cp] x T per head on H/tp heads;
    ulysses  every query against every key on H/(tp cp) heads: T^2 x H/(tp cp), the same count
             as gather's arranged by heads;
    none     no context parallelism: [T, T] per head on H/tp heads.

    gather, ulysses and none keep every layer's probabilities for the backward (autodiff),
    one layer's with activation checkpointing. Scores are f32 (the softmax's dtype)."""
    positive_ints(batch=batch, seq_len=seq_len, n_heads=n_heads, cp=cp, n_layers=n_layers, tp=tp)
    if form != "none":
        check_form(form)
    if seq_len % (2 * cp) and form == "ring":
        raise ValueError(f"sequence length {seq_len} does not split into the 2cp={2 * cp} chunks")
    if seq_len % cp:
        raise ValueError(f"sequence length {seq_len} does not split over cp={cp}")
    heads = n_heads // tp
    kept = 1 if checkpointing else n_layers
    common = {"form": form, "batch": batch, "score_bytes": score_bytes}
    if form == "ring":
        s = seq_len // (2 * cp)
        return AttentionScores(heads=heads, rows=s, cols=s, layers_kept=1, **common)
    if form == "gather":
        return AttentionScores(
            heads=heads, rows=seq_len // cp, cols=seq_len, layers_kept=kept, **common
        )
    if form == "ulysses":
        if heads % cp:
            raise ValueError(f"Ulysses splits the heads over cp={cp}: {heads} heads do not")
        return AttentionScores(
            heads=heads // cp, rows=seq_len, cols=seq_len, layers_kept=kept, **common
        )
    return AttentionScores(heads=heads, rows=seq_len, cols=seq_len, layers_kept=kept, **common)
