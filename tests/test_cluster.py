"""Experts on Ray workers (moert/cluster/actors.py), on a real local Ray cluster started once per pytest session
(conftest's ray_cluster): RAY<N> rules and expert sets, logits and routing equal to the all-CPU run on three
architectures (cpu / sim / ray mixes), the counters per remote device, errors before the first token, a killed or
hung worker (typed error in bounded time, or the CPU fallback with the same tokens)."""

from __future__ import annotations

import logging
import time
import warnings

import numpy as np
import pytest

import moert
from moert import gguf
from moert.cluster import connect, parse_address
from moert.cluster.worker import ExpertWorker, keyed, pack, unpack, unreply
from moert.devices.remote import RemoteDeviceError
from moert.errors import ArgumentError, PlacementError
from moert.placement.rules import parse_overrides
from moert.testing import write_qwen3moe, write_tiny
from moert.text.generate import SamplingParams, generate_ids

ARCHS = ("qwen3moe", "deepseek2", "gpt-oss")
PROMPT, MORE = [1, 5, 9, 3, 7, 2], [4, 6, 8]
GREEDY = SamplingParams(temperature=0)


def load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return moert.load(path, context_size=32, progress=False, **kw)


def rules_for(path) -> str:
    """Layer a's experts on ray:0, half of layer b's on ray:1 (the rest default: cpu or a sim GPU); with a single
    MoE layer, its experts split between ray:0, ray:1 and the default device."""
    g = gguf.open(path)
    moe = sorted({int(n.split(".")[1]) for n in g.tensors if n.endswith("ffn_gate_exps.weight")})
    E = g.tensors[f"blk.{moe[0]}.ffn_gate_exps.weight"].shape[0]
    if len(moe) >= 2:
        return rf"blk\.{moe[0]}\.ffn_.*_exps=RAY0,blk\.{moe[1]}\.ffn_.*_exps=RAY1@0-{E // 2 - 1}"
    return rf"blk\.{moe[0]}\.ffn_.*_exps=RAY0@0-1,blk\.{moe[0]}\.ffn_.*_exps=RAY1@2-{E // 2}"


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster")
    return {a: write_tiny(d / f"{a}.gguf", a, seed=7) for a in ARCHS}


def run(m):
    """Prefill logits, then decode logits one token at a time, and the routing trace."""
    m.trace_start()
    a = m.forward(PROMPT)
    b = np.concatenate([m.forward([t]) for t in MORE])
    return a, b, m.trace_stop()


def rel(x, y) -> float:
    return float(np.abs(x - y).max() / np.abs(y).max())


def kill(ray, dev) -> None:
    """Kill a worker's actor and wait until Ray says it is dead (ray.kill returns before the process is gone: a
    compiled graph's shared-memory step could still be answered by it meanwhile). Only ActorDiedError says so: its
    sibling ActorUnavailableError (also a RayActorError) means "temporarily unavailable", which a busy machine can
    answer while the process still runs, and the next step then still went through."""
    ray.kill(dev.actor)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 20:
        try:
            ray.get(dev.actor.ping.remote(), timeout=5)
        except ray.exceptions.ActorDiedError:
            return
        except ray.exceptions.RayActorError:         # unavailable for now: ask again
            pass
        time.sleep(0.05)
    raise AssertionError(f"{dev.name} still answers 20 s after ray.kill")


class Logged(logging.Handler):
    """The records a logger passes to its handlers (after its filters) from now until stop()."""

    def __init__(self, name: str):
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.log = logging.getLogger(name)
        self.log.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def stop(self) -> None:
        self.log.removeHandler(self)


# ------------------------------------------------------------------------------------------ no cluster needed

