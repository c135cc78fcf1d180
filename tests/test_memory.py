"""Memory estimate and fit: the estimate bounds what loading and a full KV cache allocate; fit's strategy."""

from __future__ import annotations

import re
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import moert
from moert.devices.gpus import get_devices
from moert.errors import DeviceOutOfMemory, PlacementError, PlacementWarning
from moert.kvcache import KVSpec, allocate_kv_cache, kv_cache_bytes, kv_spec
from moert.placement import EXPERT_REGEX, TensorOverride, expert_layer_regex, plan
from moert.placement.memory import estimate
from moert.placement.strategies import auto_plan, fit
from moert.testing import TINY, full_context_peak, write_tiny
from moert.weights import load_weights

N_LAYER, N_CTX = 4, 256


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from moert.testing import write_qwen3moe

    return write_qwen3moe(tmp_path_factory.mktemp("memory") / "m.gguf", n_layer=N_LAYER, n_head=4, n_head_kv=2,
                          head_dim=16, n_expert=8, n_ff_exp=32, context_length=N_CTX, qtype="Q8_0")


@pytest.fixture(scope="module")
def gg(model):
    from moert import gguf

    with gguf.open(model) as g:
        yield g


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlacementWarning)
        return fn(*args, **kwargs)


# ----------------------------------------------------------------------------------------------- KV cache

def test_kv_cache_bytes(gg):
    spec = KVSpec.from_metadata(gg.metadata)
    assert spec == KVSpec(N_LAYER, 2, 16, 16)
    assert kv_cache_bytes(gg.metadata, 100) == N_LAYER * 100 * 2 * (16 + 16) * 2     # f16, llama.cpp's default
    assert kv_cache_bytes(spec, 100, np.float32) == kv_cache_bytes(spec, 100, "f32") == N_LAYER * 100 * 2 * 32 * 4
    cfg = SimpleNamespace(n_layer=3, n_head_kv=4, head_dim=8)  # a forward pass's config object
    assert kv_spec(cfg) == KVSpec(3, 4, 8, 8) and kv_cache_bytes(cfg, 10) == 3 * 10 * 4 * 16 * 2
    with pytest.raises(PlacementError, match="n_head_kv"):
        kv_spec(SimpleNamespace(n_layer=3))
    md = {k: v for k, v in gg.metadata.items() if k != "qwen3moe.attention.head_count"}
    with pytest.raises(PlacementError, match="'qwen3moe.attention.head_count' is missing"):
        KVSpec.from_metadata(md)


def test_allocate_kv_cache_on_each_layers_attention_device(gg):
    rules = [TensorOverride.gpu(r"blk\.[01]\.attn", 1), TensorOverride.cpu(r"blk\.3\.attn")]
    p = quiet(plan, gg, rules, gpu_backend="sim", gpu_memory="1GiB,1GiB", split="none")
    f16 = allocate_kv_cache(p, 64)
    assert f16.types == ("f16", "f16") and f16.nbytes == kv_cache_bytes(p, 64)   # the default, llama.cpp's
    f16.free()
    kv = allocate_kv_cache(p, 64, "f32")
    assert [d.name for d in kv.devices] == ["sim:1", "sim:1", "sim:0", "cpu"]
    assert kv.k[0].shape == (64, 2, 16) and kv.k[0].dtype == np.float32 and kv.k[0].device.name == "sim:1"
    assert isinstance(kv.v[3], np.ndarray) and float(kv.v[2].sum()) == 0.0
    per_layer = 64 * 2 * 32 * 4
    assert kv.bytes_by_device() == {"sim:1": 2 * per_layer, "sim:0": per_layer, "cpu": per_layer}
    assert kv.nbytes == kv_cache_bytes(p, 64, "f32") and p.device("sim:1").used == 2 * per_layer
    kv.free()
    assert p.device("sim:1").used == 0 and p.device("sim:0").used == 0


def test_kv_cache_that_cannot_fit_allocates_nothing(gg):
    p = quiet(plan, gg, gpu_backend="sim", gpu_memory=3 * 64 * 2 * 16 * 4 + 10)   # one layer and a half
    with pytest.raises(DeviceOutOfMemory, match=r"the KV cache at context 64.*requested 65,536 bytes"):
        allocate_kv_cache(p, 64, "f32")
    assert p.devices[0].used == 0 and p.devices[0].peak == 0


# ----------------------------------------------------------------------------------------------- estimate

