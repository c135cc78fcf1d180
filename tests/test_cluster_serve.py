"""moert serve with experts on Ray workers (moert/serve/idle.py): an idle server releases the workers' compiled
graph (they stop polling), the next request compiles it again and gives the same tokens, with -np slots and
requests at once; a worker's death is reported once, without Ray's own traceback (cluster_graph._LossReported).
On the pytest session's real local Ray cluster (conftest's ray_cluster)."""

from __future__ import annotations

import argparse
import logging
import threading
import time
import warnings

import pytest
from bench_scripts import bench_module

import moert
from moert.errors import MoertError
from moert.text.generate import SamplingParams, generate_ids

GREEDY = SamplingParams(temperature=0)
RULES = r"blk\.0\.ffn_.*_exps=RAY0"
ASK = {"prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0}


def load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return moert.load(path, context_size=64, progress=False, gpu_layers=0, **kw)


def cpu_share(pid: int, seconds: float) -> float:
    """The share of one core the process used over `seconds`: bench/bench_cluster_idle.py's measure."""
    return bench_module("bench_cluster_idle").cpu_share(pid, seconds)


def wait_until(check, seconds: float = 20.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if check():
            return True
        time.sleep(0.02)
    return False


def test_the_idle_flag_is_checked():
    from moert.cli.serve import _idle_seconds

    assert _idle_seconds("0") == 0 and _idle_seconds("2.5") == 2.5 and _idle_seconds("-1") == -1
    for bad in ("-3", "soon", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="seconds >= 0, or -1"):
            _idle_seconds(bad)


def test_an_idle_server_releases_the_graph_and_the_next_request_compiles_it_again(ray_cluster, tmp_path):
    testclient = pytest.importorskip("fastapi.testclient")
    from moert.serve.app import create_app
    from moert.serve.server import Server
    from moert.testing import gpt2_vocab_metadata, write_qwen3moe

    path = write_qwen3moe(tmp_path / "v.gguf", n_layer=2, n_expert=4, vocab=gpt2_vocab_metadata())
    cpu = load(path)
    want = cpu.detokenize(generate_ids(cpu, ASK["prompt"], ASK["max_tokens"], GREEDY))
    m = load(path, overrides=RULES, ray="local:1")
    with pytest.raises(MoertError, match="--ray-idle-seconds must be >= 0"):
        Server(m, name="m", ray_idle_s=-2)
    g, pid = m.plan.remote[0].group, m.plan.remote[0].pid
    server = Server(m, name="m", queue_size=8, n_parallel=2, ray_idle_s=0.3)
    try:
        assert server.idle.graphs == [g] and g.dag is not None        # moert.load's warm-up compiled it
        with testclient.TestClient(create_app(server)) as c:
            first = c.post("/v1/completions", json=ASK)
            assert first.status_code == 200 and first.json()["choices"][0]["text"] == want
            assert wait_until(lambda: server.idle.releases >= 1), "not released when idle"   # (torn down)
            assert g.releases >= 1 and g.dag is None
            assert cpu_share(pid, 0.5) < 0.1            # a released worker sleeps (polling: ~0.3 of a core)
            compiles = g.compiles
            again = c.post("/v1/completions", json=ASK)
            assert again.json()["choices"][0]["text"] == want and g.compiles == compiles + 1
            # requests at once on both slots, released whenever none runs (0 s): never while one runs, same tokens
            server.idle.seconds = 0
            texts: list[str] = []
            asks = [threading.Thread(target=lambda: texts.append(
                c.post("/v1/completions", json=ASK).json()["choices"][0]["text"])) for _ in range(4)]
            for t in asks:
                t.start()
            for t in asks:
                t.join()
            assert texts == [want] * 4 and g.broken is None and g.off is None
            assert wait_until(lambda: server.idle.released) and g.releases == g.compiles   # each compile released
    finally:
        server.close()
        m.close()


def test_a_dead_worker_s_graph_teardown_is_not_logged_by_ray(ray_cluster):
    """Ray's monitor thread logs a dead actor's cancel as an exception (a traceback); moert reports the loss."""
    from moert.cluster.graph import _LOSS_REPORTED

    log = logging.getLogger("ray.dag.compiled_dag_node")
    dead = ray_cluster.exceptions.ActorDiedError()

    def record(level, exc):
        info = (type(exc), exc, None) if exc is not None else None
        return log.makeRecord(log.name, level, __file__, 1, "Error cancelling worker task", (), info)

    assert not _LOSS_REPORTED.filter(record(logging.ERROR, dead))
    assert not _LOSS_REPORTED.filter(record(logging.INFO, None))        # "Tearing down compiled DAG", ...
    assert _LOSS_REPORTED.filter(record(logging.ERROR, ValueError("a real bug")))
    assert _LOSS_REPORTED.filter(record(logging.WARNING, None))      # "... still running after teardown()"