def test_ray_device_names_in_rules_and_plans(paths):
    r = parse_overrides(r"blk\.0\.ffn_.*_exps=RAY1@0-3,blk\.1\.ffn_.*_exps=ray:0,x=Ray2")
    assert [x.device for x in r] == ["ray:1", "ray:0", "ray:2"] and r[0].experts == (0, 1, 2, 3)
    assert str(r[0]) == r"blk\.0\.ffn_.*_exps=RAY1@0-3" and parse_overrides(",".join(map(str, r))) == r
    p = moert.plan(paths["qwen3moe"], r"blk\.0\.ffn_.*_exps=RAY1,blk\.1\.ffn_.*_exps=RAY0@0-3", gpu_layers=0)
    assert [d.name for d in p.remote] == ["ray:0", "ray:1"]
    g = gguf.open(paths["qwen3moe"])
    layer0 = sum(t.nbytes for n, t in g.tensors.items() if n.startswith("blk.0.ffn_") and "_exps" in n)
    assert p.bytes_by_device()["ray:1"] == layer0 and p.bytes_by_device()["ray:0"] == layer0 // 2
    assert p.expert_devices("blk.1.ffn_up_exps.weight") == ["ray:0"] * 4 + ["cpu"] * 4
    with pytest.raises(PlacementError, match="routed experts only"):
        moert.plan(paths["qwen3moe"], r"blk\.0\.attn=RAY0", gpu_layers=0)


def test_a_plan_with_ray_rules_needs_a_cluster_and_bad_addresses_are_clear(paths):
    with pytest.raises(RemoteDeviceError, match="no cluster was given.*local:2"):
        load(paths["qwen3moe"], overrides=r"blk\.0\.ffn_.*_exps=RAY1", gpu_layers=0)
    assert parse_address("local:3") == ("local", 3) and parse_address("10.0.0.2:6379") == ("address", "10.0.0.2:6379")
    for bad in ("local:0", "local:x", "10.0.0.2", "http://x:1", "host:99999"):
        with pytest.raises(ArgumentError):
            parse_address(bad)


def test_the_message_layout_round_trips():
    rng = np.random.default_rng(0)
    x, ids, w = rng.standard_normal((3, 8), np.float32), np.array([[1, -1], [0, 2], [-1, -1]]), rng.random((3, 2))
    x2, ids2, w2 = unpack(pack(x, ids, w))
    np.testing.assert_array_equal(x2, x)
    np.testing.assert_array_equal(ids2, ids)
    np.testing.assert_array_equal(w2, w.astype(np.float32))


def test_a_compiled_step_takes_its_layer_key_inside_one_bytes_object():
    # keyed: the key as little-endian int32, then the request as it is (a channel writes bytes raw)
    assert keyed(7, b"abc") == b"\x07\x00\x00\x00abc"
    w = ExpertWorker()
    w.layers[7], w.remap[7] = (lambda x, ids, wts: x * wts.sum(1, keepdims=True)), None     # a stand-in layer
    x, ids, wts = np.array([[1.0, -2.0, 3.0]], np.float32), np.array([[0, 1]]), np.array([[0.25, 0.5]])
    y, seconds = unreply(w.step(keyed(7, pack(x, ids, wts))), 1, 3)
    np.testing.assert_array_equal(y, [[0.75, -1.5, 2.25]])          # x x (0.25 + 0.5), by hand
    assert seconds >= 0.0
    assert w.step(b"") == b""                                       # a layer with nothing for this worker


# ------------------------------------------------------------------------------------------ on a local cluster

@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_routing_equal_all_cpu_on_any_mix(ray_cluster, paths, arch, monkeypatch):
    path = paths[arch]
    ref = run(load(path, gpu_layers=0))
    mixes = [("compiled", dict(gpu_layers="all", gpu_backend="sim"))]    # ray + sim (attention, the other experts)
    if arch == "qwen3moe":
        mixes.append(("plain", dict(gpu_layers=0)))                      # ray + cpu, plain actor calls
    monkeypatch.setenv("MOERT_RAY_CALLS", "compiled")                    # ray_calls= wins over the environment
    for calls, kw in mixes:
        m = load(path, overrides=rules_for(path), ray="local:2", ray_calls=calls, **kw)
        try:
            got = run(m)
            assert {d.name for d in m.plan.remote} == {"ray:0", "ray:1"}
            assert all(d.source == "file" for d in m.plan.remote)
            assert rel(got[0], ref[0]) < 1e-5 and rel(got[1], ref[1]) < 1e-5, kw
            np.testing.assert_array_equal(got[2].ids, ref[2].ids)
            assert all(d.remote.calls > 0 for d in m.plan.remote)
            group = m.plan.remote[0].group
            if calls == "plain":
                assert group is None
            else:                   # one graph for both workers, compiled once, every layer call through it
                assert group is m.plan.remote[1].group and group.compiles == 1 and group.off is None
                assert group.executions >= max(d.remote.calls for d in m.plan.remote)
        finally:
            m.close()