PLACEMENTS = {
    "all on sim:0": dict(),
    "experts on cpu": dict(overrides=[rf"{EXPERT_REGEX}=CPU"]),
    "two gpus, experts on cpu": dict(cpu_moe=True, gpu_memory="1GiB,3GiB", tensor_split=[1, 3]),
    "gpu_layers=2": dict(gpu_layers=2),
    "experts of half the layers on sim:0": dict(n_cpu_moe=2),
}


@pytest.mark.parametrize("kind", PLACEMENTS)
def test_estimate_is_an_upper_bound_on_a_sim_gpu_of_exactly_that_size(gg, kind):
    kw = dict(gpu_backend="sim", gpu_memory="1GiB") | PLACEMENTS[kind]
    est = estimate(quiet(plan, gg, **kw), N_CTX)
    gpus = [n for n in est.devices if n != "cpu"]
    # sim GPUs whose capacities are exactly the estimate: load + a full-context KV cache must fit
    p = quiet(plan, gg, **{**kw, "gpu_memory": [est.devices[n].total for n in gpus]})
    w = load_weights(gg, p, progress=False)
    kv = allocate_kv_cache(p, N_CTX)
    for d in p.devices:
        e = est.devices[d.name]
        assert d.used <= e.total
        assert d.used == e.weights + e.kv  # weights and KV are exact; scratch is the margin for temporaries
        assert e.scratch > 0 or e.weights + e.kv == 0
    # and the weight + KV part is tight: one byte less and something does not fit
    tight = [max(est.devices[n].weights + est.devices[n].kv, 1) for n in gpus]
    if any(est.devices[n].weights + est.devices[n].kv for n in gpus):
        tight[0] -= 1
        p2 = quiet(plan, gg, **{**kw, "gpu_memory": tight})
        with pytest.raises(DeviceOutOfMemory):
            w2 = load_weights(gg, p2, progress=False)  # kept alive: a dropped store gives its memory back
            allocate_kv_cache(p2, N_CTX)
        del w2
    kv.free()
    w.free()


def test_estimate_formula_parts(gg):
    p = quiet(plan, gg, [rf"{EXPERT_REGEX}=CPU"], gpu_backend="sim")
    e = estimate(p, 100)
    assert e.devices["sim:0"].weights == p.bytes_by_device()["sim:0"]
    assert e.devices["sim:0"].kv == kv_cache_bytes(p, 100) and e.devices["cpu"].kv == 0
    assert e.context_size == 100 and e.fits() and "sim:0" in e.table() and "scratch" in e.table()
    # more context never needs less memory; a names-only plan has weights only
    assert estimate(p, 200).devices["sim:0"].total > e.devices["sim:0"].total
    assert estimate(plan(["blk.0.attn_q.weight"], gpu_backend="sim"), 10).devices["sim:0"].total == 0
    with pytest.raises(PlacementError, match="context_size"):
        estimate(p, -1)


# -------------------------------------------------------------------------------------------------- fit

def _gpu_needs(gg, ctx, **kw):
    """sim:0's estimate with every expert tensor on the CPU, and with none."""
    lo = estimate(quiet(plan, gg, cpu_moe=True, gpu_backend="sim"), ctx).devices["sim:0"].total
    hi = estimate(quiet(plan, gg, gpu_backend="sim"), ctx).devices["sim:0"].total
    return lo, hi


def _fit_loads(gg, r, mem):
    """The fitted plan really loads, with a full KV cache, on a sim GPU of that size."""
    p = quiet(plan, gg, r.rules, r.gpu_layers, gpu_backend="sim", gpu_memory=mem)
    w = load_weights(gg, p, progress=False)
    kv = allocate_kv_cache(p, r.context_size)
    kv.free()
    w.free()


def test_fit_with_room_to_spare_adds_nothing(gg):
    r = quiet(fit, gg, context_size=0, gpu_backend="sim", gpu_memory="1GiB")
    assert r.success and r.context_size == N_CTX and r.overrides == [] and r.gpu_layers == N_LAYER + 1
    assert r.bytes_by_device == r.estimate.total_by_device() and "fits at context 256" in r.message


