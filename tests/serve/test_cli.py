"""`jaxscale serve` as a user starts it: a process serving a checkpoint that `jaxscale train` wrote,
answering the `openai` client (whole and streamed) with the tokens the engine gives that
checkpoint in process, and shutting down cleanly on Ctrl-C (SIGINT)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytestmark = pytest.mark.slow  # a training run and a server process

from jaxscale.cli import main as cli_main  # noqa: E402

ENGINE = [
    "--max-num-seqs",
    "2",
    "--max-num-batched-tokens",
    "16",
    "--page-size",
    "16",
    "--n-pages",
    "40",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(run, *flags):
    rc = cli_main(
        [
            "train",
            "--data",
            "markov",
            "--global-batch",
            "8",
            "--seq-len",
            "16",
            "--steps",
            "3",
            "--no-progress",
            "--sample-tokens",
            "0",
            "--run-dir",
            str(run),
            *flags,
        ]
    )
    assert rc == 0, "the training run before serving failed"


def _in_process(ckpt, prompt: str, n: int) -> str:
    from jaxscale.serve.engine import Engine, EngineConfig
    from jaxscale.serve.sampling import SamplingParams
    from jaxscale.serve.scheduler import Request
    from jaxscale.train.checkpoint import load_model

    cfg, params = load_model(str(ckpt))
    eng = Engine(
        params,
        cfg,
        EngineConfig(max_num_seqs=2, max_num_batched_tokens=16, page_size=16, n_pages=40),
    )
    out = eng.run([Request("r", list(prompt.encode()), n, SamplingParams(0.0))])["r"].out
    return bytes(out).decode("utf-8", errors="replace")


# the engine on these meshes and the HTTP server with real clients run in the fast suite on both
# lines (test_tp_decode, test_ep_decode, test_replicas, test_server): this whole run on the first
@pytest.mark.first_line
@pytest.mark.parametrize(
    ("model", "mesh", "banner"),
    [
        # two replicas of tensor-parallel decode
        ((), "dp=2,tp=2", "2 replicas, KV pool"),
        # an MoE checkpoint, expert-parallel decode: 2 of 4 experts per device (capacity-trained,
        # served dropless, as the one-device engine serves it)
        (("--experts", "4"), "ep=2", "KV pool"),
    ],
)
def test_serve_on_a_mesh_answers_the_openai_client_and_stops_on_ctrl_c(
    tmp_path, model, mesh, banner
):
    """The served checkpoint's greedy text on the mesh is the one-device engine's."""
    run = tmp_path / "run"
    _train(run, *model, "--layers", "1")
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jaxscale",
            "serve",
            "--ckpt-dir",
            str(run),
            "--port",
            str(port),
            *ENGINE,
            "--mesh",
            mesh,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(f"{base}/health").json()["status"] == "ok":
                    break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()[1]
                time.sleep(0.1)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="-", max_retries=0)
        want = _in_process(run / "checkpoints", "abc", 12)
        whole = client.completions.create(
            model="jaxscale", prompt="abc", max_tokens=12, temperature=0
        )
        assert whole.choices[0].text == want
        stream = client.completions.create(
            model="jaxscale", prompt="abc", max_tokens=12, temperature=0, stream=True
        )
        assert "".join(c.choices[0].text for c in stream) == want
        health = httpx.get(f"{base}/health").json()
        replicas = health.get("replicas", [health])  # one engine: its figures at the top
        n = 2 if mesh.startswith("dp=2") else 1
        assert len(replicas) == n and all(r["compiles"] > 0 for r in replicas)  # warmed up
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, err
    assert "Traceback" not in err and f"on http://127.0.0.1:{port}/v1" in err
    assert banner in err


def test_serve_refuses_a_missing_checkpoint_before_listening(tmp_path, capsys):
    rc = cli_main(["serve", "--ckpt-dir", str(tmp_path / "nothing"), "--port", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "jaxscale serve: error:" in err and "nothing" in err


@pytest.mark.first_line  # signal handling is the process's, not the jax line's
@pytest.mark.parametrize("signals", [("SIGTERM",), ("SIGINT", "SIGINT")])
def test_serve_stops_cleanly_on_sigterm_and_on_ctrl_c_twice(signals):
    """A random tiny model served; once /health answers, a request is left half sent (its body
    never ends), so the graceful shutdown waits on it. SIGTERM (a service manager's stop) then ends
    the process with exit 0 once the server is down (the request cut); Ctrl-C twice (the second
    while the shutdown waits) with 130 at once. Within 30 s, no traceback (uvicorn's own forced
    exit cancelled the app's lifespan and logged its CancelledError), and the port is free again."""
    proc, port = _serving()
    try:
        with socket.create_connection(("127.0.0.1", port)) as open_request:
            open_request.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b"\r\nContent-Length: 100\r\n\r\n{"
            )
            time.sleep(0.5)  # the request is in the app, waiting for the rest of its body
            proc.send_signal(getattr(signal, signals[0]))
            if len(signals) == 2:
                _wait_until_refused(port)  # the server is shutting down, waiting on the request
                proc.send_signal(getattr(signal, signals[1]))
            else:
                _wait_until_refused(port)
                open_request.close()  # the client gives up: the shutdown goes on
            _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == (0 if len(signals) == 1 else 130), err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # the server let its port go


def _serving(*flags):
    """(process, port) of `jaxscale serve` on a random tiny model with ENGINE and `flags`, once
    its /health answers (the process is the caller's to stop)."""
    port = _free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    argv = [sys.executable, "-m", "jaxscale", "serve", "--port", str(port), *ENGINE, *flags]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    proc = subprocess.Popen(argv, env=env, text=True, **pipes)
    for _ in range(1200):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc, port
        except httpx.TransportError:
            if proc.poll() is not None:
                raise AssertionError(proc.communicate()[1]) from None
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("jaxscale serve did not answer /health in 120 s")


def _wait_until_refused(port: int) -> None:
    """Until the server has closed its listening socket (its shutdown has begun), up to 30 s."""
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return
        time.sleep(0.1)
    raise AssertionError(f"port {port} still accepting 30 s after the signal")


@pytest.mark.first_line  # the window is the engine thread's, not the jax line's
def test_serve_profile_traces_the_first_busy_engine_steps(tmp_path):
    """--profile DIR --profile-steps 3: after the first busy engine step, three steps (every
    program: prefills and decodes) are traced; profile.json and a trace appear while the server
    keeps serving, and the split is printed."""
    proc, port = _serving("--profile", str(tmp_path / "p"), "--profile-steps", "3")
    try:
        body = {"model": "jaxscale", "prompt": "hello", "max_tokens": 8, "temperature": 0}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200  # eight tokens: more engine steps than the window
        for _ in range(300):
            if (tmp_path / "p" / "profile.json").exists():
                break
            time.sleep(0.1)
        again = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60)
        assert again.json()["choices"][0]["text"] == answer.json()["choices"][0]["text"]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    saved = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert saved["steps"] == 3 and saved["devices"] == 1 and saved["compute_s"] > 0
    assert "profile: per engine step (mean of 1 device, 3 engine steps)" in err, err[-2000:]
    assert list((tmp_path / "p").rglob("*.xplane.pb"))


