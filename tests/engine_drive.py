"""Driving an engine in the serving tests: every request queued at once, stepped to the end."""


def drain(engine, requests) -> tuple[list[list[int]], dict[str, list[float]]]:
    """(each request's tokens, each request's log-probabilities by id) once `engine` has served
    `requests` (scheduler Requests, all added before the first step: queued and chunked)."""
    logprobs = {r.id: [] for r in requests}
    for r in requests:
        engine.add(r)
    while engine.has_work():
        for ev in engine.step():
            logprobs[ev.request_id].append(ev.logprob)
    return [r.out for r in requests], logprobs
