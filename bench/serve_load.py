"""A bounded load test of `moert serve` on the demo model: requests/s, tokens/s and latency percentiles.

    python bench/serve_load.py [--clients 1,4,8] [--requests 32] [--max-tokens 32] [--stream] [--threads N]

Starts `moert serve` on the demo model (`moert demo` writes it) in a subprocess on 127.0.0.1 (a free
port), then for each client count sends `--requests` greedy /v1/completions requests (distinct prompts,
`--max-tokens` each) from that many concurrent clients and reports requests/s, generated tokens/s,
latency p50/p90/p99 and, with --stream, the time to the first text (a random-weight model often starts
with partial UTF-8 bytes, held back until they decode, so that can be a few tokens in). The server runs
one request at a time, so more clients raise latency (they queue) but not throughput. Bounded: every
request has a timeout and the server is stopped at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import httpx  # noqa: E402

from moert.demo import demo_model_path  # noqa: E402

WORDS = "the a of to and in model expert layer token place GPU CPU memory cache route".split()


def prompt(i: int) -> str:
    """Distinct prompts of 8-16 words, so the cached prefix is short, as between different users."""
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(8 + i % 9))


def start_server(threads: int | None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "moert", "serve", str(demo_model_path()), "--port", "0", "-c", "512",
           "--queue", "64", "--temp", "0", "-ngl", "0"] + (["-t", str(threads)] if threads
                                                                                   else [])
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for _ in range(400):
        line = proc.stderr.readline()
        if "on http://" in line or not line:
            break
    if "on http://" not in line:
        proc.kill()
        raise SystemExit(f"moert serve did not start: {line}")
    return proc, line.split("on ")[1].split()[0]


def one(url: str, i: int, max_tokens: int, stream: bool) -> tuple[float, float | None, int]:
    """(latency s, time to first token s or None, completion tokens) of one request."""
    body = {"prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    t0 = time.perf_counter()
    with httpx.Client(base_url=url, timeout=120) as h:
        if not stream:
            r = h.post("/v1/completions", json=body)
            r.raise_for_status()
            return time.perf_counter() - t0, None, r.json()["usage"]["completion_tokens"]
        first, n = None, 0
        with h.stream("POST", "/v1/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: {") and '"text": ""' not in line:
                    first = first or time.perf_counter() - t0
                if '"usage"' in line:
                    import json

                    n = json.loads(line[6:])["usage"]["completion_tokens"]
        return time.perf_counter() - t0, first, n


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def run(url: str, clients: int, requests: int, max_tokens: int, stream: bool) -> list:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        res = list(pool.map(lambda i: one(url, i, max_tokens, stream), range(requests)))
    wall = time.perf_counter() - t0
    lat = [r[0] * 1e3 for r in res]
    toks = sum(r[2] for r in res)
    row = [clients, requests, requests / wall, toks / wall, statistics.median(lat), pct(lat, 90), pct(lat, 99)]
    if stream:
        row.append(statistics.median(r[1] * 1e3 for r in res if r[1] is not None))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="1,4,8", help="concurrent clients, comma-separated (default: 1,4,8)")
    ap.add_argument("--requests", type=int, default=32, help="requests per client count (default: 32)")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per request (default: 32)")
    ap.add_argument("--stream", action="store_true", help="stream (SSE) and report the time to the first text")
    ap.add_argument("--threads", type=int, default=None, help="the server's -t (default: its own)")
    a = ap.parse_args()
    proc, url = start_server(a.threads)
    try:
        m = common.machine(a.threads, with_bandwidth=False)
        one(url, 999, 4, False)                       # warm the path once, untimed
        rows = [run(url, int(c), a.requests, a.max_tokens, a.stream) for c in a.clients.split(",")]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(f"machine: {common.machine_line(m)}")
    print(f"server:  moert serve {demo_model_path().name} -ngl 0 -c 512 --temp 0 (every tensor on the CPU); "
          f"{a.requests} requests of {a.max_tokens} tokens per row, distinct prompts of 8-16 words, "
          f"{'streaming' if a.stream else 'not streaming'}")
    print(f"command: python bench/serve_load.py {' '.join(sys.argv[1:])}\n")
    head = ["clients", "requests", "requests/s", "tokens/s", "p50 ms", "p90 ms", "p99 ms"]
    print(common.table(head + (["first text p50 ms"] if a.stream else []), rows))


if __name__ == "__main__":
    main()
