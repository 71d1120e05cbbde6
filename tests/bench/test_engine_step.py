"""`bench.engine_step`: the engine in steady decoding beside its device step. Overlapped or not,
it samples the same tokens; a step's host time is a part of its wall time; the device step is
measured on the running rows and leaves the tokens unchanged."""

import pytest

from jaxscale.bench import engine_step
from jaxscale.config import ModelConfig
from jaxscale.model import state as ms

CFG = ModelConfig(max_seq=64)


def test_the_engine_step_splits_into_host_and_device_time_and_keeps_its_tokens():
    params = ms.init_params(CFG, 0)
    res = engine_step.compare(params, CFG, batch=2, steps=4)
    assert res["same_tokens"]
    assert res["device_ms"] > 0
    for on in (False, True):
        assert 0 < res["host_ms"][on] <= res["engine_ms"][on], res
    # the device step run midway changes nothing: a plain run samples the same tokens
    plain = engine_step.steady(params, CFG, 2, 4)
    measured = engine_step.steady(params, CFG, 2, 4, device=True)
    assert plain["device_ms"] is None and measured["device_ms"] > 0
    assert plain["tokens"] == measured["tokens"]


def test_a_run_longer_than_the_context_is_refused():
    with pytest.raises(ValueError, match="exceeds max_seq 64"):
        engine_step.steady(ms.init_params(CFG, 0), CFG, 1, 50)