@pytest.mark.parametrize("order, moved", [("last", [N_LAYER - 1, N_LAYER - 2]), ("first", [0, 1])])
def test_fit_moves_whole_layers_of_experts(gg, order, moved):
    _, hi = _gpu_needs(gg, N_CTX)
    layer_experts = sum(t.nbytes for n, t in gg.tensors.items() if n.startswith("blk.0.") and "_exps" in n)
    mem = hi - layer_experts * 3 // 2  # one layer's experts on the cpu is not enough, two are
    r = quiet(fit, gg, context_size=N_CTX, gpu_backend="sim", gpu_memory=mem, expert_order=order)
    assert r.success and r.context_size == N_CTX
    assert [o.pattern for o in r.overrides] == [expert_layer_regex(i) for i in moved]
    assert all(o.source == "fit" and o.device == "cpu" for o in r.overrides)
    assert r.estimate.devices["sim:0"].total <= mem
    # minimal: without its last rule the plan would not fit
    fewer = quiet(plan, gg, r.rules[:-1], gpu_backend="sim", gpu_memory=mem)
    assert estimate(fewer, N_CTX).devices["sim:0"].total > mem
    _fit_loads(gg, r, mem)


def test_fit_keeps_the_users_rules_first_and_never_moves_what_they_placed(gg):
    _, hi = _gpu_needs(gg, N_CTX)
    layer_experts = sum(t.nbytes for n, t in gg.tensors.items() if n.startswith("blk.0.") and "_exps" in n)
    user = [TensorOverride.gpu(rf"blk\.{N_LAYER - 1}\.ffn_.*_exps", 0), TensorOverride.cpu("attn_output")]
    r = quiet(fit, gg, context_size=N_CTX, overrides=user, gpu_backend="sim", gpu_memory=hi - layer_experts)
    assert r.success and r.rules[:2] == user and r.overrides == r.rules[2:] and len(r.overrides) >= 1
    assert expert_layer_regex(N_LAYER - 1) not in [o.pattern for o in r.overrides]
    assert r.plan.device_of(f"blk.{N_LAYER - 1}.ffn_up_exps.weight") == "sim:0"
    assert r.plan.device_of("blk.0.attn_output.weight") == "cpu"


def test_fit_reduces_context_only_when_not_fixed(gg):
    lo, _ = _gpu_needs(gg, N_CTX)
    lo128, _ = _gpu_needs(gg, 128)
    mem = (lo + lo128) // 2  # every expert on the cpu and still too small for the trained context
    r = quiet(fit, gg, context_size=0, gpu_backend="sim", gpu_memory=mem, min_context=64)
    assert r.success and 128 <= r.context_size < N_CTX and len(r.overrides) == N_LAYER
    assert "reduced from 256" in r.message
    assert estimate(r.plan, r.context_size + 1).devices["sim:0"].total > mem  # the largest that fits
    _fit_loads(gg, r, mem)
    fixed = quiet(fit, gg, context_size=N_CTX, gpu_backend="sim", gpu_memory=mem)
    assert not fixed.success and fixed.context_size == N_CTX
    assert re.search(r"does not fit at context 256.*sim:0 needs .* \(weights .*, KV .*, scratch .*\) but has",
                     fixed.message)


def test_fit_failure_and_gpu_layers_auto(gg):
    r = quiet(fit, gg, context_size=0, gpu_backend="sim", gpu_memory="64KiB")
    assert not r.success and "does not fit" in r.message and "--gpu-mem" in r.message
    a = quiet(fit, gg, context_size=N_CTX, gpu_backend="sim", gpu_memory="1MiB", gpu_layers="auto")
    assert a.success and 0 < a.gpu_layers < N_LAYER + 1 and "with gpu_layers=" in a.message
    assert a.estimate.devices["sim:0"].total <= 1 << 20
    p = quiet(auto_plan, gg, N_CTX, gpu_layers="auto", gpu_backend="sim", gpu_memory="1MiB")
    assert p.gpu_layers == a.gpu_layers and p.rules == a.rules
    tiny = quiet(auto_plan, gg, N_CTX, gpu_layers="auto", gpu_backend="sim", gpu_memory="16KiB")
    assert tiny.gpu_layers == 0 and set(tiny.bytes_by_device().values()) == {0, sum(e.nbytes for e in tiny)}
    with pytest.raises(PlacementError, match="gpu_layers='auto': does not fit"):  # the user's rule needs a GPU
        auto_plan(gg, N_CTX, overrides=["attn=GPU0"], gpu_layers="auto", gpu_backend="sim", gpu_memory="16KiB")
    with pytest.raises(PlacementError, match="gpu_layers='auto' is a strategy, not a plan"):
        plan(gg, gpu_layers="auto", gpu_backend="sim")


