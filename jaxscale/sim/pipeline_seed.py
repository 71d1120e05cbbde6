"""Seed-faithful port of seed 002 ch7's `pipeline_schedule_viz.py`, defects kept.

Used only under `--seed-faithful`, so users can compare with the seed's printout:
- the naive bubble is (P-1)*M / (P*M + P-1) (68.6% for P4 M8, defect 3), where the
  schedule's own grid gives (P-1)/(M+P-1) = 27.3%;
- the 1F1B grid places ops by formula, not by dependencies, so cells overwrite each other and
  B0/B1 vanish (defect 4); its bubble and peak memory are printed from formulas
  ((P-1)/(M+P-1) and P for every stage).
The corrected values come from `jaxscale.sim.pipeline.simulate`.
"""

from jaxscale.sim.pipeline import _check_counts

SEED_GRID_MAX_CELLS = 25  # the seed truncates the 1F1B grid to 25 time slots


def naive_bubble(stages: int, microbatches: int) -> float:
    """The seed's naive bubble (visualize_naive_schedule), wrong: it should be (P-1)/(M+P-1)."""
    _check_counts(stages, microbatches, 1)
    return (stages - 1) * microbatches / (stages * microbatches + (stages - 1))


def naive_cells(stages: int, microbatches: int) -> list[list[str]]:
    """The seed's fill-drain grid (visualize_naive_schedule): forwards at s+m, then backwards."""
    _check_counts(stages, microbatches, 1)
    fwd_time = microbatches + stages - 1
    rows = []
    for s in range(stages):
        row = ["."] * (2 * fwd_time)
        for m in range(microbatches):
            row[s + m] = f"F{m}"
            row[fwd_time + (stages - 1 - s) + m] = f"B{m}"
        rows.append(row)
    return rows


def one_f_one_b_cells(stages: int, microbatches: int) -> list[list[str]]:
    """The seed's formula-placed 1F1B grid (visualize_1f1b_schedule), including its overwrites."""
    _check_counts(stages, microbatches, 1)
    total = 2 * microbatches + 2 * (stages - 1)
    rows = []
    for s in range(stages):
        row = ["."] * total
        warmup = stages - s

        def put(t: int, text: str, row=row) -> None:
            if t < total:
                row[t] = text

        for m in range(warmup):  # even past M: the seed then draws forwards that don't exist
            put(s + m, f"F{m}")
        for m in range(warmup, microbatches):
            put(s + m, f"F{m}")
            put(s + m + (1 if s == stages - 1 else 2), f"B{m - warmup}")
        for i, m in enumerate(range(microbatches - warmup, microbatches)):
            # For warmup > M the seed's range starts below 0 and writes "B-1" etc.; kept.
            put(stages + microbatches - 1 + s + i, f"B{m}")
        rows.append(row)
    return rows


def format_cells(rows: list[list[str]], max_cells: int | None = None) -> str:
    """The seed's grid layout: 3-wide right-aligned cells, a time header and a rule."""
    total = len(rows[0])
    shown = total if max_cells is None else min(total, max_cells)
    lines = ["Time →  " + "".join(f"{i:>3}" for i in range(shown)), "-" * (8 + shown * 3)]
    for s, row in enumerate(rows):
        more = "..." if max_cells is not None and total > max_cells else ""
        lines.append(f"GPU {s}:  " + "".join(f"{c:>3}" for c in row[:shown]) + more)
    return "\n".join(lines)


def seed_report(stages: int, microbatches: int) -> dict:
    """What the seed prints for both schedules before it crashes at its summary (defect 5)."""
    return {
        "naive_grid": format_cells(naive_cells(stages, microbatches)),
        "naive_bubble": naive_bubble(stages, microbatches),
        "naive_peak_memory": microbatches,
        "one_f_one_b_grid": format_cells(
            one_f_one_b_cells(stages, microbatches), SEED_GRID_MAX_CELLS
        ),
        "one_f_one_b_bubble": (stages - 1) / (microbatches + stages - 1),
        "one_f_one_b_peak_memory": stages,
    }
