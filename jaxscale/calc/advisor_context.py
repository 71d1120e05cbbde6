"""When the advisor considers context parallelism: the long-sequence rule (calc/advisor.py's
module docstring) and the forms it may use."""

from dataclasses import dataclass

from jaxscale.calc.advisor_layouts import candidate_layouts
from jaxscale.calc.advisor_model import Hardware, Workload, evaluate
from jaxscale.calc.advisor_rules import GB
from jaxscale.calc.context import FORMS as CP_FORMS

CONTEXT_CHOICES = ("auto", "always", "never")
CP_FORM_CHOICES = ("auto", *CP_FORMS)


@dataclass(frozen=True)
class ContextDecision:
    """Whether context-parallel layouts were enumerated, in which forms, and why."""

    considered: bool
    forms: tuple[str, ...]
    reason: str


def long_sequence(workload: Workload, hw: Hardware) -> tuple[bool, str]:
    """(whether the activations at this sequence length do not fit per GPU without CP, why):
    no layout without CP fits even with full recomputation, yet some layout's model state does."""
    frugal = [evaluate(workload, hw, x) for x in candidate_layouts(workload, hw, "always")]
    seq = f"seq {workload.seq}"
    if not frugal:
        return False, "no layout without context parallelism splits the batch"
    fitting = sum(c.fits for c in frugal)
    if fitting:
        return False, f"{fitting} layouts without context parallelism fit at {seq}"
    if not any(c.memory.model_state <= hw.usable_bytes for c in frugal):
        return False, "the model state alone does not fit: splitting the sequence cannot help"
    least = min(c.memory.activations for c in frugal)
    return True, (
        f"at {seq} the activations do not fit per GPU without it (at least {least / GB:.1f} GB"
        " with full recomputation, beside the model state)"
    )


def context_decision(
    workload: Workload, hw: Hardware, choice: str = "auto", cp_form: str = "auto"
) -> ContextDecision:
    """The long-sequence rule (module docstring, `long_sequence`), or always / never by
    `choice`; the forms `cp_form` allows ("auto": all three)."""
    if choice not in CONTEXT_CHOICES:
        raise ValueError(f"context must be one of {', '.join(CONTEXT_CHOICES)}, got {choice!r}")
    if cp_form not in CP_FORM_CHOICES:
        raise ValueError(f"cp_form must be one of {', '.join(CP_FORM_CHOICES)}, got {cp_form!r}")
    forms = CP_FORMS if cp_form == "auto" else (cp_form,)
    if choice == "never":
        return ContextDecision(False, (), "context parallelism not considered (never)")
    if workload.is_moe:
        return ContextDecision(
            False, (), "an MoE model: the lab runs one over the context axis only dropless"
        )
    if choice == "always":
        return ContextDecision(True, forms, "context parallelism considered (always)")
    is_long, why = long_sequence(workload, hw)
    return ContextDecision(is_long, forms if is_long else (), why)