def test_fit_margin_and_no_gpu(gg):
    _, hi = _gpu_needs(gg, N_CTX)
    assert quiet(fit, gg, context_size=N_CTX, gpu_backend="sim", gpu_memory=hi).overrides == []  # margin 0 on sim
    r = quiet(fit, gg, context_size=N_CTX, gpu_backend="sim", gpu_memory=hi, margin=hi // 50)
    assert r.overrides and r.estimate.devices["sim:0"].total <= hi - hi // 50
    if not get_devices("auto"):
        with pytest.warns(PlacementWarning, match="no usable GPU"):
            r = fit(gg, context_size=0)
        assert r.success and r.context_size == N_CTX and set(r.bytes_by_device) == {"cpu"}
    assert moert.fit is fit and moert.estimate is estimate and moert.FitResult.__name__ == "FitResult"


@pytest.mark.parametrize("kind", PLACEMENTS)
@pytest.mark.parametrize("n_batch", [7, 64])
def test_estimate_bounds_a_forward_pass_that_fills_the_context(model, kind, n_batch):
    """Fill the whole context on sim GPUs whose capacity is exactly the estimate: the sim device counts every
    array it holds, temporaries included, so the estimate's scratch term is checked against the real peak."""
    kw = dict(gpu_backend="sim", gpu_memory="1GiB") | PLACEMENTS[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlacementWarning)
        est = estimate(plan(model, **kw), N_CTX, n_batch=n_batch, all_logits=True)
        gpus = [n for n in est.devices if n != "cpu"]
        caps = [est.devices[n].total for n in gpus]
        m = moert.load(model, **{**kw, "gpu_memory": caps}, context_size=N_CTX, n_batch=n_batch, progress=False)
    tokens = np.random.default_rng(0).integers(0, 256, N_CTX)
    m.forward(tokens[: N_CTX - 3])            # prefill, chunked by n_batch
    for t in tokens[N_CTX - 3:]:              # then decode to the last position
        m.forward([t])
    assert m.position == N_CTX
    for d in m.plan.devices:
        e = est.devices[d.name]
        assert d.peak <= e.total == d.capacity
        assert d.peak > e.weights + e.kv or e.weights + e.kv == 0  # temporaries really were counted


@pytest.mark.parametrize("name", sorted(TINY))
@pytest.mark.parametrize("kw", [{}, {"cpu_moe": True}], ids=["all", "cpu-moe"])
@pytest.mark.parametrize("kv", ["f16", "f32"])
def test_the_estimate_is_tight_at_full_context(tmp_path, name, kw, kv, one_numba_thread):
    """An upper bound, and within 1.3x of the measured peak at the trained context (256 tokens), with the
    default f16 cache (flash attention on, -fa auto) and with f32 (off)."""
    path = write_tiny(tmp_path / f"{name}.gguf", name, seed=7)
    est, peak = full_context_peak(path, TINY[name]["hparams"]["context_length"], kv, **kw)
    assert peak <= est <= 1.3 * peak, (name, est, peak, est / peak)


@pytest.mark.slow
def test_the_estimate_is_tight_for_gemma_3_270m(gemma_path, one_numba_thread):
    """The dense model of the long-context goal (241 MiB of weights; a 262k vocabulary whose tied output is the biggest
    weight): measured at 2048 tokens, since filling its 32k context takes minutes here; longer contexts are
    bench/estimate_tightness.py's (bench/RESULTS.md)."""
    est, peak = full_context_peak(gemma_path, 2048)
    assert peak <= est <= 1.3 * peak, (est, peak, est / peak)


def test_the_cost_model_and_fit_share_one_memory_estimate():
    """moert.predict's GPU need (compare, the hardware strategies) takes weights and KV from placement/memory.py's
    estimate, as fit does; only llama.cpp's compute buffer is its own. A hybrid model's linear-attention layers
    keep no KV cache, in both."""
    from moert.cost import zoo
    from moert.cost.machines import preset
    from moert.cost.predict import gpu_memory
    from moert.kvcache import KVSpec, kv_layers

    hw = preset("rtx4090+ryzen-7950x")
    for name in ("qwen3-30b-a3b", "qwen3-next-80b-a3b"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p = moert.plan(zoo.path(name), cpu_moe=True, gpu_backend="sim", gpu_memory=hw.gpu_memory())
        need, est = gpu_memory(p, hw, 4096)["gpu0"], estimate(p, 4096, kv_dtype="f16").devices["sim:0"]
        assert (need["weights"], need["kv"]) == (est.weights, est.kv) and need["scratch"] > 0
        spec = KVSpec.from_metadata(p.metadata)
        assert est.kv == spec.layer_bytes(4096, ("f16", "f16")) * kv_layers(p.metadata, spec.n_layer)
    assert kv_layers(p.metadata, spec.n_layer) == spec.n_layer // 4                # qwen3-next: 1 layer in 4
