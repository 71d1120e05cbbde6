"""RL training throughput: synchronous vs asynchronous generate / score / train iterations.

Seed: seed 001 §10 "Reinforcement Learning Training". Sync runs generate -> score -> train in
sequence on all GPUs; async overlaps generation (+ scoring) with training on split GPU sets: time =
max(T_generate + T_score, T_train) (its `estimate_rl_throughput`; the prose's max(T_generate,
T_train), "Throughput Calculation", drops scoring). Training costs 6N FLOPs per token per PPO epoch
at 50% MFU on the training GPUs.

The seed times generation and scoring on ONE GPU (`calculate_inference_latency` has no GPU count),
while training gets all 256 (sync) or 128 (async) GPUs. Generation then dominates both modes and
async gains only 1.10x, against its own summary's "1.5-2x". The corrected (default) model
runs generation on the generating GPUs: replicas of the fewest GPUs (power of two) that hold the
weights, the batch split between replicas, each timed on the roofline of `inference.py`; the 10x
smaller reward model scores on the same GPUs. Sync generates on all GPUs, async on `gen_gpus`
(default: half, the seed's split), and `best_async_split` searches the split.
"""

import math
from dataclasses import dataclass

from jaxscale.calc.inference import SEED001_H100, SEED_WEIGHT_BYTES, inference_latency
from jaxscale.calc.serving import OVERHEAD_BYTES_PER_GPU
from jaxscale.hardware import Device

SEED_MFU = 0.5  # training at 50% MFU (seed 001 §10)
SEED_REWARD_FRACTION = 0.1  # "Assume reward model is 10x smaller" (seed 001 §10)
SEED_BATCH_SIZES = (128, 256, 512, 1024)  # the seed's plot (seed 001 §10)
MODES = ("sync", "async")


@dataclass(frozen=True)
class RlIteration:
    mode: str  # "sync" or "async"
    batch_size: int
    gen_len: int
    gen_gpus: int  # GPUs generating and scoring (1 in the seed's arithmetic)
    train_gpus: int
    t_generate_s: float
    t_score_s: float
    t_train_s: float

    @property
    def time_per_iter_s(self) -> float:
        if self.mode == "sync":
            return self.t_generate_s + self.t_score_s + self.t_train_s
        return max(self.t_generate_s + self.t_score_s, self.t_train_s)

    @property
    def samples_per_s(self) -> float:
        return self.batch_size / self.time_per_iter_s

    @property
    def tokens_per_s(self) -> float:
        return self.batch_size * self.gen_len / self.time_per_iter_s


def replica_gpus(n_params: float, gpu: Device, weight_bytes: float = SEED_WEIGHT_BYTES) -> int:
    """Fewest GPUs (1, 2, 4, ...) whose memory, less overhead, holds the weights with room left."""
    per_gpu = gpu.memory_bytes - OVERHEAD_BYTES_PER_GPU
    tp = 1
    while tp * per_gpu <= n_params * weight_bytes:
        tp *= 2
    return tp


def _train_time_s(n_params, tokens, ppo_epochs, train_gpus, flops_per_s, mfu) -> float:
    return 6 * n_params * tokens * ppo_epochs / (train_gpus * flops_per_s * mfu)


