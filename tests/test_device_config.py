"""moert.DeviceConfig (LM-Kit's DeviceConfiguration): one value accepted by load, plan and fit beside keywords."""

from __future__ import annotations

import pytest

import moert
from moert.testing import write_qwen3moe


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_qwen3moe(tmp_path_factory.mktemp("devcfg") / "m.gguf", n_layer=3, n_expert=4)


CFG = moert.DeviceConfig(gpu_layers=2, overrides=[moert.TensorOverride.cpu(r"blk\.0\.ffn_.*_exps")], main_gpu=0,
                         tensor_split=[1, 3], gpu_backend="sim", gpu_memory=["1GiB", "1GiB"])


def test_plan_fit_and_load_take_it_as_the_keywords(model):
    kw = CFG.kwargs()
    assert moert.plan(model, device_config=CFG).to_dict() == moert.plan(model, **kw).to_dict()
    r = moert.fit(model, device_config=CFG)
    assert r.success and r.gpu_layers == 2 and r.bytes_by_device == moert.fit(model, **kw).bytes_by_device
    m = moert.load(model, device_config=CFG, context_size=64, warmup=False)
    try:
        assert m.plan.to_dict() == moert.plan(model, **kw).to_dict()
    finally:
        m.close()


def test_it_composes_with_other_keywords_and_refuses_disagreement(model):
    p = moert.plan(model, device_config=CFG, strict=True, cpu_moe=False)   # not in the config: fine
    assert p.gpu_layers == 2
    assert moert.plan(model, gpu_layers=2, device_config=CFG).gpu_layers == 2   # the same value twice: fine
    with pytest.raises(moert.PlacementError, match="gpu_layers=3 and device_config.gpu_layers=2 disagree"):
        moert.plan(model, gpu_layers=3, device_config=CFG)
    with pytest.raises(moert.PlacementError, match="must be a moert.DeviceConfig"):
        moert.plan(model, device_config={"gpu_layers": 2})


def test_main_gpu_with_split_none(model):
    cfg = moert.DeviceConfig(split="none", main_gpu=1, gpu_backend="sim", gpu_memory=["1GiB", "1GiB"])
    p = moert.plan(model, device_config=cfg)
    assert {e.device for e in p if e.layer is not None} == {"sim:1"}
    with pytest.raises(moert.PlacementError, match="there is no GPU 2"):
        moert.plan(model, device_config=moert.DeviceConfig(main_gpu=2, gpu_backend="sim"))
