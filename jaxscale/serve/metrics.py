"""`GET /metrics`: the server's figures in the Prometheus text format (prometheus_client), one
registry per app: requests by endpoint and status, prompt and generated tokens, time to first
token, time per output token and end-to-end latency as histograms, and -- read from the engine
when scraped, without a lock, so a scrape never waits for a step -- running and waiting
requests, KV pages used and free, and the prefix cache's hit rate (hit tokens / looked-up
tokens since start).

Names follow Prometheus' conventions (`_total` counters, `_seconds` histograms) under the
`jaxscale_` prefix, as vLLM's do under `vllm:`.
"""

from __future__ import annotations

import time

from jaxscale.serve.engine import Engine

# latencies on the CPU run from milliseconds to tens of seconds
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    """The app's collectors; `finished` and `refused` record a request, the gauges read the
    engines at scrape time (summed over data-parallel replicas)."""

    def __init__(self, engines: list[Engine]):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "jaxscale_requests",
            "requests answered, by endpoint and HTTP status (499: the client hung up)",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "jaxscale_prompt_tokens", "prompt tokens of the requests run", registry=r
        )
        self.generation_tokens = Counter(
            "jaxscale_generation_tokens", "tokens generated and returned", registry=r
        )
        self.ttft = Histogram(
            "jaxscale_time_to_first_token_seconds",
            "from the request's arrival to its first generated token",
            buckets=BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "jaxscale_time_per_output_token_seconds",
            "after the first token: (last - first) / (tokens - 1), per request",
            buckets=BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "jaxscale_e2e_request_latency_seconds",
            "from the request's arrival to its last token",
            buckets=BUCKETS,
            registry=r,
        )

        def total(read):  # summed over the data-parallel replicas
            return lambda: sum(read(e) for e in engines)

        def hit_rate() -> float:
            caches = [e.cache for e in engines if e.cache]
            looked_up = sum(c.query_tokens for c in caches)
            return sum(c.hit_tokens for c in caches) / looked_up if looked_up else 0.0

        gauges = {
            "jaxscale_requests_running": (
                "requests in the running batch",
                total(lambda e: len(e.scheduler.running)),
            ),
            "jaxscale_requests_waiting": (
                "requests queued",
                total(lambda e: len(e.scheduler.waiting)),
            ),
            "jaxscale_kv_pages_free": ("KV pages free", total(lambda e: e.allocator.n_free)),
            "jaxscale_kv_pages_used": (
                "KV pages held (page 0 of each pool is reserved and not counted)",
                total(lambda e: e.allocator.n_pages - 1 - e.allocator.n_free),
            ),
            "jaxscale_prefix_cache_hit_rate": (
                "prompt tokens found in the prefix cache / prompt tokens looked up",
                hit_rate,
            ),
            "jaxscale_spec_decode_draft_tokens": (
                "draft tokens proposed by speculative rounds (0 without a draft model)",
                total(lambda e: e.spec.drafted),
            ),
            "jaxscale_spec_decode_accepted_tokens": (
                "draft tokens the target accepted (acceptance rate: accepted / draft)",
                total(lambda e: e.spec.accepted),
            ),
            "jaxscale_spec_decode_target_passes": (
                "speculative rounds' target passes, one per row (tokens per pass: (accepted "
                "+ passes) / passes)",
                total(lambda e: e.spec.target_passes),
            ),
        }
        for name, (doc, read) in gauges.items():
            Gauge(name, doc, registry=r).set_function(read)

    def refused(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def finished(self, endpoint: str, status: int, prompt: int, timing: Timing) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(timing.tokens)
        if timing.first is not None:
            self.ttft.observe(timing.first - timing.start)
            self.e2e.observe(timing.last - timing.start)
            if timing.tokens > 1:
                self.tpot.observe((timing.last - timing.first) / (timing.tokens - 1))

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class Timing:
    """One request's clock: its arrival, first and last token, tokens returned."""

    def __init__(self):
        self.start, self.first, self.last, self.tokens = time.monotonic(), None, None, 0

    def token(self) -> None:
        now = time.monotonic()
        self.first = now if self.first is None else self.first
        self.last, self.tokens = now, self.tokens + 1