def _check_count(name: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def rl_iteration(
    n_params: float,
    batch_size: int,
    prompt_len: int,
    gen_len: int,
    ppo_epochs: int,
    total_gpus: int,
    mode: str = "sync",
    *,
    kv_bytes_per_token: float,
    gpu: Device = SEED001_H100,
    gen_gpus: int | None = None,
    mfu: float = SEED_MFU,
    reward_fraction: float = SEED_REWARD_FRACTION,
    seed_faithful: bool = False,
) -> RlIteration:
    """One generate / score / train iteration (seed 001 `estimate_rl_throughput`)."""
    if mode not in MODES:
        raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
    _check_count("PPO epochs", ppo_epochs)
    _check_count("total GPUs", total_gpus, 1 if mode == "sync" else 2)  # async splits them
    if not 0 < mfu <= 1 or not 0 < reward_fraction:
        raise ValueError("MFU must be in (0, 1] and the reward-model fraction > 0")
    if gpu.flops_per_s is None or gpu.hbm_bytes_per_s is None:
        raise ValueError(f"{gpu.name}: no peak FLOP/s or bandwidth known for it")
    tokens = batch_size * (prompt_len + gen_len)
    timing = dict(
        kv_bytes_per_token=kv_bytes_per_token,
        flops_per_s=gpu.flops_per_s,
        hbm_bytes_per_s=gpu.hbm_bytes_per_s,
    )
    reward_params = n_params * reward_fraction
    if seed_faithful:
        gen_gpus = 1
        train_gpus = total_gpus if mode == "sync" else total_gpus // 2
        gen = inference_latency(
            n_params, prompt_len, gen_len, batch_size, **timing, seed_faithful=True
        )
        score = inference_latency(
            reward_params, prompt_len + gen_len, 1, batch_size, **timing, seed_faithful=True
        )
        t_generate_s, t_score_s = gen.total_s, score.prefill_s
    else:
        if mode == "sync":
            gen_gpus, train_gpus = total_gpus, total_gpus
        else:
            gen_gpus = total_gpus // 2 if gen_gpus is None else gen_gpus
            _check_count("generation GPUs", gen_gpus)
            train_gpus = total_gpus - gen_gpus
            _check_count("training GPUs (total minus generation GPUs)", train_gpus)
        t_generate_s = _phase_s(n_params, gpu, gen_gpus, batch_size, prompt_len, gen_len, timing)
        t_score_s = _phase_s(
            reward_params, gpu, gen_gpus, batch_size, prompt_len + gen_len, 0, timing
        )
    t_train_s = _train_time_s(n_params, tokens, ppo_epochs, train_gpus, gpu.flops_per_s, mfu)
    return RlIteration(
        mode, batch_size, gen_len, gen_gpus, train_gpus, t_generate_s, t_score_s, t_train_s
    )


def _phase_s(n_params, gpu, gpus, batch_size, prompt_len, gen_len, timing) -> float:
    """Generation (gen_len > 0) or scoring (prefill of prompt + response) over `gpus` GPUs."""
    tp = replica_gpus(n_params, gpu)
    if gpus < tp:
        raise ValueError(f"{gpus} generation GPUs cannot hold the weights: need at least {tp}")
    per_replica = math.ceil(batch_size / (gpus // tp))
    if gen_len == 0:  # score: one forward over prompt + response, the seed's gen_len=1 prefill
        return inference_latency(n_params, prompt_len, 1, per_replica, **timing, tp=tp).prefill_s
    return inference_latency(n_params, prompt_len, gen_len, per_replica, **timing, tp=tp).total_s


def best_async_split(
    n_params: float,
    batch_size: int,
    prompt_len: int,
    gen_len: int,
    ppo_epochs: int,
    total_gpus: int,
    *,
    kv_bytes_per_token: float,
    gpu: Device = SEED001_H100,
    mfu: float = SEED_MFU,
    reward_fraction: float = SEED_REWARD_FRACTION,
) -> RlIteration:
    """The async iteration over every generation GPU count (a multiple of the replica size) that
    minimises the time per iteration; ties go to fewer generation GPUs."""
    tp = max(replica_gpus(n_params, gpu), replica_gpus(n_params * reward_fraction, gpu))
    best = None
    for gen_gpus in range(tp, total_gpus, tp):
        it = rl_iteration(
            n_params,
            batch_size,
            prompt_len,
            gen_len,
            ppo_epochs,
            total_gpus,
            "async",
            kv_bytes_per_token=kv_bytes_per_token,
            gpu=gpu,
            gen_gpus=gen_gpus,
            mfu=mfu,
            reward_fraction=reward_fraction,
        )
        if best is None or it.time_per_iter_s < best.time_per_iter_s:
            best = it
    if best is None:
        raise ValueError(f"{total_gpus} GPUs cannot be split: generation alone needs {tp}")
    return best
