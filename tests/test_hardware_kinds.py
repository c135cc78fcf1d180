"""Kinds of parts (moert/cost/kinds.py): a term of a kind reaches a part described by its spec sheet as it reaches
a preset; every preset says its kind; a kind moert does not know is an error."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import moert
from moert import cost
from moert.cost import kinds, presets


def _plan(hw, model="gpt-oss-20b"):
    return moert.plan(moert.zoo.path(model), gpu_backend="sim", gpu_memory=hw.gpu_memory())


def test_a_card_described_by_its_spec_sheet_as_rocm_rdna3_predicts_as_the_preset():
    xt = presets.GPUS["rx7900xt"]
    mine = moert.GPU("my navi31", 20, 800, 103, pcie_gen=4, api="rocm", arch="rdna3", memory="gddr6",
                     tier="consumer")
    assert mine.bw_efficiency == xt.bw_efficiency == kinds.RDNA3_DGPU_BW
    cpu = presets.CPUS["ryzen-5900x"]
    a, b = (moert.Hardware(cpu=cpu, gpus=[g], link=moert.Link.pcie(4)) for g in (xt, mine))
    p = _plan(a)
    ra, rb = moert.predict(p, a, n_prompt=512), moert.predict(p, b, n_prompt=512)
    assert (ra.decode_tok_s, ra.prefill_tok_s) == (rb.decode_tok_s, rb.prefill_tok_s)
    # the same card under Vulkan, or one with no kind stated, keeps the default share: decode is faster
    for other in (replace(mine, api="vulkan", bw_efficiency=0.0), moert.GPU("unknown", 20, 800, 103)):
        assert other.bw_efficiency == kinds.GPU_BW_SHARE
        hw = moert.Hardware(cpu=cpu, gpus=[other], link=moert.Link.pcie(4))
        assert moert.predict(p, hw, n_prompt=512).decode_tok_s > 1.2 * ra.decode_tok_s
    # a share given outright wins over the kind's
    assert moert.GPU("set", 20, 800, 103, api="rocm", arch="rdna3", bw_efficiency=0.7).bw_efficiency == 0.7


def test_a_json_file_carries_the_kind_fields(tmp_path):
    f = tmp_path / "card.json"
    f.write_text(json.dumps({"name": "w7800 by hand", "mem_gib": 32, "bw_gbs": 576, "fp16_tflops": 90.5,
                             "api": "rocm", "arch": "rdna3", "memory": "gddr6", "tier": "workstation"}))
    hw = cost.preset(f"{f}+ryzen-7950x")
    assert hw.gpus[0].bw_efficiency == presets.GPUS["w7800"].bw_efficiency == kinds.RDNA3_DGPU_BW
    c = tmp_path / "cpu.json"
    c.write_text(json.dumps({"name": "xeon", "cores": 28, "mem_bw_gbs": 140.8, "vendor": "intel",
                             "generation": "cascade-lake", "isa": "avx512-vnni", "tier": "server", "sockets": 2}))
    cpu = cost.preset(str(c)).cpu
    assert (cpu.vendor, cpu.generation, cpu.isa, cpu.tier, cpu.sockets) == ("intel", "cascade-lake", "avx512-vnni",
                                                                            "server", 2)


def test_every_preset_part_says_its_kind_and_sockets_multiply():
    for name, g in presets.GPUS.items():
        assert g.api and g.arch and g.memory and g.tier, name
    for name, c in presets.CPUS.items():
        assert c.vendor and c.generation and c.isa and c.tier and c.sockets == 1, name
    two = cost.preset("2x epyc-9374f").cpu
    assert (two.sockets, two.vendor, two.isa) == (2, "amd", "avx512-vnni")
    assert cost.numa_view(two, "isolate").sockets == 1 and cost.numa_view(two, "distribute").sockets == 2


@pytest.mark.parametrize("bad, field", [(dict(api="cudaa"), "api='cudaa'"), (dict(arch="rdna9"), "arch='rdna9'"),
                                        (dict(tier="gaming"), "tier='gaming'")])
def test_a_kind_moert_does_not_know_is_a_hardware_error_naming_the_choices(bad, field):
    with pytest.raises(cost.HardwareError, match=field) as e:
        moert.GPU("x", 8, 272, 30, **bad)
    assert "use one of" in str(e.value)
    with pytest.raises(cost.HardwareError, match="isa='sse4'"):
        moert.CPU("x", 8, 80.0, isa="sse4")
