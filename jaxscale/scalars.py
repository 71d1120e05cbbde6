"""TensorBoard scalars beside a run's JSON lines (`--tensorboard DIR`), written with tensorboardX
(the `profile` extra), so a run's curves and its `--profile` trace open in one TensorBoard:
`tensorboard --logdir DIR`. Each numeric field of a record becomes the scalar
`<kind>/<field>` at the record's step (train/loss, train/grad_norm, eval/eval_loss, ...);
non-finite values are left out (the JSON lines keep them as null)."""

from __future__ import annotations

import math

INSTALL = "pip install -e '.[profile]'"


def check_available(flag: str = "--tensorboard") -> None:
    """ValueError (one line, exit 2) before anything runs when the writer is not installed."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        message = f"{flag} writes with tensorboardX, which is not installed: {INSTALL}"
        raise ValueError(message) from None


class Scalars:
    """A writer of scalars into `logdir` (None: writes nothing)."""

    def __init__(self, logdir: str | None):
        self.writer = None
        if logdir:
            from tensorboardX import SummaryWriter

            self.writer = SummaryWriter(str(logdir))

    def record(self, kind: str, step: int, values: dict) -> None:
        if self.writer is None:
            return
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                self.writer.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
