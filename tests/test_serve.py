"""`moert serve` against OpenAI's own client, on the loopback: answers, streaming, queueing, cancelling, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from serving import PROMPTS, client, running  # noqa: E402

from moert.loader import load  # noqa: E402
from moert.serve.server import Server  # noqa: E402
from moert.testing import gpt2_vocab_metadata, write_qwen3moe  # noqa: E402

N = 12
CHAT = [{"role": "user", "content": "What is MoE?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server in this process on 127.0.0.1 (a free port), with greedy references computed before it starts."""
    path = write_qwen3moe(tmp_path_factory.mktemp("serve") / "m.gguf", n_layer=2, n_expert=4,
                          vocab=gpt2_vocab_metadata())
    model = load(path, context_size=256, gpu_backend="sim", cpu_moe=True)
    refs = {p: model.generate(p, N, temperature=0) for p in PROMPTS}
    refs["chat"] = model.chat(CHAT, N, temperature=0, template="chatml")
    server = Server(model, name="m.gguf", queue_size=8, chat_template="chatml", max_body=1 << 20)
    server.log = []
    with running(server, log=server.log.append) as url:
        yield url, refs, server, path
    server.close()
    model.close()


def test_completions_streaming_and_not_equal_generate(served):
    url, refs, _, _ = served
    c = client(url)
    p = PROMPTS[0]
    r = c.completions.create(model="m.gguf", prompt=p, max_tokens=N, temperature=0)
    assert r.choices[0].text == refs[p] and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == N
    pieces = [ch.choices[0].text for ch in c.completions.create(model="m.gguf", prompt=p, max_tokens=N,
                                                               temperature=0, stream=True)]
    assert "".join(pieces) == refs[p] and len(pieces) > 1


def test_chat_streaming_and_not(served):
    url, refs, _, _ = served
    c = client(url)
    r = c.chat.completions.create(model="m.gguf", messages=CHAT, max_tokens=N, temperature=0)
    assert r.choices[0].message.content == refs["chat"] and r.choices[0].message.role == "assistant"
    chunks = list(c.chat.completions.create(model="m.gguf", messages=CHAT, max_tokens=N, temperature=0,
                                            stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == refs["chat"]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_eight_concurrent_clients_each_get_their_answer(served):
    url, refs, _, _ = served

    def ask(p):
        return client(url).completions.create(model="m.gguf", prompt=p, max_tokens=N, temperature=0,
                                              stream=PROMPTS.index(p) % 2 == 1)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, PROMPTS))
    for p, a in zip(PROMPTS, answers):
        text = a.choices[0].text if hasattr(a, "choices") else "".join(ch.choices[0].text for ch in a)
        assert text == refs[p], p


def test_models_health_stats_placement_and_llama_endpoints(served):
    url, refs, _, _ = served
    assert [m.id for m in client(url).models.list().data] == ["m.gguf"]
    with httpx.Client(base_url=url, timeout=30) as h:
        assert h.get("/health").json()["status"] == "ok"
        stats = h.get("/stats").json()
        assert stats["tokens"] > 0 and len(stats["expert_counts"]) == 2
        assert h.get("/placement").json()["gpu_backend"] == "sim"
        r = h.post("/completion", json={"prompt": PROMPTS[1], "n_predict": N, "temperature": 0}).json()
        assert r["content"] == refs[PROMPTS[1]] and r["tokens_predicted"] == N and r["stop"] is True
        ids = h.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
        assert h.post("/detokenize", json={"tokens": ids}).json()["content"] == "Hello world"
        r = h.get("/trace")
        assert r.status_code == 400 and "start the server with moert serve ... --trace" in r.text


def test_trace_endpoint(served):
    url, refs, server, _ = served
    server.model.trace_start()
    try:
        with httpx.Client(base_url=url, timeout=30) as h:
            r = h.post("/completion", json={"prompt": PROMPTS[2], "n_predict": N, "temperature": 0}).json()
            assert r["content"] == refs[PROMPTS[2]]
            t = h.get("/trace", params={"last": 3}).json()
        assert t["tokens"] >= N and len(t["counts"]) == 2 and len(t["last"]["ids"]) == 3
        assert len(t["last"]["ids"][0]) == 2 and len(t["last"]["ids"][0][0]) == server.model.config.n_expert_used
        assert sum(map(sum, t["counts"])) == t["tokens"] * 2 * server.model.config.n_expert_used
    finally:
        server.model.trace_stop()


def _wait(predicate, what: str, seconds: float = 30.0):
    for _ in range(int(seconds / 0.05)):
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_client_leaving_mid_stream_frees_the_model(served):
    url, refs, server, _ = served
    before = dict(server.counts)
    with httpx.Client(base_url=url, timeout=30) as h:
        with h.stream("POST", "/v1/completions", json={"prompt": PROMPTS[2], "max_tokens": 200, "temperature": 0,
                                                       "stream": True}) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))   # it started; now leave
        _wait(lambda: server.counts["cancelled"] == before["cancelled"] + 1 and not server.busy, "the cancel")
        assert server.counts["served"] == before["served"]
        r = h.post("/v1/completions", json={"prompt": PROMPTS[3], "max_tokens": N, "temperature": 0}).json()
        assert r["choices"][0]["text"] == refs[PROMPTS[3]]


