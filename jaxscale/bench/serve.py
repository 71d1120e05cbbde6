"""`jaxscale bench serve`: the serving engine measured, each figure beside its prediction.

1. latency under Poisson arrivals at several request rates, in process and over HTTP with the
   `openai` client: TTFT and TPOT (p50, p99), request and token throughput; in process also
   with the engine reading each step's tokens before launching the next (`read_first`: no
   overlap of host and device work), beside the default (`in_process`);
2. continuous vs static batching on one workload (seed 000's: lengths N(mean, std) clipped):
   engine steps and wall time, beside `jaxscale simulate batching`'s step counts;
3. capacity for one KV memory budget, paged (pages as needed) vs contiguous (max_seq reserved
   per request), beside `calc kv`'s utilisation assumptions (50% unpaged, 95% paged); and the
   same bytes as a bf16 pool held as an int8 pool (`--kv-dtype int8`), beside `calc kv
   --dtype-bytes 1`;
4. the radix prefix cache's hit rate on requests sharing a system prompt, beside `calc prefix`'s
   saved fraction for the same prompts.
On CPU the timings are indicative; the ratios and counts are the result.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np

from jaxscale.bench import serve_setup
from jaxscale.bench.serve_setup import Setup
from jaxscale.calc import kv as calc_kv
from jaxscale.calc import prefix as calc_prefix
from jaxscale.cliutil import fail
from jaxscale.sim import batching as sim


def _pct(xs, q):
    return float(np.percentile(xs, q)) if len(xs) else float("nan")


def summarize(arrival, first, last, n_out, makespan: float) -> dict:
    """p50/p99 TTFT and TPOT (ms), requests/s and generated tokens/s."""
    ttft = [(f - a) * 1e3 for a, f in zip(arrival, first, strict=True)]
    tpot = [(la - f) * 1e3 / (n - 1) for f, la, n in zip(first, last, n_out, strict=True) if n > 1]
    return {
        "ttft_p50_ms": _pct(ttft, 50),
        "ttft_p99_ms": _pct(ttft, 99),
        "tpot_p50_ms": _pct(tpot, 50),
        "tpot_p99_ms": _pct(tpot, 99),
        "requests_per_s": len(arrival) / makespan,
        "tokens_per_s": sum(n_out) / makespan,
    }


PATHS = ("in_process", "read_first", "http")  # the engine as served; read each step first; HTTP


def poisson_in_process(setup: Setup, params, rate: float, overlap: bool = True) -> dict:
    """Requests arrive at Poisson times; the engine steps whenever it has work (reading each
    step's tokens while the next runs, or, `overlap` False, before it)."""
    from jaxscale.serve.sampling import SamplingParams
    from jaxscale.serve.scheduler import Request

    rng = np.random.default_rng(setup.seed)
    prompts = serve_setup.prompts(setup, rng)
    arrive = np.cumsum(rng.exponential(1 / rate, setup.n_requests))
    eng = serve_setup.engine(setup, params, overlap=overlap)
    eng.warmup()  # every shape compiled before the clock starts
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    count: dict[str, int] = {}
    t0, i = time.perf_counter(), 0
    while i < len(prompts) or eng.has_work():
        now = time.perf_counter() - t0
        while i < len(prompts) and arrive[i] <= now:
            eng.add(Request(str(i), prompts[i], setup.max_new, SamplingParams(1.0, seed=i)))
            i += 1
        if not eng.has_work():
            time.sleep(max(0.0, arrive[i] - now))
            continue
        for ev in eng.step():
            t = time.perf_counter() - t0
            first.setdefault(ev.request_id, t)
            last[ev.request_id] = t
            count[ev.request_id] = count.get(ev.request_id, 0) + 1
    ids = [str(k) for k in range(len(prompts))]
    return summarize(
        arrive,
        [first[k] for k in ids],
        [last[k] for k in ids],
        [count[k] for k in ids],
        max(last.values()),
    )


def poisson_http(setup: Setup, params, rate: float) -> dict:
    """The same over HTTP: a server on a free loopback port, one client thread per request
    (the `openai` client, streaming); times are the client's."""
    import socket

    import openai
    import uvicorn

    from jaxscale.serve.server import make_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    eng = serve_setup.engine(setup, params)
    eng.warmup()
    server = uvicorn.Server(
        uvicorn.Config(make_app(eng, "bench"), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
    rng = np.random.default_rng(setup.seed)
    prompts = [bytes(p).decode() for p in serve_setup.prompts(setup, rng)]
    arrive = np.cumsum(rng.exponential(1 / rate, setup.n_requests))
    n = len(prompts)
    first, last, count = [0.0] * n, [0.0] * n, [0] * n
    t0 = time.perf_counter()

    def one(k):
        time.sleep(max(0.0, arrive[k] - (time.perf_counter() - t0)))
        stream = client.completions.create(
            model="bench",
            prompt=prompts[k],
            stream=True,
            max_tokens=setup.max_new,
            temperature=1.0,
            seed=k,
        )
        for _ in stream:
            t = time.perf_counter() - t0
            first[k] = first[k] or t
            last[k] = t
            count[k] += 1

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.should_exit = True
    thread.join(timeout=30)
    return summarize(arrive, first, last, count, max(last))


def batching(setup: Setup, params) -> dict:
    """Seed 000's workload (scaled to the model), one-token prompts: the engine with static
    batching (a batch runs to its longest request) and with continuous batching, steps and wall
    time, beside the simulator's steps."""
    from jaxscale.serve.scheduler import Request

    lengths = sim.Workload(
        num_requests=setup.n_requests,
        mean_length=setup.max_new,
        std_length=setup.max_new * 0.75,
        min_length=2,
        max_length=2 * setup.max_new,
    ).lengths()
    B = setup.max_num_seqs
    pred_s, pred_c = sim.simulate_static(lengths, B), sim.simulate_continuous(lengths, B)
    out = {"lengths": lengths.tolist(), "batch": B}
    for name, static, pred in (("static", True, pred_s), ("continuous", False, pred_c)):
        eng = serve_setup.engine(setup, params, prefix_cache=False, static_batching=static)
        eng.warmup()
        t0 = time.perf_counter()
        done = eng.run([Request(str(i), [65], int(n)) for i, n in enumerate(lengths)])
        wall = time.perf_counter() - t0
        # each request's prompt step also yields its first token, so steps = tokens' steps
        out[name] = {
            "steps": eng.steps,
            "predicted_steps": pred.total_steps,
            "wall_s": wall,
            "tokens": sum(len(r.out) for r in done.values()),
        }
    out["speedup_measured"] = out["static"]["wall_s"] / out["continuous"]["wall_s"]
    out["speedup_predicted"] = pred_s.total_steps / pred_c.total_steps
    return out


def _fill(eng, reqs) -> tuple[int, int]:
    """Run `reqs` on `eng`: (peak running requests, most pages a request held)."""
    for r in reqs:
        eng.add(r)
    peak = pages_each = 0
    while eng.has_work():
        eng.step()
        peak = max(peak, len(eng.scheduler.running))
        pages_each = max([pages_each] + [len(r.pages) for r in eng.scheduler.running])
    return peak, pages_each


def capacity(setup: Setup, params) -> dict:
    """Requests that fit at once in one KV budget: contiguous reserves max_seq positions per
    request; the paged engine takes pages as tokens arrive (peak running requests measured);
    an int8 pool of a bf16 pool's bytes holds more pages (the scales included)."""
    from jaxscale.model import kv_cache
    from jaxscale.serve.scheduler import Request

    ps, S, cfg = setup.page_size, setup.cfg.max_seq, setup.cfg
    n_pages = 4 * S // ps + 1  # 4 full contexts (page 0 is reserved)
    contiguous = (n_pages - 1) * ps // S
    rng = np.random.default_rng(setup.seed)
    prompts = [[int(t) for t in rng.integers(32, 127, setup.prompt_len)] for _ in range(64)]

    def requests():
        return [Request(str(i), p, setup.max_new) for i, p in enumerate(prompts)]

    eng = serve_setup.engine(setup, params, n_pages=n_pages, max_num_seqs=64, prefix_cache=False)
    reqs = requests()
    peak, pages_each = _fill(eng, reqs)
    # the same bytes as `n_pages - 1` bf16 pages, as int8 pages with their scales
    bf16, int8 = (kv_cache.bytes_per_token(cfg, dt) for dt in ("bfloat16", "int8"))
    int8_pages = (n_pages - 1) * bf16 // int8 + 1
    eng8 = serve_setup.engine(
        setup, params, n_pages=int8_pages, max_num_seqs=64, prefix_cache=False, kv_dtype="int8"
    )
    peak8, _ = _fill(eng8, requests())
    # calc kv's fragmentation model for these requests: contiguous reserves max_seq positions
    # each, paging holds what is used; the ratio of the two is the capacity ratio it predicts
    per_token = calc_kv.kv_bytes_per_token(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 4)
    frag = calc_kv.fragmentation(per_token, len(reqs), setup.prompt_len + setup.max_new, S)
    return {
        "kv_positions": (n_pages - 1) * ps,
        "request_positions": setup.prompt_len + setup.max_new,
        "max_seq": S,
        "contiguous": contiguous,
        "paged_peak_running": peak,
        "pages_per_request": pages_each,
        "paged_at_full_length": (n_pages - 1) // pages_each,
        "calc_kv_ratio": frag.bytes_without_paging / frag.bytes_with_paging,
        "calc_kv_waste": frag.waste_fraction,
        "preemptions": sum(r.preemptions for r in reqs),
        "bytes_per_token": {"bfloat16": bf16, "int8": int8},
        "calc_kv_int8_values": calc_kv.kv_bytes_per_token(
            cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 1
        ),
        "head_dim": cfg.head_dim,
        "pages": n_pages - 1,
        "int8_pages": int8_pages - 1,
        "int8_at_full_length": (int8_pages - 1) // pages_each,
        "int8_peak_running": peak8,
    }


def prefix_hits(setup: Setup, params) -> dict:
    """Requests one after another, each a shared system prompt plus its own question."""
    from jaxscale.serve.scheduler import Request

    rng = np.random.default_rng(setup.seed)
    system = [int(t) for t in rng.integers(32, 127, 4 * setup.page_size + 5)]
    own = 8
    eng = serve_setup.engine(setup, params, max_num_seqs=1)
    n = 8
    eng.run(
        [
            Request(str(i), system + [int(t) for t in rng.integers(32, 127, own)], 2)
            for i in range(n)
        ]
    )
    shared = len(system) // setup.page_size * setup.page_size  # whole pages only
    pred = calc_prefix.shared_prefix_savings(n, shared, len(system) - shared + own, 1)
    return {
        "requests": n,
        "system_tokens": len(system),
        "shared_whole_pages": shared,
        "hit_rate": eng.cache.hit_rate,
        "calc_prefix_saved_fraction": pred.saved_fraction,
    }


def run(
    setup: Setup, http: bool = True, progress=None, layouts: bool = False, decoding: bool = False
) -> dict:
    from jaxscale.model import state as ms

    params = ms.init_params(setup.cfg, 0)
    out: dict = {
        "setup": {
            "n_requests": setup.n_requests,
            "prompt_len": setup.prompt_len,
            "max_new": setup.max_new,
            "max_num_seqs": setup.max_num_seqs,
            "rates": list(setup.rates),
        }
    }
    steps = [("batching", batching), ("capacity", capacity), ("prefix", prefix_hits)]
    out["in_process"], out["read_first"] = {}, {}
    for rate in setup.rates:
        out["in_process"][rate] = poisson_in_process(setup, params, rate)
        out["read_first"][rate] = poisson_in_process(setup, params, rate, overlap=False)
        if progress:
            progress.update(1, note=f"in-process {rate}/s")
    if http:
        out["http"] = {}
        for rate in setup.rates:
            out["http"][rate] = poisson_http(setup, params, rate)
            if progress:
                progress.update(1, note=f"http {rate}/s")
    for name, fn in steps:
        out[name] = fn(setup, params)
        if progress:
            progress.update(1, note=name)
    if layouts:
        from jaxscale.bench import serve_layouts

        prompts = serve_setup.prompts(setup, np.random.default_rng(setup.seed))
        out["layouts"] = serve_layouts.run(setup, params, prompts, progress)
    if decoding:
        from jaxscale.bench import serve_decoding

        prompts = serve_setup.prompts(setup, np.random.default_rng(setup.seed))
        out["decoding"] = serve_decoding.run(setup, params, prompts, progress)
    return out


def report(res: dict) -> str:
    lines = [
        f"{'path':<11}{'rate/s':>7}{'TTFT p50':>10}{'p99':>8}{'TPOT p50':>10}{'p99':>8}"
        f"{'req/s':>8}{'tok/s':>9}   (ms; CPU: indicative)"
    ]
    for path in PATHS:
        for rate, m in res.get(path, {}).items():
            lines.append(
                f"{path:<11}{rate:>7g}{m['ttft_p50_ms']:>10.1f}{m['ttft_p99_ms']:>8.1f}"
                f"{m['tpot_p50_ms']:>10.1f}{m['tpot_p99_ms']:>8.1f}"
                f"{m['requests_per_s']:>8.2f}{m['tokens_per_s']:>9.1f}"
            )
    b = res["batching"]
    lines += [
        "",
        f"batching, {len(b['lengths'])} requests, {b['batch']} slots: steps measured / "
        "simulate batching",
        f"  static      {b['static']['steps']:>5} / {b['static']['predicted_steps']:<5} "
        f"{b['static']['wall_s']:.2f} s",
        f"  continuous  {b['continuous']['steps']:>5} / "
        f"{b['continuous']['predicted_steps']:<5} {b['continuous']['wall_s']:.2f} s",
        f"  continuous speedup: measured {b['speedup_measured']:.2f}x, predicted (steps) "
        f"{b['speedup_predicted']:.2f}x",
    ]
    c = res["capacity"]
    lines += [
        "",
        f"capacity, {c['kv_positions']} KV positions, requests of "
        f"{c['request_positions']} positions (context {c['max_seq']}):",
        f"  contiguous (max_seq reserved each): {c['contiguous']}; paged: "
        f"{c['paged_at_full_length']} at full length ({c['pages_per_request']} pages "
        f"each), x{c['paged_at_full_length'] / max(c['contiguous'], 1):.1f}; peak running "
        f"{c['paged_peak_running']} with {c['preemptions']} preemptions",
        f"  calc kv (fragmentation of {c['request_positions']} of {c['max_seq']}): "
        f"{c['calc_kv_waste']:.1%} of a contiguous cache unused, x"
        f"{c['calc_kv_ratio']:.1f} requests with paging",
        f"  int8, the bytes of {c['pages']} bf16 pages: {c['int8_pages']} pages, "
        f"{c['int8_at_full_length']} requests at full length (peak running "
        f"{c['int8_peak_running']}); a token "
        f"{c['bytes_per_token']['int8']} B against bf16's {c['bytes_per_token']['bfloat16']} B"
        f" (calc kv --dtype-bytes 1: {c['calc_kv_int8_values']} B + a float32 scale per layer,"
        f" kv head and K or V; head_dim {c['head_dim']})",
    ]
    p = res["prefix"]
    lines += [
        "",
        f"prefix cache, {p['requests']} requests sharing {p['system_tokens']} tokens "
        f"({p['shared_whole_pages']} in whole pages): hit rate {p['hit_rate']:.1%}, calc "
        f"prefix saved fraction {p['calc_prefix_saved_fraction']:.1%}",
    ]
    return "\n".join(lines)


def plot(res: dict, path) -> Path:
    from jaxscale.render import figure

    outside = {"loc": "upper left", "bbox_to_anchor": (1.01, 1), "borderaxespad": 0}
    with figure(path, 1, 2, figsize=(13, 4.4), dpi=110) as (_, (ax_t, ax_b)):
        for pth, style in zip(PATHS, ("o-", "^:", "s--"), strict=True):
            rows = res.get(pth, {})
            if rows:
                rates = list(rows)
                ax_t.plot(
                    rates, [rows[r]["ttft_p50_ms"] for r in rates], style, label=f"TTFT p50 {pth}"
                )
                ax_t.plot(
                    rates, [rows[r]["tpot_p50_ms"] for r in rates], style, label=f"TPOT p50 {pth}"
                )
        ax_t.set_xscale("log")
        rates = sorted({r for pth in PATHS for r in res.get(pth, {})})
        ax_t.set_xticks(rates, [f"{r:g}" for r in rates])
        ax_t.minorticks_off()
        ax_t.set_xlabel("requests / s (Poisson)")
        ax_t.set_ylabel("ms")
        ax_t.legend(fontsize=8, **outside)
        ax_t.set_title("latency under load")
        b = res["batching"]
        names = ["static", "continuous"]
        x = np.arange(2)
        ax_b.bar(x - 0.2, [b[n]["steps"] for n in names], 0.4, label="engine (measured)")
        ax_b.bar(
            x + 0.2,
            [b[n]["predicted_steps"] for n in names],
            0.4,
            label="simulate batching (predicted)",
        )
        ax_b.set_xticks(x, names)
        ax_b.set_xlabel("batching")
        ax_b.set_ylabel("engine steps")
        ax_b.legend(fontsize=8, **outside)
        ax_b.set_title("steps for one workload")
    return Path(path)


def main(args) -> int:
    import sys

    from jaxscale.progress import Progress

    setup = Setup(n_requests=args.requests)
    http = not args.no_http
    if http:
        try:
            import openai  # noqa: F401
            import uvicorn  # noqa: F401
        except ImportError as e:
            return fail(
                "bench serve",
                f"the HTTP runs need the server stack and the openai client ({e.name} is "
                "missing): pip install -e '.[dev]', or pass --no-http",
            )
    print(
        f"bench serve: model d_model {setup.cfg.d_model}, {setup.cfg.n_layers} layers, "
        f"context {setup.cfg.max_seq}; {setup.n_requests} requests of {setup.prompt_len} + "
        f"{setup.max_new} tokens, {setup.max_num_seqs} slots",
        file=sys.stderr,
    )
    if args.dry_run:
        paths = ["in-process"] + (["http"] if http else [])
        print(
            "\n".join(
                [f"poisson {p} at {r:g} requests/s" for p in paths for r in setup.rates]
                + [
                    "continuous vs static batching",
                    "paged vs contiguous capacity",
                    "prefix cache hit rate",
                ]
            )
        )
        return 0
    n = len(setup.rates) * (2 if http else 1) + 3
    if args.layouts:
        from jaxscale.bench.serve_layouts import LAYOUTS

        n += len(LAYOUTS)
    n += 2 * args.decoding
    bar = Progress(n, desc="bench serve", eta=False)
    res = run(setup, http=http, progress=bar, layouts=args.layouts, decoding=args.decoding)
    bar.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_serve.json").write_text(json.dumps(res, indent=1, default=str))
    paths = [out / "bench_serve.json"]
    if not args.no_plot:
        paths.append(plot(res, args.plot or out / "bench_serve.png"))
    print(json.dumps(res, default=str) if args.json else report(res))
    if args.layouts and not args.json:
        from jaxscale.bench.serve_layouts import format_rows

        print()
        print(format_rows(res["layouts"]))
    if args.decoding and not args.json:
        from jaxscale.bench import serve_decoding

        print()
        print(serve_decoding.format_rows(res["decoding"]))
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0
