"""ik_llama.cpp's run-time repacking (-rtr, --run-time-repack) and what it does to op offload.

    offloadable("Q4_K", repack=True)     # False: Q4_K_R4 has no CUDA kernel in ik_llama.cpp
    offloadable("IQ4_K", repack=True)    # True: IQ4_K_R4 has one (ik_llama.cpp PR 461)

With -rtr, ik_llama.cpp repacks every weight in a host buffer to its row-interleaved type (src/llama.cpp: "if
(!ml.use_mmap && ml.repack_tensors)" runs iqk_repack_tensor on each tensor whose buffer is host memory, so the experts
of -ot exps=CPU too) and turns mmap off ("turning on run time repacking will automatically turn off mmap": ik_llama.cpp
PR 147; common.cpp sets use_mmap = false with repack_tensors). ggml_backend_sched offloads a CPU weight's op to the GPU
only if the GPU backend supports the op on that type, and ik_llama.cpp's CUDA supports_op for MUL_MAT, MUL_MAT_ID and
MOE_FUSED_UP_GATE lists, of the repacked types, only IQ2_K_R4 .. IQ5_K_R4, IQ4_KS_R4, IQ5_KS_R4, IQ1_S_R4 and IQ1_M_R4
(ggml-cuda.cu as of July 2025; the IQk_K_R4 kernels came with PR 461, 2025-05-26). So a K-quant or legacy-quant
model's experts in RAM, once repacked, are never offloaded: their prompt matmuls stay on the CPU at every u-batch.
"""

from __future__ import annotations

# iqk_quantize.cpp get_repack_info: a type and the row-interleaved type -rtr makes of it (the BF16_R16 of F16 and BF16
# needs __AVX512BF16__ and is left out: such weights stay float, as llama.cpp's own GPU kernels take them).
REPACKED = {
    "IQ2_K": "IQ2_K_R4", "IQ3_K": "IQ3_K_R4", "IQ4_K": "IQ4_K_R4", "IQ5_K": "IQ5_K_R4", "IQ4_XS": "IQ4_XS_R8",
    "IQ4_KS": "IQ4_KS_R4", "IQ5_KS": "IQ5_KS_R4", "IQ4_NL": "IQ4_NL_R4", "IQ2_BN": "IQ2_BN_R4",
    "IQ2_XXS": "IQ2_XXS_R4", "IQ2_XS": "IQ2_XS_R4", "IQ2_S": "IQ2_S_R4", "IQ3_XXS": "IQ3_XXS_R4", "IQ3_S": "IQ3_S_R4",
    "Q2_K": "Q2_K_R4", "Q3_K": "Q3_K_R4", "Q4_K": "Q4_K_R4", "Q5_K": "Q5_K_R4", "Q6_K": "Q6_K_R4",
    "Q4_0": "Q4_0_R8", "Q5_0": "Q5_0_R4", "Q6_0": "Q6_0_R4", "Q8_0": "Q8_0_R8", "Q8_K": "Q8_K_R8",
}
# the repacked types ik_llama.cpp's CUDA backend runs a matmul on (ggml_backend_cuda_supports_op)
CUDA_RUNS = frozenset({"IQ2_K_R4", "IQ3_K_R4", "IQ4_K_R4", "IQ4_KS_R4", "IQ5_K_R4", "IQ5_KS_R4", "IQ1_S_R4",
                       "IQ1_M_R4"})


def offloadable(type_name: str, repack: bool) -> bool:
    """Whether a weight of `type_name` in RAM can still be offloaded to an ik_llama.cpp CUDA GPU for a batch's matmul
    (always, unless -rtr repacked it to a type the GPU does not run)."""
    if not repack or type_name not in REPACKED:
        return True
    return REPACKED[type_name] in CUDA_RUNS


__all__ = ["CUDA_RUNS", "REPACKED", "offloadable"]