@pytest.mark.parametrize("path, body, says", [
    ("/v1/completions", b"{not json", "not valid JSON"),
    ("/v1/completions", b"[1, 2]", "must be a JSON object"),
    ("/v1/completions", {"prompt": ""}, "'prompt'"),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "'temperature' = 'hot'"),
    ("/v1/completions", {"prompt": "x", "n": 2}, "'n' must be 1"),
    ("/v1/completions", {"prompt": "x", "top_p": 7}, "top_p"),
    ("/v1/completions", {"prompt": "x", "stop": [""]}, "'stop'"),
    ("/v1/completions", {"prompt": [99999]}, "out of range"),
    ("/v1/completions", {"prompt": "word " * 400}, "the context holds 256"),
    ("/v1/chat/completions", {"messages": "hi"}, "'messages'"),
    ("/detokenize", {"tokens": [-1]}, "out of range"),
])
def test_malformed_requests_are_400_with_a_reason(served, path, body, says):
    url, _, _, _ = served
    with httpx.Client(base_url=url, timeout=30) as h:
        r = h.post(path, content=body) if isinstance(body, bytes) else h.post(path, json=body)
        assert r.status_code == 400, r.text
        assert says in r.json()["error"]["message"]
        assert h.get("/health").json()["status"] == "ok"            # and the server is still there


def test_full_queue_is_503_and_the_rest_complete(served, monkeypatch):
    url, refs, server, _ = served
    rejected = server.counts["rejected"]
    # The worker's first job is held until all 14 requests are in, so the outcome does not depend on how fast
    # a generation is (a quick one freed a slot while the others still arrived: 10 served, not 9).
    gate, generate = threading.Event(), server._generate

    def held(job):
        gate.wait(60)
        return generate(job)

    monkeypatch.setattr(server, "_generate", held)

    def ask(i):
        with httpx.Client(base_url=url, timeout=60) as h:
            return h.post("/v1/completions", json={"prompt": PROMPTS[i % 8], "max_tokens": 24, "temperature": 0})

    with ThreadPoolExecutor(14) as pool:
        futures = [pool.submit(ask, i) for i in range(14)]
        for _ in range(3000):                                           # 1 held + 8 waiting; 5 refused
            if server.counts["rejected"] - rejected >= 5 or all(f.done() for f in futures):
                break
            time.sleep(0.01)
        gate.set()
        rs = [f.result() for f in futures]
    codes = [r.status_code for r in rs]
    assert codes.count(200) == 9 and codes.count(503) == 5, codes       # 1 running + 8 waiting, the rest 503
    assert "--queue 8" in next(r for r in rs if r.status_code == 503).json()["error"]["message"]
    assert server.counts["rejected"] == rejected + codes.count(503)


def test_moert_serve_command_answers_as_moert_run(served):
    """The console command, in a subprocess: the same greedy text as `moert run`, both with one expert per token
    by --override-kv (run's parser, shared), which changes the text; serve takes --jinja as llama-server."""
    _, _, _, path = served
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    one = ["--override-kv", "qwen3moe.expert_used_count=int:1,general.name=str:one, expert"]
    run, two = (subprocess.run([sys.executable, "-m", "moert", "run", str(path), "-p", PROMPTS[4], "-n", str(N),
                                "--temp", "0", "-c", "256", "--no-display-prompt", *flags], capture_output=True,
                               text=True, timeout=300, env=env) for flags in (one, []))
    assert run.returncode == two.returncode == 0, run.stderr
    assert run.stdout != two.stdout                                       # the override changed the model
    proc = subprocess.Popen([sys.executable, "-m", "moert", "serve", str(path), "--port", "0", "-c", "256",
                             "--temp", "0", "-n", str(N), "--jinja", *one], stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        line = ""
        for _ in range(200):                       # bounded: the banner comes once the model is loaded
            line = proc.stderr.readline()
            if "on http://" in line or not line:
                break
        assert "on http://127.0.0.1:" in line, line
        url = line.split("on ")[1].split()[0]
        with httpx.Client(base_url=url, timeout=60) as h:
            r = h.post("/completion", json={"prompt": PROMPTS[4]})           # -n and --temp are the defaults
            assert r.status_code == 200 and r.json()["content"] == run.stdout.rstrip("\n")
            assert json.loads(h.get("/health").text)["served"] == 1
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_resent_prefix_is_not_recomputed(served):
    """A chat resends its history: the part still in the KV cache is reused (tokens_cached), as Model.stream does."""
    url, _, _, _ = served
    with httpx.Client(base_url=url, timeout=60) as h:
        first = h.post("/completion", json={"prompt": PROMPTS[5], "n_predict": 4, "temperature": 0}).json()
        again = h.post("/completion", json={"prompt": PROMPTS[5] + first["content"] + " and then",
                                             "n_predict": 4, "temperature": 0}).json()
        assert again["tokens_cached"] >= first["tokens_evaluated"] - 1 > 0
        assert again["timings"]["prompt_n"] == again["tokens_evaluated"] - again["tokens_cached"]

