"""Checks on a drawn matplotlib figure: every axes labelled, every legend inside the figure and
clear of the plotted data (bars, lines, bands, markers) and of the axes' text. A plain module the
plot tests import (tests/ is on sys.path, see conftest.py)."""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox


def capture(monkeypatch) -> list[tuple[Figure, float]]:
    """Every figure saved from now on, with the dpi it was saved at (`render.figure` closes its
    figure once written; the object stays drawable)."""
    saved: list[tuple[Figure, float]] = []
    original = Figure.savefig

    def savefig(self, *args, **kwargs):
        saved.append((self, kwargs.get("dpi", self.dpi)))
        out = original(self, *args, **kwargs)
        self._saved_canvas = self.canvas  # closing the figure takes its canvas away: keep it
        return out

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


def _data_boxes(fig: Figure, renderer) -> list[tuple[str, Bbox]]:
    """The window extent of each plotted artist, cut to its axes (what is drawn of it)."""
    out = []
    for ax in fig.axes:
        clip = ax.get_window_extent(renderer)
        for artist in (*ax.lines, *ax.patches, *ax.collections):
            if not artist.get_visible():
                continue
            box = Bbox.intersection(artist.get_window_extent(renderer), clip)
            if box is not None:
                out.append((f"{ax.get_title()!r}: {artist}", box))
    return out


def _text_boxes(fig: Figure, renderer) -> list[tuple[str, Bbox]]:
    """Titles, axis labels and tick labels of every axes."""
    out = []
    for ax in fig.axes:
        texts = [ax.title, ax.xaxis.label, ax.yaxis.label]
        texts += ax.get_xticklabels() + ax.get_yticklabels()
        for t in texts:
            if t.get_visible() and t.get_text():
                out.append((f"{ax.get_title()!r}: {t.get_text()!r}", t.get_window_extent(renderer)))
    return out


def check_figure(fig: Figure) -> list:
    """Assert every axes has an x and a y label and every legend is whole inside the figure
    and overlaps no plotted data and no axes text; return the legends."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax in fig.axes:
        assert ax.get_xlabel(), f"axes {ax.get_title()!r} has no x label"
        assert ax.get_ylabel(), f"axes {ax.get_title()!r} has no y label"
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    legends += fig.legends
    data, text = _data_boxes(fig, renderer), _text_boxes(fig, renderer)
    assert data, "nothing plotted"
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert fig.bbox.containsx(box.x0) and fig.bbox.containsx(box.x1), "legend cut off"
        assert fig.bbox.containsy(box.y0) and fig.bbox.containsy(box.y1), "legend cut off"
        for what, other in data:
            assert not box.overlaps(other), f"a legend covers data: {what}"
        for what, other in text:
            assert not box.overlaps(other), f"a legend covers text: {what}"
    return legends


def legend_texts(legend) -> list[str]:
    return [t.get_text() for t in legend.get_texts()]