@pytest.mark.first_line  # the speculative engine runs in the fast suite on both lines
def test_serve_with_a_draft_answers_with_the_targets_greedy_text_and_exports_acceptance(
    tmp_path,
):
    """`serve --draft-ckpt D --speculative-tokens 3`: a 2-layer target with a 1-layer draft
    trained beside it. The greedy completion is the target's own (the engine without a draft, in
    process), and /metrics counts the rounds' drafts, acceptances and passes (3 drafts a pass)."""
    from prometheus_client.parser import text_string_to_metric_families

    _train(tmp_path / "t", "--layers", "2")
    _train(tmp_path / "d", "--layers", "1")
    draft = ("--draft-ckpt", str(tmp_path / "d"), "--speculative-tokens", "3")
    proc, port = _serving("--ckpt-dir", str(tmp_path / "t"), *draft)
    try:
        base = f"http://127.0.0.1:{port}"
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="-", max_retries=0)
        got = client.completions.create(
            model="jaxscale", prompt="abc", max_tokens=12, temperature=0
        )
        assert got.choices[0].text == _in_process(tmp_path / "t" / "checkpoints", "abc", 12)
        families = text_string_to_metric_families(httpx.get(f"{base}/metrics").text)
        spec = {
            s.name: s.value
            for f in families
            for s in f.samples
            if s.name.startswith("jaxscale_spec_decode")
        }
        passes = spec["jaxscale_spec_decode_target_passes"]
        assert passes > 0 and spec["jaxscale_spec_decode_draft_tokens"] == 3 * passes
        assert 0 <= spec["jaxscale_spec_decode_accepted_tokens"] <= 3 * passes
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err


def test_a_draft_with_another_context_is_refused_in_one_line(tmp_path, capsys):
    _train(tmp_path / "t", "--layers", "1", "--max-seq", "64")
    _train(tmp_path / "d", "--layers", "1", "--max-seq", "32")
    argv = ["serve", "--ckpt-dir", str(tmp_path / "t"), "--draft-ckpt", str(tmp_path / "d")]
    rc = cli_main([*argv, "--port", str(_free_port())])
    err = capsys.readouterr().err
    assert rc == 2 and "the draft's context (32) is shorter than the target's (64)" in err
    rc = cli_main(["serve", "--speculative-tokens", "2", "--port", str(_free_port())])
    assert rc == 2 and "needs a draft model: --draft-ckpt DIR" in capsys.readouterr().err