def test_a_graph_ray_cannot_compile_leaves_plain_calls(ray_cluster, paths, monkeypatch):
    from ray.dag.dag_node import DAGNode

    def refuse(self, *args, **kwargs):
        raise RuntimeError("no compiled graphs here")

    monkeypatch.setattr(DAGNode, "experimental_compile", refuse)
    path = paths["qwen3moe"]
    want = load(path, gpu_layers=0).forward(PROMPT)
    m = load(path, overrides=r"blk\.0\.ffn_.*_exps=RAY0", gpu_layers=0, ray="local:1")
    try:
        assert rel(m.forward(PROMPT), want) < 1e-5
        group = m.plan.remote[0].group
        assert "no compiled graphs here" in group.off and group.compiles == 0 and group.executions == 0
        assert m.stats.last.remote["ray:0"].calls == 1
    finally:
        m.close()


def test_ray_calls_setting_is_checked(monkeypatch):
    from moert.cluster.graph import enabled

    monkeypatch.setenv("MOERT_RAY_CALLS", "Plain")
    assert not enabled()
    monkeypatch.delenv("MOERT_RAY_CALLS")
    assert enabled()
    monkeypatch.setenv("MOERT_RAY_CALLS", "fast")
    with pytest.raises(ArgumentError, match="MOERT_RAY_CALLS='fast'.*compiled.*plain"):
        enabled()
    assert not enabled("plain") and enabled("compiled")                  # load's ray_calls= / --ray-calls first
    with pytest.raises(ArgumentError, match="ray_calls='fast'"):
        enabled("fast")


def test_counters_per_remote_device_and_a_worker_without_the_file(ray_cluster, paths, tmp_path):
    path = paths["qwen3moe"]
    ref = load(path, gpu_layers=0)
    a = ref.forward(PROMPT)
    m = load(path, overrides=r"blk\.0\.ffn_.*_exps=RAY0", gpu_layers=0, ray="local:1",
             ray_model=str(tmp_path / "not-there.gguf"))
    try:
        assert m.plan.remote[0].source == "sent"          # its experts' bytes came through the object store
        assert rel(m.forward(PROMPT), a) < 1e-5
        r = m.stats.last.remote["ray:0"]
        T, K, D = len(PROMPT), m.config.n_expert_used, m.config.n_embd
        assert r.calls == 1 and r.fallback_calls == 0
        assert r.sent_bytes == 12 + 4 * T * D + 8 * T * K and r.received_bytes == 4 * T * D + 8
        assert 0 < r.compute_s < r.round_trip_s
        m.forward([3])
        assert m.stats.total.remote["ray:0"].calls == 2 and m.stats.decode.remote["ray:0"].calls == 1
        assert m.stats.to_dict()["total"]["remote"]["ray:0"]["calls"] == 2
        assert "remote" in str(m.stats.total) and "ray:0" in str(m.stats.total)
    finally:
        m.close()


def test_too_few_workers_and_another_file_fail_before_the_first_token(ray_cluster, paths):
    with pytest.raises(RemoteDeviceError, match="ray:0 .. ray:2.*starts 2 worker"):
        load(paths["qwen3moe"], overrides=r"blk\.0\.ffn_.*_exps=RAY2", gpu_layers=0, ray="local:2")
    with pytest.raises(RemoteDeviceError, match="not the host's model"):
        load(paths["qwen3moe"], overrides=r"blk\.0\.ffn_.*_exps=RAY0", gpu_layers=0, ray="local:1",
             ray_model=str(paths["gpt-oss"]))


