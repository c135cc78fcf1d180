"""A bounded load test of `moert serve`: aggregate tokens/s at 1, 2, 4, 8 concurrent clients, one slot (-np 1,
requests one after another) against as many slots as clients (-np N: their tokens decoded together, one forward
per step), and latency percentiles.

    python bench/serve_load.py [--clients 1,2,4,8] [--requests 4] [--max-tokens 32] [--threads N] [--model PATH]
                               [--stream] [-c 2048] [--llama-server PATH]

For each client count N it starts `moert serve` in a subprocess on 127.0.0.1 (a free port) twice, with -np 1 and
with -np N, and sends `--requests` x N greedy /v1/completions requests (distinct prompts of 8-16 words,
`--max-tokens` each) from N concurrent clients. It reports requests/s, generated tokens/s (all clients
together), latency p50/p90, and from the server's /metrics the mean number of slots per forward
(llamacpp:n_busy_slots_per_decode). The default model is a synthetic qwen3moe written here (64 experts, 8
used per token, D 1024, experts of 512, Q8_0, random weights, 450 MB, a 2048-token context, so 8 slots of 256
tokens): one decoded token reads 8 of 64 experts per layer (53 MB in 4 layers); N sequences' tokens read each
expert any of them chose once, 64 x (1 - (56/64)^N) of them with random routing: 15 for 2, 28 for 4, 43 for 8. --model
takes any GGUF with a vocabulary (moert's demo model has a 256-token context: -np 8 leaves 32 tokens a slot).
Bounded: every request has a timeout and every server is stopped, whatever happens.

--llama-server PATH (a llama-server binary; llama-cpp-python's own server has no parallel slots) adds the same
rows for llama.cpp's server, started the same way on the same GGUF: `llama-server -m MODEL -c CTX -np N -t T
-tb T --metrics` (its KV cache f16 and -fa auto, as moert's defaults; -c divided among the slots, as moert's),
so both servers are measured in one run, one after the other, under the same load. The last column is moert's
tokens/s over llama-server's at the same clients and -np.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import httpx  # noqa: E402

WORDS = "the a of to and in model expert layer token place GPU CPU memory cache route".split()


def prompt(i: int) -> str:
    """Distinct prompts of 8-16 words, so the cached prefix is short, as between different users."""
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(8 + i % 9))


def synthetic_model(folder: Path) -> Path:
    """A qwen3moe with many small experts and a long context (random weights, a trained byte-level vocabulary)."""
    from moert.testing import gpt2_vocab_metadata, write_qwen3moe

    return write_qwen3moe(folder / "moe64.gguf", n_layer=4, n_embd=1024, n_head=8, n_head_kv=2, head_dim=128,
                          n_expert=64, n_expert_used=8, n_ff_exp=512, context_length=2048,
                          vocab=gpt2_vocab_metadata(2048))


def start_server(model: Path, ctx: int, slots: int, threads: int | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "moert", "serve", str(model), "--port", "0", "-c", str(ctx), "-np", str(slots),
           "--queue", "256", "--temp", "0", "-ngl", "0", "--metrics"] + (["-t", str(threads)] if threads else [])
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    line = ""
    for _ in range(400):
        line = proc.stderr.readline()
        if "on http://" in line or not line:
            break
    if "on http://" not in line:
        proc.kill()
        raise SystemExit(f"moert serve did not start: {line}")
    return proc, line.split("on ")[1].split()[0]


def start_llama_server(binary: str, model: Path, ctx: int, slots: int, threads: int | None
                       ) -> tuple[subprocess.Popen, str]:
    """llama-server on a free loopback port, once its /health answers 200 (the model loaded)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(ctx), "-np", str(slots),
           "-ngl", "0", "--metrics"] + (["-t", str(threads), "-tb", str(threads)] if threads else [])
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):                                 # bounded: 120 s to load
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"llama-server exited ({proc.returncode}): {log.read()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop(proc)
    raise SystemExit("llama-server did not answer /health within 120 s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def one(url: str, i: int, max_tokens: int, stream: bool) -> tuple[float, int]:
    """(latency s, completion tokens) of one request."""
    body = {"prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    t0 = time.perf_counter()
    with httpx.Client(base_url=url, timeout=300) as h:
        if not stream:
            r = h.post("/v1/completions", json=body)
            r.raise_for_status()
            return time.perf_counter() - t0, r.json()["usage"]["completion_tokens"]
        n = 0
        with h.stream("POST", "/v1/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if '"usage"' in line:
                    n = json.loads(line[6:])["usage"]["completion_tokens"]
        return time.perf_counter() - t0, n


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return float(next(ln.split()[1] for ln in text.splitlines() if ln.startswith(f"llamacpp:{name} ")))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def row(model: Path, ctx: int, clients: int, slots: int, per_client: int, max_tokens: int, stream: bool,
        threads: int | None, llama_server: str | None = None) -> list:
    """One table row: moert serve (or, given its binary, llama-server) with `slots` slots, `clients` clients."""
    proc, url = (start_llama_server(llama_server, model, ctx, slots, threads) if llama_server else
                 start_server(model, ctx, slots, threads))
    try:
        one(url, 999, 4, False)                       # warm the path once, untimed
        steps0, busy0 = metric(url, "n_decode_total"), metric(url, "n_busy_slots_per_decode")
        n = per_client * clients
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            res = list(pool.map(lambda i: one(url, i, max_tokens, stream), range(n)))
        wall = time.perf_counter() - t0
        steps = metric(url, "n_decode_total")
        busy = (metric(url, "n_busy_slots_per_decode") * steps - busy0 * steps0) / max(steps - steps0, 1)
    finally:
        stop(proc)
    lat = [r[0] * 1e3 for r in res]
    toks = sum(r[1] for r in res)
    return ["llama-server" if llama_server else "moert", clients, slots, n, round(n / wall, 2), round(toks / wall, 1),
            round(statistics.median(lat)), round(pct(lat, 90)), round(busy, 2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="1,2,4,8", help="concurrent clients, comma-separated (default: 1,2,4,8)")
    ap.add_argument("--requests", type=int, default=4, help="requests per client (default: 4)")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per request (default: 32)")
    ap.add_argument("--stream", action="store_true", help="stream (SSE)")
    ap.add_argument("--threads", type=int, default=None, help="the server's -t (default: its own)")
    ap.add_argument("--model", type=Path, default=None, help="a GGUF (default: the synthetic 64-expert qwen3moe)")
    ap.add_argument("-c", "--ctx", type=int, default=2048, help="the server's -c, divided among the slots "
                    "(default: 2048)")
    ap.add_argument("--llama-server", default=None, metavar="PATH", help="a llama-server binary: measure it too, "
                    "same model, -c, -np and -t, in the same run")
    a = ap.parse_args()
    clients = [int(c) for c in a.clients.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model or synthetic_model(Path(tmp))
        m = common.machine(a.threads, with_bandwidth=False)
        rows = []
        for c in clients:
            for slots in sorted({1, c}):
                for server in [None] + ([a.llama_server] if a.llama_server else []):   # side by side
                    rows.append(row(model, a.ctx, c, slots, a.requests, a.max_tokens, a.stream, a.threads, server))
        for r in rows:                                # tokens/s against -np 1, same server and number of clients
            base = next(b for b in rows if b[:2] == r[:2] and b[2] == 1)
            other = next((b for b in rows if b[0] != r[0] and b[1:3] == r[1:3]), None)
            r.append(f"{r[5] / base[5]:.2f}x")
            if a.llama_server:
                r.append(f"{r[5] / other[5]:.2f}x" if other and r[0] == "moert" else "")
    what = (f"{model.name}" if a.model else "a synthetic qwen3moe (4 layers, D 1024, 64 experts of 512, 8 used, "
            "Q8_0, random weights, vocabulary 2048)")
    print(f"machine: {common.machine_line(m)}")
    print(f"server:  moert serve {what} -ngl 0 -c {a.ctx} -np N --temp 0 (every tensor on the CPU)"
          + (f"; llama-server -m MODEL -c {a.ctx} -np N -ngl 0 --metrics" if a.llama_server else "") + "; "
          f"{a.requests} requests per client of {a.max_tokens} tokens, distinct prompts of 8-16 words, "
          f"{'streaming' if a.stream else 'not streaming'}")
    print(f"command: python bench/serve_load.py {' '.join(sys.argv[1:])}\n")
    head = ["server", "clients", "-np", "requests", "requests/s", "tokens/s", "p50 ms", "p90 ms", "slots/forward",
            "tokens/s vs -np 1"] + (["moert / llama-server"] if a.llama_server else [])
    print(common.table(head, rows))


if __name__ == "__main__":
    main()
