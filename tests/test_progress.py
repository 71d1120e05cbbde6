"""The progress bar's time left: the rate of the items finished after the first (which carries
start-up and compiles), times the items left; none where the caller says items differ too
much in cost."""

import pytest

from jaxscale import progress


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    return now


def _lines(capsys):
    return capsys.readouterr().err.strip().splitlines()


def test_the_eta_leaves_out_the_first_items_start_up(clock, capsys):
    bar = progress.Progress(10, desc="t", every=1)  # stderr is not a terminal: a line per update
    clock[0] += 50.0  # the first item: 50 s of compiling
    bar.update(1)
    clock[0] += 2.0  # then 2 s per item
    bar.update(1)
    clock[0] += 2.0
    bar.update(1)
    first, second, third = _lines(capsys)
    assert "eta     ?" in first  # one point: no rate yet
    assert "eta  16.0s" in second  # 2 s/item x 8 left (counting the first: 52/2 x 8 = 208 s)
    assert "eta  14.0s" in third


def test_no_eta_where_items_differ_in_cost(clock, capsys):
    bar = progress.Progress(3, desc="t", every=1, eta=False)
    for _ in range(3):
        clock[0] += 1.0
        bar.update(1)
    lines = _lines(capsys)
    assert len(lines) == 3 and not any("eta" in line for line in lines)
    assert "3.0s" in lines[-1]  # the elapsed time is still shown
