"""The workload and the engine of `jaxscale bench serve`'s suites (bench/serve.py and its
layouts and decoding sections): one place that builds them, so every section measures the same
engine settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from jaxscale.config import ModelConfig


@dataclass(frozen=True)
class Setup:
    cfg: ModelConfig = field(default_factory=lambda: ModelConfig(max_seq=256))
    n_requests: int = 24
    prompt_len: int = 32
    max_new: int = 32
    max_num_seqs: int = 8
    budget: int = 64  # max_num_batched_tokens
    page_size: int = 16
    rates: tuple[float, ...] = (2.0, 8.0, 32.0)  # requests per second
    seed: int = 0


def engine(
    setup: Setup, params, n_pages: int = 1024, cfg=None, mesh=None, draft=None, k: int = 0, **kw
):
    """An engine with the setup's slots, budget and page size (`kw`: other EngineConfig
    fields; `cfg`: another model than the setup's; `draft`: (params, cfg) of a draft model
    proposing `k` tokens a round)."""
    from jaxscale.serve.engine import Engine, EngineConfig

    e = EngineConfig(
        max_num_seqs=kw.pop("max_num_seqs", setup.max_num_seqs),
        max_num_batched_tokens=setup.budget,
        page_size=setup.page_size,
        n_pages=n_pages,
        speculative_tokens=k if draft else 0,
        **kw,
    )
    extra = {"draft_params": draft[0], "draft_cfg": draft[1]} if draft else {}
    return Engine(params, cfg or setup.cfg, e, mesh=mesh, **extra)


def prompts(setup: Setup, rng) -> list[list[int]]:
    """The workload's prompts: printable bytes, prompt_len each."""
    return [
        [int(t) for t in rng.integers(32, 127, setup.prompt_len)] for _ in range(setup.n_requests)
    ]
