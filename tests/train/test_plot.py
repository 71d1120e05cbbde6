"""`jaxscale plot`: the metrics.jsonl of train, rl and rlhf runs drawn, bad input refused in one
line with exit 2, the learning rate drawn from the run's schedule. Small files written here; no
training run, nothing compiled but the schedule's few array operations."""

import json
import math

import matplotlib
import pytest

from jaxscale.cli import main as cli_main
from jaxscale.train import plot

matplotlib.use("Agg")

TRAIN = [  # as the train loop writes them: a start record, train records, eval records
    {"run_id": "a", "event": "start", "step": 0, "resumed": False},
    {"run_id": "a", "step": 0, "loss": 5.5, "grad_norm": 1.0, "lr": 0.0},
    {"run_id": "a", "step": 10, "loss": 4.0, "grad_norm": 0.9, "lr": 1e-3},
    {"run_id": "a", "step": 10, "eval_loss": 4.2, "optimal_loss": 2.0},
]
RL = [  # jaxscale rl: one record per update and seed (NaN return: no episode ended), then evals
    {"seed": s, "update": u, "env_steps": 256 * u, "episode_return": r, "policy_loss": 0.1}
    for s in (0, 1)
    for u, r in ((1, None), (2, 12.0), (3, 20.0))
] + [{"seed": s, "env_steps": 768, "eval_return": 25.0} for s in (0, 1)]
RLHF = [  # jaxscale rlhf: one record per iteration (json.dumps, so NaN may be bare)
    {"iteration": i, "true_score": 0.2 + i / 10, "rm_score": i - 1.0, "kl": 0.3 * i, "beta": 0.05}
    for i in range(4)
]
KINDS = {"train": TRAIN, "rl": RL, "rlhf": RLHF}


def _write(directory, records, text=None):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "metrics.jsonl"
    path.write_text(text if text is not None else "".join(json.dumps(r) + "\n" for r in records))
    return path


