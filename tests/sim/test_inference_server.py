"""Seed 002's minimal_inference_server.py on a virtual clock: its run with random.seed(0) (what the
seed's script prints: four prefills of 6/6/5/4 prompt tokens, decode batches of 4, request 4
admitted as soon as request 1 finishes, then 3 -> 2 -> 1; lengths 5/7/16/20/20) and its
invariants."""

import json

import pytest

from jaxscale.cli import main
from jaxscale.sim import inference_server as srv


def test_the_seed_run():
    reqs, events = srv.run(num_requests=5, batch_size=4, seed=0)
    assert [e.prompt_tokens for e in events if e.kind == "prefill"][:4] == [6, 6, 5, 4]
    assert sorted(len(r.generated) for r in reqs) == [5, 7, 16, 20, 20]
    assert events[4].kind == "decode" and len(events[4].ids) == 4
    # request 4 is prefilled at the step after request 1's last token
    i = next(k for k, e in enumerate(events) if e.kind == "prefill" and e.ids == (4,))
    assert reqs[1].finished_at == events[i - 1].at
    sizes = [len(e.ids) for e in events[i + 1 :] if e.kind == "decode"]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 1 and 3 in sizes and 2 in sizes


def test_invariants_over_seeds():
    for seed in range(50):
        reqs, events = srv.run(num_requests=9, batch_size=3, seed=seed)
        assert all(len(e.ids) <= 3 for e in events)
        admitted = [e.ids[0] for e in events if e.kind == "prefill"]
        assert admitted == sorted(admitted)  # FIFO
        for r in reqs:  # EOS or max_tokens, nothing after
            eos_end = r.generated[-1] == srv.EOS and srv.EOS not in r.generated[:-1]
            assert len(r.generated) == r.max_tokens or eos_end
        assert sum(len(r.generated) for r in reqs) == len(reqs) + sum(
            len(e.ids) for e in events if e.kind == "decode"
        )


def test_virtual_milliseconds_and_the_seeds_seconds(capsys):
    main(["simulate", "server", "--json"])
    fixed = json.loads(capsys.readouterr().out)["summary"]
    main(["simulate", "server", "--json", "--seed-faithful"])
    seed = json.loads(capsys.readouterr().out)["summary"]
    assert seed["time_s"] == pytest.approx(1000 * fixed["time_s"])  # 10 s per 10 ms step
    assert fixed["tokens"] == seed["tokens"] == 68
