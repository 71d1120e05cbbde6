"""Bugs planted on purpose, to show that a check can fail."""

from functools import partial


def plant_extra_pmean(monkeypatch):
    """Replace the manual path's data reduction by the classic bug of
    jaxscale/lessons/data_parallel.py (pmean of gradients autodiff already summed: N x the
    mean), on the strategy's own local loss."""
    from jaxscale.lessons import data_parallel
    from jaxscale.parallel import manual

    def extra_pmean(m, params, batch_BT1):
        loss_fn = partial(manual.local_loss, m)
        axes = m.comp.data_axes
        return data_parallel.dp_loss_and_grads(loss_fn, params, batch_BT1, axes, "extra_pmean")

    monkeypatch.setattr(manual, "loss_and_grads", extra_pmean)
