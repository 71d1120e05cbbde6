"""The advisor's search space: every layout tp x cp x pp x dp (x ep) x ZeRO stage x
recomputation that uses all the GPUs (calc/advisor.py ranks them)."""

import math

from jaxscale.calc.advisor_model import Hardware, Layout, Workload, attention_shape, model_shape


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


RECOMPUTE_CHOICES = {"auto": (False, True), "never": (False,), "always": (True,)}


def context_degrees(
    workload: Workload, gpus: int, tp: int, forms: tuple[str, ...]
) -> list[tuple[int, str | None]]:
    """(cp, form) pairs a tensor group of tp leaves room for: (1, None), and each cp > 1 dividing
    the remaining GPUs, with the zigzag split's 2cp chunks dividing the sequence and the heads
    dividing over tp (and, for Ulysses, over tp * cp)."""
    out: list[tuple[int, str | None]] = [(1, None)]
    heads, kv_heads, _ = attention_shape(workload)
    if not forms or heads % tp or kv_heads % tp:
        return out
    for cp in _divisors(gpus // tp)[1:]:
        if workload.seq % (2 * cp):
            continue
        for form in forms:
            if form != "ulysses" or (heads // tp % cp == 0 and kv_heads // tp % cp == 0):
                out.append((cp, form))
    return out


def candidate_layouts(
    workload: Workload, hw: Hardware, recompute: str = "auto", cp_forms: tuple[str, ...] = ()
) -> list[Layout]:
    """Every layout using all the GPUs; with `cp_forms`, also those splitting each sequence over
    cp GPUs in each of those forms."""
    if recompute not in RECOMPUTE_CHOICES:
        raise ValueError(
            f"recompute must be one of {', '.join(RECOMPUTE_CHOICES)}, got {recompute!r}"
        )
    _, layers = model_shape(workload)
    g = hw.num_gpus
    layouts = []
    for tp in _divisors(math.gcd(hw.gpus_per_node, g)):
        for cp, form in context_degrees(workload, g, tp, cp_forms):
            for pp in _divisors(g // (tp * cp)):
                dp = g // (tp * cp * pp)
                if pp > layers or workload.batch % (dp * workload.micro_batch):
                    continue
                eps = [e for e in _divisors(dp) if workload.num_experts % e == 0]
                for ep in eps if workload.is_moe else [1]:
                    for zero in (0, 1, 2, 3) if dp * cp > 1 else (0,):
                        for rc in RECOMPUTE_CHOICES[recompute]:
                            layouts.append(Layout(tp, pp, dp, zero, ep, rc, cp, form))
    return layouts
