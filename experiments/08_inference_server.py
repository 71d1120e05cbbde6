"""Seed 002 chapter 8, anatomy of an inference server: the seed's minimal server beside the real
engine on the same prompts.

    python experiments/08_inference_server.py [-n 5] [-b 4]

1. the seed's minimal_inference_server.py on a virtual clock (`jaxscale simulate server`): its
   mock model and schedule, one prefill at a time, decode batches;
2. the same prompts (as bytes) on the real engine (jaxscale/serve/engine.py) with the same number
   of slots: each step's decode and prefill rows, then per-request TTFT and completion time,
   measured (indicative on CPU), and the compiled shapes;
3. prefill and decode against the roofline: experiments/08_inference_roofline.py.
"""

import argparse
import time

from jaxscale.cli import main as jaxscale_main
from jaxscale.config import ModelConfig
from jaxscale.model import state as ms
from jaxscale.serve.engine import Engine, EngineConfig
from jaxscale.serve.sampling import SamplingParams
from jaxscale.serve.scheduler import Request
from jaxscale.sim.inference_server import PROMPTS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-requests", "-n", type=int, default=5)
    p.add_argument("--batch-size", "-b", type=int, default=4)
    a = p.parse_args()
    print("1. the seed's server, virtual clock\n")
    jaxscale_main(["simulate", "server", "-n", str(a.num_requests), "-b", str(a.batch_size)])

    print(f"\n2. the real engine: {a.batch_size} slots, 20 new tokens per request\n")
    cfg = ModelConfig(max_seq=128)
    eng = Engine(
        ms.init_params(cfg, 0),
        cfg,
        EngineConfig(max_num_seqs=a.batch_size, max_num_batched_tokens=64, page_size=16),
    )
    print(
        f"compiling {eng.warmup()} shapes (batch sizes {eng.batch_sizes} x decode and prefill "
        f"chunks {eng.buckets}, and {len(eng.mixed)} steps that mix them)"
    )
    reqs = [
        Request(str(i), list(PROMPTS[i % len(PROMPTS)].encode()), 20, SamplingParams(1.0, seed=i))
        for i in range(a.num_requests)
    ]
    for r in reqs:
        eng.add(r)
    first, done, t0, step = {}, {}, time.perf_counter(), 0
    while eng.has_work():
        plan_running = [r.id for r in eng.scheduler.running]
        events = eng.step()
        t = (time.perf_counter() - t0) * 1e3
        for ev in events:
            first.setdefault(ev.request_id, t)
            if ev.finish_reason:
                done[ev.request_id] = t
        if step < 12 or not eng.has_work():
            print(
                f"  step {step:>3} {t:>8.1f} ms  running before: {plan_running or '-'}  "
                f"tokens to: {[ev.request_id for ev in events]}"
            )
        step += 1
    print(f"\n{'request':>8} {'prompt bytes':>13} {'tokens':>7} {'TTFT ms':>9} {'done ms':>9}")
    for r in reqs:
        print(
            f"{r.id:>8} {len(r.prompt):>13} {len(r.out):>7} {first[r.id]:>9.1f} {done[r.id]:>9.1f}"
        )
    total = sum(len(r.out) for r in reqs)
    end = max(done.values())
    print(
        f"\n{total} tokens in {end:.0f} ms: {total / end * 1e3:,.0f} tokens/s on "
        f"{eng.steps} engine steps, {eng.compiles} compiled shapes "
        "(CPU: indicative)"
    )
    print(
        "\n3. prefill vs prompt length, decode vs batch size: experiments/08_inference_roofline.py"
    )


if __name__ == "__main__":
    main()
