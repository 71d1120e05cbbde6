"""Chinchilla compute-optimal tokens and MoE parameter counts (seed 001 §2-§3).

Chinchilla (Hoffmann et al., 2022): for a fixed compute budget, train on ~20 tokens per parameter.
For a mixture of experts only the routed top-k experts run per token, so compute (and the Chinchilla
token budget) follows the ACTIVE parameters, while memory follows the TOTAL.
"""

from dataclasses import dataclass

from jaxscale.calc.flops import training_flops
from jaxscale.checks import positive

CHINCHILLA_TOKENS_PER_PARAM = 20
ZETTA = 1e21


def chinchilla_optimal_tokens(
    n_params: float, tokens_per_param: float = CHINCHILLA_TOKENS_PER_PARAM
) -> float:
    """Compute-optimal training tokens = 20 * N (seed 001 §2, "Key Finding")."""
    positive(n_params=n_params, tokens_per_param=tokens_per_param)
    return tokens_per_param * n_params


@dataclass(frozen=True)
class ChinchillaRow:
    name: str
    n_params: float
    optimal_tokens: float
    compute_flops: float  # 6 * N * D at the optimal D

    @property
    def compute_zettaflops(self) -> float:
        return self.compute_flops / ZETTA


def chinchilla_row(
    name: str, n_params: float, tokens_per_param: float = CHINCHILLA_TOKENS_PER_PARAM
) -> ChinchillaRow:
    tokens = chinchilla_optimal_tokens(n_params, tokens_per_param)
    return ChinchillaRow(name, n_params, tokens, training_flops(n_params, tokens))


def tokens_per_param(n_params: float, n_tokens: float) -> float:
    """Actual tokens per parameter: GPT-3 300B / 175B = 1.7 (seed 001 §2's examples)."""
    positive(n_params=n_params)
    return n_tokens / n_params


# Seed 001 §2's example calculations: parameters, and the tokens actually trained on.
CHINCHILLA_MODELS = (
    ("GPT-3", 175e9),
    ("Chinchilla", 70e9),
    ("LLaMA-2-7B", 7e9),
    ("LLaMA-2-13B", 13e9),
    ("LLaMA-2-70B", 70e9),
)
ACTUAL_TRAINING_TOKENS = (("GPT-3", 175e9, 300e9), ("LLaMA-2-70B", 70e9, 2000e9))


@dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts model by parameter groups (seed 001 §3, `MoEConfig`)."""

    shared_params: float  # attention, embeddings, router: run for every token
    num_experts: int
    expert_params: float  # one expert, summed over all MoE layers
    top_k: int  # experts each token is routed to

    def __post_init__(self):
        if self.shared_params < 0 or not self.expert_params > 0:
            raise ValueError("shared_params must be >= 0 and expert_params > 0")
        if self.num_experts < 1 or not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"need 1 <= top_k <= num_experts, got top_k={self.top_k}, "
                f"num_experts={self.num_experts}"
            )

    @property
    def total_params(self) -> float:
        return self.shared_params + self.num_experts * self.expert_params

    @property
    def active_params(self) -> float:
        return self.shared_params + self.top_k * self.expert_params

    @property
    def active_fraction(self) -> float:
        """What the seed calls compute efficiency: active / total."""
        return self.active_params / self.total_params

    def optimal_tokens(self, tokens_per_param: float = CHINCHILLA_TOKENS_PER_PARAM) -> float:
        return chinchilla_optimal_tokens(self.active_params, tokens_per_param)

    @classmethod
    def from_totals(
        cls, total_params: float, active_params: float, num_experts: int, top_k: int
    ) -> "MoEConfig":
        """Solve shared and per-expert sizes from published total/active counts.

        total = S + E*x and active = S + k*x  =>  x = (total - active) / (E - k).
        """
        if not total_params > active_params > 0:
            raise ValueError("need total_params > active_params > 0")
        if not num_experts > top_k >= 1:
            raise ValueError("need num_experts > top_k >= 1 to solve the split")
        expert = (total_params - active_params) / (num_experts - top_k)
        shared = active_params - top_k * expert
        if shared < 0:
            raise ValueError("inconsistent totals: the shared part would be negative")
        return cls(shared, num_experts, expert, top_k)


B = 1e9
# Seed 001 §3's example configurations, as its code has them (its prose, "Example: GPT-4", has
# GPT-4 without the shared 100B: 8 x 220B = 1.76T total, 220B active; see the seed notes).
# DeepSeek-V3: 671B total / 37B active (seed 002 ch7, "Why MoE?"); the split is solved for its
# published routing, 256 routed experts with top-8. Mixtral as seed 003 has it (~47B total,
# ~13B active, in its concepts table), solved for 8 experts, top-2: the seed 001 preset
# (5B + 8 x 7B) counts each expert as a whole 7B model.
MOE_MODELS: dict[str, MoEConfig] = {
    "GPT-4 (rumored)": MoEConfig(100 * B, 8, 220 * B, 1),
    "Mixtral-8x7B": MoEConfig(5 * B, 8, 7 * B, 2),
    "Mixtral-8x7B (seed 003)": MoEConfig.from_totals(47 * B, 13 * B, 8, 2),
    "Switch-C (Google)": MoEConfig(100 * B, 128, 10 * B, 1),
    "DeepSeek-V3": MoEConfig.from_totals(671 * B, 37 * B, 256, 8),
}
