"""Port of seed 002 ch11's `speculative_demo.py` (ML Systems Infrastructure Tutorial), `random` too.

The seed draws each drafted token (random vocabulary word, p_draft ~ U(0.3, 0.9)), lets the
target agree with probability a (p_target = p_draft * U(0.9, 1.5), else p_draft * U(0.1, 0.8),
clamped to 1) and accepts with min(1, p_target / p_draft) until the first rejection, which
yields one correction token. With `random.Random(seed)` consuming the same draws in the same
order, seed 42 reproduces its printout: 50 tokens, 13 target and 13 draft calls, 45 accepted,
5 rejected, 3.85 tokens per target call, 90.00% acceptance, 3.50x.

Each examined token is accepted independently with probability
    gamma = a * (5/6 + 0.95/6) + (1 - a) * 0.45 = 0.45 + (0.5416...) * a
(agree: r >= 1 always accepts, r < 1 accepts with probability r; disagree: E[r] = 0.45).

Two departures from the standard algorithm, kept only with `seed_faithful=True`:
- no bonus token when all k drafts are accepted (the target pass has computed the next token
  anyway), so a round yields (1 - gamma^k)/(1 - gamma) tokens on average, not
  (1 - gamma^(k+1))/(1 - gamma);
- the speedup charges `draft_cost` once per draft *call* (`calculate_speedup`), although a call
  drafts k tokens one forward pass at a time; the seed's own prose example charges each drafted
  token (its "Run It" page: 50 draft passes x 5 ms). Corrected: cost = target calls + drafted
  tokens * c.
"""

import random
from dataclasses import dataclass

# The vocabulary of the seed's main(), in order (the token index drawn by randint selects from it).
VOCAB = (
    "the",
    "a",
    "is",
    "are",
    "was",
    "were",
    "has",
    "have",
    "had",
    "will",
    "would",
    "could",
    "should",
    "may",
    "might",
    "must",
    "and",
    "or",
    "but",
    "if",
    "then",
    "else",
    "when",
    "where",
    "who",
    "what",
    "which",
    "that",
    "this",
    "these",
    "those",
    "I",
    "you",
    "he",
    "she",
    "it",
    "we",
    "they",
    "me",
    "him",
    "her",
    "good",
    "bad",
    "big",
    "small",
    "new",
    "old",
    "first",
    "last",
    "time",
    "way",
    "year",
    "day",
    "thing",
    "man",
    "world",
    "life",
)

AGREE_ACCEPT = (0.5 / 0.6) + (1.0 - 0.81) / 2 / 0.6  # P(accept | target agrees), r ~ U(0.9, 1.5)
DISAGREE_ACCEPT = 0.45  # E[r] for r ~ U(0.1, 0.8)


@dataclass(frozen=True)
class DemoConfig:
    draft_length: int = 5  # -k
    target_length: int = 50  # -n
    acceptance_rate: float = 0.75  # -a: P(target agrees with a draft token)
    draft_cost: float = 0.1  # cost of one draft forward relative to one target forward
    seed: int = 42

    def validate(self) -> None:
        if self.draft_length < 1 or self.target_length < 1:
            raise ValueError("draft_length and target_length must be >= 1")
        if not 0.0 <= self.acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate must be in [0, 1], got {self.acceptance_rate}")
        if self.draft_cost < 0:
            raise ValueError(f"draft_cost must be >= 0, got {self.draft_cost}")


@dataclass(frozen=True)
class DemoResult:
    config: DemoConfig
    seed_faithful: bool
    tokens: tuple  # generated token texts
    target_calls: int
    draft_calls: int  # one per round
    drafted_tokens: int  # sum of k over rounds
    accepted: int
    rejected: int  # rejection events (each adds one correction token)
    bonus: int  # rounds with every draft accepted that added the target's next token

    @property
    def tokens_per_target_call(self) -> float:
        return len(self.tokens) / self.target_calls

    @property
    def acceptance_rate(self) -> float:
        """Accepted / examined drafts (tokens after a rejection are never examined)."""
        return self.accepted / (self.accepted + self.rejected)

    @property
    def speculative_cost(self) -> float:
        """In target-forward units."""
        drafts = self.draft_calls if self.seed_faithful else self.drafted_tokens
        return self.target_calls + drafts * self.config.draft_cost

    @property
    def speedup(self) -> float:
        return len(self.tokens) / self.speculative_cost


def per_token_acceptance(acceptance_rate: float) -> float:
    """Probability that the demo accepts one examined draft token (see the module docstring)."""
    return acceptance_rate * AGREE_ACCEPT + (1.0 - acceptance_rate) * DISAGREE_ACCEPT


def _round(rng: random.Random, k: int, a: float) -> tuple[list[str], str | None]:
    """One draft/verify round; draws exactly what the seed draws, in the same order."""
    drafts = []
    for _ in range(k):  # the seed's simulate_draft_model
        word = VOCAB[rng.randint(0, len(VOCAB) - 1)]
        drafts.append([word, rng.uniform(0.3, 0.9), 0.0])
    for d in drafts:  # the seed's simulate_target_verification
        ratio = rng.uniform(0.9, 1.5) if rng.random() < a else rng.uniform(0.1, 0.8)
        d[2] = min(1.0, d[1] * ratio)
    accepted = []
    for i, (word, p_draft, p_target) in enumerate(drafts):  # the seed's speculative_acceptance
        if p_target >= p_draft or rng.random() < p_target / p_draft:
            accepted.append(word)
            continue
        rng.randint(0, 99)  # the seed draws an id for its correction token
        return accepted, f"[corrected_{i}]"
    return accepted, None


def run_demo(cfg: DemoConfig = DemoConfig(), seed_faithful: bool = False) -> DemoResult:
    cfg.validate()
    rng = random.Random(cfg.seed)
    generated: list[str] = []
    calls = drafted = accepted = rejected = bonus = 0
    while len(generated) < cfg.target_length:
        k = min(cfg.draft_length, cfg.target_length - len(generated))
        good, correction = _round(rng, k, cfg.acceptance_rate)
        calls += 1
        drafted += k
        accepted += len(good)
        generated += good
        if correction is not None:
            generated.append(correction)
            rejected += 1
        elif not seed_faithful and len(generated) < cfg.target_length:
            generated.append("[bonus]")  # the verify pass already scored position k+1
            bonus += 1
    return DemoResult(
        cfg, seed_faithful, tuple(generated), calls, calls, drafted, accepted, rejected, bonus
    )
