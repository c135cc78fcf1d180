"""ik_llama.cpp's -rtr (moert/cost/repack.py): repacked weights its CUDA backend cannot run are never offloaded."""

from __future__ import annotations

import warnings

import pytest

import moert
from moert import cost, zoo
from moert.cost.repack import REPACKED, offloadable


def test_only_the_iqk_r4_types_stay_offloadable_once_repacked():
    # ik_llama.cpp's ggml-cuda.cu supports_op: IQ2_K_R4 .. IQ5_K_R4 yes, Q4_K_R4 / Q8_0_R8 / IQ4_XS_R8 no
    assert not offloadable("Q4_K", True) and not offloadable("Q8_0", True) and not offloadable("IQ4_XS", True)
    assert offloadable("IQ4_K", True) and offloadable("IQ5_K", True)
    assert offloadable("Q4_K", False)                          # no -rtr: nothing is repacked
    assert offloadable("MXFP4", True) and "MXFP4" not in REPACKED  # no interleaved form: stays as it is


def _hybrid(hw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return moert.plan(zoo.path("qwen3-30b-a3b"), gpu_backend="sim", gpu_memory=hw.gpu_memory(),
                          overrides="exps=CPU")


@pytest.mark.parametrize("policy", ["ik_llama.cpp", "llama.cpp"])
def test_rtr_keeps_k_quant_experts_on_the_cpu_at_a_large_u_batch(policy):
    """qwen3-30b-a3b (128 experts, 8 used): ik_llama.cpp offloads its experts from a 512-token u-batch on (32 E / K);
    with -rtr its Q4_K / Q6_K experts become Q4_K_R4 / Q6_K_R4, which its GPU does not run: no copy, CPU matmuls."""
    hw = cost.preset("rtx4090+epyc-9355")
    p = _hybrid(hw)
    kw = dict(n_prompt=4096, n_ubatch=4096, n_gen=1, policy=policy)
    plain, rtr = moert.predict(p, hw, **kw), moert.predict(p, hw, repack=True, **kw)
    copies = [x for x in plain.parts if x.phase == "prefill" and x.stage == "offload"]
    assert copies                                                   # without -rtr the experts cross the link
    experts = {x.device for x in rtr.parts if x.phase == "prefill" and x.stage == "experts"}
    if policy == "ik_llama.cpp":
        assert not [x for x in rtr.parts if x.phase == "prefill" and x.stage == "offload"] and experts == {"cpu"}
        assert rtr.prefill_s != plain.prefill_s and rtr.decode_s == pytest.approx(plain.decode_s)
    else:                                                           # mainline has no -rtr: the flag changes nothing
        assert rtr.prefill_s == pytest.approx(plain.prefill_s)
    assert rtr.settings["repack"] is (policy == "ik_llama.cpp")