def _plot(capsys, *argv):
    rc = cli_main(["plot", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def _lines(panels, ylabel):
    return {
        label: (xs, ys) for p in panels if p["ylabel"] == ylabel for label, xs, ys, *_ in p["lines"]
    }


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_run_is_drawn_and_told_by_its_keys(kind, tmp_path, capsys):
    run = tmp_path / kind
    _write(run, KINDS[kind])
    rc, out, err = _plot(capsys, run)
    assert rc == 0, err
    assert (run / "loss.png").read_bytes()[:4] == b"\x89PNG" and "loss.png" in out
    assert plot.curves(run)[0] == kind


def test_the_natural_curves_of_each_kind(tmp_path):
    _, panels = plot.curves(_write(tmp_path / "rl", RL))
    returns = _lines(panels, "episodic return")
    assert returns["training episodes (seed 0)"] == ([512.0, 768.0], [12.0, 20.0])  # null: skipped
    assert returns["evaluation (seed 1)"] == ([768.0], [25.0])
    _, panels = plot.curves(_write(tmp_path / "rlhf", RLHF))
    assert [p["ylabel"].split()[0] for p in panels] == ["true", "reward-model", "KL"]
    assert all(p["xlabel"] == "iteration" and len(p["lines"]) == 1 for p in panels)


def test_non_finite_points_are_skipped_not_fatal(tmp_path, capsys):
    text = "\n".join(
        [
            '{"step": 0, "loss": null, "lr": 0.0}',  # the strict writer's NaN
            '{"step": 1, "loss": "NaN", "lr": 0.1}',  # a NaN spelt as a string
            '{"step": 2, "loss": NaN, "lr": 0.1}',  # json.dumps' bare NaN
            '{"step": 3, "loss": "-Infinity", "lr": 0.1}',
            '{"step": 4, "loss": 2.5, "lr": 0.1}',
        ]
    )
    path = _write(tmp_path, None, text)
    _, panels = plot.curves(path)
    assert _lines(panels, "loss (nats/token)")["train loss"] == ([4.0], [2.5])
    rc, _, err = _plot(capsys, path)
    assert rc == 0 and err == "" and (tmp_path / "loss.png").is_file()


def test_a_resumed_runs_later_record_wins_even_when_it_is_not_finite(tmp_path):
    text = '{"step": 5, "loss": 3.0}\n{"step": 6, "loss": 2.0}\n{"step": 5, "loss": null}\n'
    _, panels = plot.curves(_write(tmp_path, None, text))
    assert _lines(panels, "loss (nats/token)")["train loss"] == ([6.0], [2.0])


@pytest.mark.parametrize(
    "text, problem",
    [
        ('{"step": 1, "loss": "high"}\n', ':1: loss is "high", not a number'),
        ('{"step": 1, "loss": true}\n', ":1: loss is true, not a number"),
        ('{"step": "one", "loss": 1.0}\n', ':1: step is "one", not a number'),
        ('{"loss": 1.0}\n', ":1: a loss record without 'step'"),
        ('{"step": 0, "loss": 1.0}\n[1, 2]\n', ":2: not a JSON object"),
        ('{"step": 0, "loss": 1.0}\n{"step": \n', ":2: not a JSON line"),
        ('{"step": 1, "accuracy": 0.5}\n', "not the metrics of a train, rl or rlhf run"),
        ("", "not the metrics of a train, rl or rlhf run"),
        ('{"iteration": 1, "kl": 0.1, "true_score": [0.5]}\n', ":1: true_score is [0.5]"),
    ],
)
def test_a_bad_metrics_file_is_one_line_and_exit_2(text, problem, tmp_path, capsys):
    rc, out, err = _plot(capsys, _write(tmp_path, None, text))
    assert rc == 2 and out == ""
    assert err.startswith("jaxscale plot: error: ") and err.count("\n") == 1 and problem in err
    assert not (tmp_path / "loss.png").exists()


def test_a_metrics_path_that_is_a_directory_is_named(tmp_path, capsys):
    (tmp_path / "run" / "metrics.jsonl").mkdir(parents=True)
    for run in (tmp_path / "run", tmp_path / "run" / "metrics.jsonl"):
        rc, _, err = _plot(capsys, run)
        assert rc == 2 and err.count("\n") == 1
        assert f"{tmp_path / 'run' / 'metrics.jsonl'} is a directory, not a metrics file" in err


def test_the_output_is_checked_before_the_metrics_are_read(tmp_path, capsys):
    run = tmp_path / "run"
    _write(run, None, '{"step": 1, "loss": "high"}\n')  # bad too: the output's error comes first
    (run / "loss.png").mkdir()  # the default output cannot be written
    rc, _, err = _plot(capsys, run)
    assert rc == 2 and err.count("\n") == 1 and f"{run / 'loss.png'} is a directory" in err
    _write(run, TRAIN)
    with pytest.raises(SystemExit) as exit_:  # --out is checked as the flag is parsed
        cli_main(["plot", str(run), "--out", "/proc/x.png"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "error: argument --out: cannot create /proc/x.png" in err


def _schedule_run(tmp_path, lr=1e-3, warmup=20, steps=300):
    """A run that warmed up for 20 steps and logged every 100: the logged points alone would
    draw a 100-step ramp. Its logged lr values are the schedule's (linear warmup, then cosine
    decay to a tenth), computed here by formula."""

    def schedule(t):
        if t < warmup:
            return lr * t / warmup
        frac = min(t - warmup, steps - warmup) / (steps - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    logged = [0, 100, 200, steps - 1]
    records = [{"step": t, "loss": 3.0, "lr": schedule(t)} for t in logged]
    path = _write(tmp_path, records)
    train = {"lr": lr, "warmup_steps": warmup, "steps": steps, "min_lr_ratio": 0.1}
    (tmp_path / "config.json").write_text(json.dumps({"model": {}, "train": train, "run": {}}))
    return path, logged, [schedule(t) for t in logged]


def test_the_learning_rate_is_the_schedule_at_every_step(tmp_path):
    path, _, _ = _schedule_run(tmp_path)
    _, panels = plot.curves(path)
    ((label, (xs, ys)),) = _lines(panels, "learning rate").items()
    assert label == "learning rate (schedule from config.json)"
    assert xs == list(range(300))  # every step from 0 to the last logged one
    assert ys[20] == pytest.approx(1e-3) and ys[10] == pytest.approx(5e-4)  # the warmup's end
    assert max(ys) == pytest.approx(1e-3) and ys.index(max(ys)) == 20


@pytest.mark.parametrize(
    "config, why",
    [
        (None, "no config.json"),
        ("{not json", "config.json unusable"),
        ('{"train": {"lr": -1}}', "config.json unusable"),
        ('{"train": {"lr": 0.5, "warmup_steps": 20, "steps": 300}}', "schedule differs"),
    ],
)
def test_without_a_usable_config_the_logged_points_are_drawn_and_labelled(config, why, tmp_path):
    path, logged, lrs = _schedule_run(tmp_path)
    if config is None:
        (tmp_path / "config.json").unlink()
    else:
        (tmp_path / "config.json").write_text(config)
    _, panels = plot.curves(path)
    ((label, (xs, ys)),) = _lines(panels, "learning rate").items()
    assert "logged points" in label and why in label
    assert xs == logged and ys == pytest.approx(lrs)


@pytest.mark.parametrize("kind", KINDS)
def test_every_panel_has_axis_labels_and_a_legend_beside_its_data(kind, tmp_path):
    import matplotlib.pyplot as plt

    _, panels = plot.curves(_write(tmp_path, KINDS[kind]))
    fig, axes = plt.subplots(len(panels), 1, squeeze=False)
    try:
        for ax, panel in zip(axes[:, 0], panels, strict=True):
            plot.draw(ax, panel)
        fig.canvas.draw()
        for ax in axes[:, 0]:
            assert ax.get_xlabel() and ax.get_ylabel()
            legend, box = ax.get_legend().get_window_extent(), ax.get_window_extent()
            assert legend.x0 >= box.x1  # outside the axes: it covers no curve
    finally:
        plt.close(fig)