def test_unreachable_cluster_is_a_clear_error_in_seconds():
    import subprocess
    import sys

    code = "from moert.cluster import connect; connect('127.0.0.1:9', 1)"   # a process not yet in any cluster
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "RemoteDeviceError" in r.stderr and "cannot reach" in r.stderr
    assert time.perf_counter() - t0 < 30


def test_killed_worker_is_a_typed_error_and_the_fallback_finishes_with_the_same_tokens(ray_cluster, paths):
    path = paths["qwen3moe"]
    rules = r"blk\.1\.ffn_.*_exps=RAY0"
    want = generate_ids(load(path, gpu_layers=0), PROMPT, 6, GREEDY)
    m = load(path, overrides=rules, gpu_layers=0, ray="local:1")
    logged = Logged("ray.dag.compiled_dag_node")       # what Ray's graph monitor thread prints, past moert's filter
    try:
        m.forward(PROMPT)
        assert m.plan.remote[0].group.executions > 0        # the compiled graph was running when the worker died
        kill(ray_cluster, m.plan.remote[0])
        t0 = time.perf_counter()
        with pytest.raises(RemoteDeviceError, match="ray:0.*layer 1.*ray-fallback cpu") as e:
            m.forward([4])
        assert time.perf_counter() - t0 < 30 and e.value.device == "ray:0" and e.value.layer == 1
        assert m.position == len(PROMPT)                 # the failed step left the context as it was
        with pytest.raises(RemoteDeviceError):           # and the lost worker stays an error, at once
            m.forward([4])
    finally:
        m.close()                           # (waits for the monitor thread's own teardown)
        logged.stop()
    assert not [r for r in logged.records if r.exc_info], "Ray's traceback of the dead actor was printed"
    # two workers: ray:0 dies, the graph is compiled again over ray:1, which goes on; ray:0's experts on the host
    m = load(path, overrides=rules + r",blk\.0\.ffn_.*_exps=RAY1", gpu_layers=0, ray="local:2", ray_fallback="cpu")
    try:
        m.forward(PROMPT[:2])
        m.reset()
        lost, live = m.plan.remote
        kill(ray_cluster, lost)
        with pytest.warns(RuntimeWarning, match="ray:0.*this host's CPU"):
            got = generate_ids(m, PROMPT, 6, GREEDY)
        assert got == want and lost.remote.fallback_calls >= 6
        assert live.remote.calls >= 7 and live.group.compiles == 2 and live.group.members == [live]
    finally:
        m.close()


def test_hung_worker_is_an_error_within_its_timeout(ray_cluster, paths):
    m = load(paths["qwen3moe"], overrides=r"blk\.0\.ffn_.*_exps=RAY0", gpu_layers=0, ray="local:1", ray_timeout=2)
    try:
        assert m.plan.remote[0].group.executions > 0            # warm-up ran through the compiled graph
        m.plan.remote[0].stall(60)
        t0 = time.perf_counter()
        with pytest.raises(RemoteDeviceError, match="did not answer.*within 2 s"):
            m.forward(PROMPT)
        assert time.perf_counter() - t0 < 3.5       # the graph's wait; the worker, still in its step, is named
    finally:
        m.close()


