"""`moert serve -np N`: concurrent requests decoded together in one forward per step give the same greedy text as
one-at-a-time generation; a client that leaves frees its slot; /props and /metrics say how many slots worked."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

import serving  # noqa: E402
from serving import PROMPTS, running  # noqa: E402

from moert.loader import load  # noqa: E402
from moert.serve.server import Server  # noqa: E402
from moert.testing import gpt2_vocab_metadata, write_qwen3moe  # noqa: E402

N = 12
SLOTS = 4


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = write_qwen3moe(tmp_path_factory.mktemp("slots") / "m.gguf", n_layer=2, n_expert=4,
                          vocab=gpt2_vocab_metadata())
    model = load(path, context_size=256, gpu_layers=0)
    refs = {p: model.generate(p, N, temperature=0) for p in PROMPTS}        # one at a time, the model's own cache
    server = Server(model, name="m.gguf", queue_size=16, n_parallel=SLOTS)
    with running(server) as url:
        yield url, refs, server
    server.close()
    model.close()


def client(url: str):
    return serving.client(url, timeout=120)


def metric(h, name: str) -> float:
    text = h.get("/metrics").text
    return float(next(ln.split()[1] for ln in text.splitlines() if ln.startswith(f"llamacpp:{name} ")))


def test_concurrent_requests_in_slots_equal_one_at_a_time_greedy(served):
    url, refs, server = served
    with httpx.Client(base_url=url, timeout=60) as h:
        steps0, busy0 = metric(h, "n_decode_total"), metric(h, "n_busy_slots_per_decode")

    def ask(p):
        stream = PROMPTS.index(p) % 2 == 1
        r = client(url).completions.create(model="m", prompt=p, max_tokens=N, temperature=0, stream=stream)
        return "".join(ch.choices[0].text for ch in r) if stream else r.choices[0].text

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, PROMPTS))
    assert answers == [refs[p] for p in PROMPTS]
    with httpx.Client(base_url=url, timeout=60) as h:
        steps = metric(h, "n_decode_total") - steps0
        assert h.get("/props").json()["total_slots"] == SLOTS
        assert h.get("/props").json()["default_generation_settings"]["n_ctx"] == 256 // SLOTS
        # 8 requests of 12 tokens (13 forwards each alone): together, fewer forwards, several slots in each
        assert steps < 8 * (N + 1) and metric(h, "n_busy_slots_per_decode") > max(busy0, 1.0)


def test_a_prompt_longer_than_a_slot_is_400(served):
    url, _, _ = served
    with httpx.Client(base_url=url, timeout=60) as h:
        r = h.post("/v1/completions", json={"prompt": list(range(1, 70)), "max_tokens": 2})
    assert r.status_code == 400 and f"the context holds {256 // SLOTS}" in r.json()["error"]["message"]


def test_a_client_leaving_frees_its_slot_and_the_others_go_on(served):
    url, refs, server = served
    before = server.counts["cancelled"]
    with httpx.Client(base_url=url, timeout=60) as h:
        with h.stream("POST", "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 40, "temperature": 0,
                                                       "stream": True}) as r:
            assert next(line for line in r.iter_lines() if line.startswith("data: "))
        for _ in range(600):
            if server.counts["cancelled"] > before and not server.busy:
                break
            time.sleep(0.05)
        assert server.counts["cancelled"] == before + 1 and server.processing == 0
        r = h.post("/v1/completions", json={"prompt": PROMPTS[3], "max_tokens": N, "temperature": 0}).json()
        assert r["choices"][0]["text"] == refs[PROMPTS[3]]


def test_too_many_slots_for_the_context_is_an_error(served):
    from moert.errors import MoertError

    _, _, server = served
    with pytest.raises(MoertError, match="-np 32 divides the context of 256 into slots of 8 tokens"):
        Server(server.model, name="m", n_parallel=32)


def test_a_resent_prefix_goes_to_the_slot_that_holds_it(served):
    """A chat resends its history: with several slots, the request goes to the slot whose context holds the
    longest prefix of it (as llama-server picks), so only the new part runs."""
    url, _, _ = served
    with httpx.Client(base_url=url, timeout=60) as h:
        for p in PROMPTS[4:7]:                                   # other slots hold other prompts
            h.post("/completion", json={"prompt": p, "n_predict": 2, "temperature": 0})
        first = h.post("/completion", json={"prompt": PROMPTS[7], "n_predict": 4, "temperature": 0}).json()
        h.post("/completion", json={"prompt": PROMPTS[5], "n_predict": 2, "temperature": 0})
        again = h.post("/completion", json={"prompt": PROMPTS[7] + first["content"] + " and then",
                                             "n_predict": 4, "temperature": 0}).json()
    assert "tokens_cached" in again and "tokens_cached" in first, (first, again)
    assert again["tokens_cached"] >= first["tokens_evaluated"] - 1 > 0
