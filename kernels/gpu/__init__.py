"""moert.kernels.gpu: Triton kernels that read GGUF quantized weights as they are, on a CUDA GPU.

    matvec(w, qtype, shape, x, out=None, stream=None)    (T, N) float32 = x (T, K) @ W.T, T <= 8, one launch
    matmul(w, qtype, shape, x, ...)                      any T: matvec up to 8 tokens, tiled tensor-core kernel beyond
    moe(x, ids, weights, gate, up, down, qtype, shapes, act="swiglu", biases=None, out=None, work=None, stream=None)
                                                         a layer's routed experts: two launches with the ids read on
                                                         the device (T <= 8), or grouped by expert (prompts)
    dequantize(w, qtype, shape, dtype=float16)           W on the device as f16/f32; gemm_f16(wf16, x) its GEMM
    attention(q, k_cache, v_cache, pos, scale=None, window=None, sinks=None, out=None, work=None, stream=None)
                                                         attention over a KV cache in its own type (f32, f16, bf16,
                                                         q8_0): up to 8 tokens the keys split over programs, then
                                                         merged (flash-decoding), prompts by f16 tensor-core tiles
                                                         (FlashAttention-2); pos may live on the device
    kv_write(cache, x, pos)                              this step's keys or values into the cache, rounded to its type
    matmul_ref / moe_ref / attention_ref                 the NumPy twins every kernel is tested against

w is the tensor's raw GGUF bytes (any dtype, read as uint8) in the device's memory, shape its NumPy-order shape.
On a CuPy array a kernel is compiled on first use for the device's compute capability (triton.compile to a cubin,
kept for the process and in Triton's disk cache), loaded once per device and launched by CuPy on its current
stream (or `stream`), so a CuPy CUDA-graph capture records it: call each kernel once before capturing (the first
call compiles and loads it); a decode call given `out` (and moe's `work`) allocates nothing. On NumPy arrays (the
simulated GPU, tests) the NumPy twin runs by default; backend="interpret" runs the kernel's own Triton source
under Triton's interpreter instead (torch is not needed: launch.py hands it NumPy arrays).

Why Triton and not CuPy RawKernels or numba-cuda: a Triton kernel's very source runs in CI on a CPU (its
interpreter), and compiles to sm_80 / sm_90 cubins without a GPU (triton.compile with a GPUTarget), so what CI
tests is what a GPU runs; a RawKernel's CUDA C cannot run without a GPU at all, and numba-cuda's simulator has no
warp shuffles or dp4a and ran ~50x slower than Triton's interpreter. Triton's own launcher is not used: it needs
torch and launches on torch's stream, which a CuPy graph capture would miss (kernels/gpu/launch.py).

Files: table.py (per type: kernel code, tile, launch configuration; pure data, kernels/ktypes.py reads it),
src/ (the Triton sources: deq.py the block decoders, matvec.py decode and MoE, tiled.py prompts, attention.py
attention), launch.py (interpreter and CuPy launcher), ops.py (this API), attn.py (attention's host side),
aot.py (every kernel of a type to cubins). It may import moert.quants, moert.activations and moert.errors; Triton
and CuPy only inside functions, so importing it needs neither.
"""

from .attn import attention, attention_ref, kv_write
from .ops import BACKENDS, dequantize, gemm_f16, gpu_type, matmul, matmul_ref, matvec, moe, moe_ref
from .table import DECODE_MAX_T, GPU_TYPES, GpuType

__all__ = ["BACKENDS", "DECODE_MAX_T", "GPU_TYPES", "GpuType", "attention", "attention_ref", "dequantize", "gemm_f16",
           "gpu_type", "kv_write", "matmul", "matmul_ref", "matvec", "moe", "moe_ref"]