def test_run_and_serve_with_a_remote_device_and_a_lost_worker_is_503(ray_cluster, paths, tmp_path, capsys):
    import json

    from moert.cli.main import main

    path = paths["qwen3moe"]
    rules = r"blk\.0\.ffn_.*_exps=RAY0"
    want = generate_ids(load(path, gpu_layers=0), [1, 2, 3], 4, GREEDY)
    assert main(["run", str(path), "-p", "1 2 3", "-n", "4", "--temp", "0", "-ngl", "0", "-ot", rules,
                 "--ray", "local:1", "--ray-calls", "plain", "--json", "--no-warmup"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["tokens"] == want and out["stats"]["total"]["remote"]["ray:0"]["calls"] >= 4

    testclient = pytest.importorskip("fastapi.testclient")
    from moert.serve.app import create_app
    from moert.serve.server import Server
    from moert.testing import gpt2_vocab_metadata, write_qwen3moe

    worded = write_qwen3moe(tmp_path / "v.gguf", n_layer=2, n_expert=4, vocab=gpt2_vocab_metadata())
    # explain takes the same flags: the walk of a token whose layer-0 experts ran on the worker
    assert main(["explain", str(worded), "-p", "hello world", "-ngl", "0", "-ot", rules, "--ray", "local:1",
                 "--json"]) == 0
    walk = json.loads(capsys.readouterr().out)
    assert walk["layers"][0]["expert_device"] == "ray:0" and walk["layers"][1]["expert_device"] == "cpu"
    m = load(worded, overrides=rules, gpu_layers=0, ray="local:1")
    server = Server(m, name="m", queue_size=4)
    try:
        with testclient.TestClient(create_app(server)) as c:
            ok = c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0})
            assert ok.status_code == 200, ok.text
            assert c.get("/stats").json()["remote"]["ray:0"]["calls"] >= 4           # prompt + 3 more tokens
            kill(ray_cluster, m.plan.remote[0])
            lost = c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0})
            assert lost.status_code == 503 and "ray:0" in lost.json()["error"]["message"]
            assert c.get("/health").status_code == 200                  # the server itself keeps serving
    finally:
        server.close()
        m.close()


def test_int8_activations_on_a_worker_equal_the_host_s(ray_cluster, tmp_path):
    from moert.errors import KernelOptionError
    from moert.kernels import matmul_q

    try:
        matmul_q.mode("int8")
    except KernelOptionError:
        pytest.skip("int8 activations need AVX2")
    path = write_qwen3moe(tmp_path / "q4k.gguf", n_layer=2, n_embd=256, n_expert=4, n_ff_exp=256, qtype="Q4_K")
    ref = load(path, gpu_layers=0, act_quant="int8")
    flt = load(path, gpu_layers=0)
    a, a_float = ref.forward(PROMPT), flt.forward(PROMPT)
    assert rel(a, a_float) > 1e-6                       # int8 rounding shows: the mode is really on
    m = load(path, overrides=r"blk\.1\.ffn_.*_exps=RAY0", gpu_layers=0, act_quant="int8", ray="local:1")
    try:
        assert rel(m.forward(PROMPT), a) < 1e-5 and m.plan.remote[0].remote.calls > 0
    finally:
        m.close()


def test_joining_a_running_cluster_by_its_address_puts_one_worker_per_node(ray_cluster, paths):
    address = ray_cluster.get_runtime_context().gcs_address          # the pytest session's cluster: one node
    devs = connect(address, 1)
    try:
        assert devs[0].pid > 0 and devs[0].name == "ray:0"
    finally:
        devs[0].close()
    with pytest.raises(RemoteDeviceError, match="has 1 node.*ray start --address"):
        connect(address, 2)
    host, port = address.rsplit(":", 1)
    with pytest.raises(RemoteDeviceError, match="already connected"):
        connect(f"{host}:{int(port) + 1 if int(port) < 65535 else 1}", 1)


def test_auto_joins_the_running_cluster_that_RAY_ADDRESS_names(ray_cluster):
    """ray="auto" in a process not yet in a cluster: Ray's own discovery (RAY_ADDRESS first) finds the pytest
    session's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    address = ray_cluster.get_runtime_context().gcs_address
    code = ("import ray; from moert.cluster import connect; d = connect('auto', 1)[0]; "
            "print(ray.get_runtime_context().gcs_address, d.pid); d.close()")
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, RAY_ADDRESS=address, PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=root)
    assert r.returncode == 0, r.stderr[-2000:]
    joined, pid = r.stdout.split()[-2:]
    assert joined == address and int(pid) > 0
