"""JSON-lines metrics of a training run, one object per line, written by process 0 only.

Every record carries the run's id (a resumed run is a new id, so a plot or a reader can tell
the segments apart and let the later one win for the steps both cover) and the wall time since
the run started. Train records: loss, pre-clip gradient norm, learning rate, tokens/s averaged
over the last `log_every` steps, and MFU where the device's peak FLOP/s is known (never on CPU;
model FLOPs, causal attention halved). Eval records carry the data's known optimal loss, where
it has one. The first record of a run says where it starts.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from pathlib import Path

import jax

from jaxscale.devices import mfu
from jaxscale.model import counts
from jaxscale.render import json_line
from jaxscale.scalars import Scalars


class MetricsLog:
    def __init__(self, path, cfg, tcfg, built, last_step: int, tensorboard: str | None = None):
        self.path = Path(path) if path and jax.process_index() == 0 else None
        self.file = None
        # TensorBoard scalars of the same records (scalars.py), process 0's too
        self.tb_dir = tensorboard if jax.process_index() == 0 else None
        self.scalars = Scalars(None)
        self.run_id = uuid.uuid4().hex[:8]
        self.t0 = time.perf_counter()
        self.tcfg, self.built, self.last_step = tcfg, built, last_step
        self.tokens = tcfg.global_batch * tcfg.seq_len
        self.window: deque = deque(maxlen=tcfg.log_every + 1)  # read times of recent steps
        n = built.mesh.devices.size
        self.model_flops = (
            counts.train_step_flops(
                cfg, tcfg.global_batch, tcfg.seq_len, causal=True, executed=False
            )
            / n
        )
        self.device_kind = built.mesh.devices.flat[0].device_kind

    def __enter__(self):
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = self.path.open("a")
        self.scalars = Scalars(self.tb_dir)
        return self

    def __exit__(self, *exc):
        if self.file is not None:
            self.file.close()
        self.scalars.close()

    def _write(self, record: dict) -> dict:
        record = {
            "run_id": self.run_id,
            **record,
            "time_s": round(time.perf_counter() - self.t0, 3),
        }
        if self.file is not None:
            self.file.write(json_line(record) + "\n")
            self.file.flush()
        if "step" in record and "event" not in record:
            kind = "eval" if "eval_loss" in record else "train"
            values = {k: v for k, v in record.items() if k not in ("step", "run_id", "time_s")}
            self.scalars.record(kind, record["step"], values)
        return record

    def start(self, step: int, resumed: bool) -> None:
        b = self.built
        self._write(
            {
                "event": "start",
                "step": step,
                "resumed": resumed,
                "strategy": b.label,
                "mesh": str(b.strategy.mesh),
                "devices": int(b.mesh.devices.size),
                "device_kind": self.device_kind,
            }
        )

    def logs(self, step: int) -> bool:
        """Whether `step` gets a train record (every log_every steps, and the last)."""
        return step % self.tcfg.log_every == 0 or step == self.last_step

    def train(self, step: int, values: dict) -> dict | None:
        """A train record for `step` every log_every steps and at the last step, else None."""
        now = time.perf_counter()
        self.window.append(now)
        if not self.logs(step):
            return None
        record = {"step": step, **values}
        if len(self.window) > 1:
            dt = (self.window[-1] - self.window[0]) / (len(self.window) - 1)
            record["tokens_per_s"] = self.tokens / dt
            value = mfu(self.model_flops, dt, self.device_kind)
            if value is not None:
                record["mfu"] = value
        return self._write(record)

    def eval(self, step: int, loss: float, optimal: float | None) -> dict:
        record = {"step": step, "eval_loss": loss}
        if optimal is not None:
            record["optimal_loss"] = optimal
        return self._write(record)
