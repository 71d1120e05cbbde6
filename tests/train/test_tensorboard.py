"""`jaxscale train --tensorboard DIR`: the metrics' JSON lines as TensorBoard scalars, read back
here from the event file's records (TFRecord framing, tensorboardX's Event proto)."""

import json
import struct
import sys

import pytest

from jaxscale.cli import main as cli_main

pytest.importorskip("tensorboardX")


def _events(directory) -> dict:
    """{(tag, step): value} of every scalar in the event files under `directory`."""
    from tensorboardX.proto import event_pb2

    found = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):  # length (8), its crc (4), the record, its crc (4)
            (n,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
            i += 12 + n + 4
            for v in event.summary.value:
                found[(v.tag, event.step)] = v.simple_value
    return found


def test_every_logged_value_is_a_scalar_at_its_step(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--layers", "1", "--steps", "4", "--log-every", "1", "--eval-every", "2"]
    argv += ["--no-progress", "--sample-tokens", "0", "--out", str(run)]
    assert cli_main([*argv, "--tensorboard", str(run / "tb")]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    scalars = _events(run / "tb")
    expected = {}
    for r in records:
        if "loss" in r:
            for key in ("loss", "grad_norm", "lr"):
                expected[(f"train/{key}", r["step"])] = r[key]
        if "eval_loss" in r:
            expected[("eval/eval_loss", r["step"])] = r["eval_loss"]
    assert len(expected) == 4 * 3 + 2  # four train records, two evals
    for key, value in expected.items():
        assert scalars[key] == pytest.approx(value, rel=1e-6, abs=1e-12), key  # float32


def test_without_the_writer_the_flag_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails as if not installed
    rc = cli_main(["train", "--layers", "1", "--tensorboard", str(tmp_path / "tb"), "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and "--tensorboard writes with tensorboardX" in err and ".[profile]" in err
