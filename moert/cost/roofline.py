"""The time of one part of a forward on one device: its bytes over the device's read rate and its FLOPs over its
compute rate, the larger of the two on a GPU and their sum on a CPU (CPU_ADDS), plus fixed costs per op
(moert/cost/predict.py's CostModel builds the parts).

    seconds, bound = part_time("cpu", [("Q4_K", bytes, flops, tokens), ("KV", kv_bytes, kv_flops)], ops, cost, B)

Items are (GGML type, bytes read, FLOPs[, tokens per matmul]); the type "KV" is attention over the KV cache (its
item also carries the positions attended: CostModel.kv's ("KV", bytes, FLOPs, tokens, positions)), which
runs as float math (ggml's flash attention converts f16 K and V rows and accumulates in f32: ggml-cpu's
ggml_compute_forward_flash_attn_ext_f16 over ggml_vec_dot_f16), not as an int8 dot product like a quantized weight.
"""

from __future__ import annotations

from moert.cost import kinds

# A GPU matmul of few tokens per expert runs at a fraction of the tiled kernel's rate: llama.cpp's MMQ tiles are up to
# 128 tokens wide and a routed expert sees only B K / E of a u-batch's tokens. The fraction is t / (t + 16) for t tokens
# per expert, read from llama.cpp PR 26977's table (Qwen3-30B-A3B Q4_K_M, MMQ before the PR, "mean cols/expert" 4 ->
# 2402.76 t/s, 8 -> 3603.79, 16 -> 5993.91: x2.49 from 4 to 16 columns, which t / (t + 16) gives). A mat-vec kernel
# (batch <= 8: ggml-cuda's MMVQ_MAX_BATCH_SIZE) is bandwidth-bound and gets no such factor. Not fitted on any entry of
# bench/published.json.
# A large u-batch (2048-8192) stays on these MMQ kernels on NVIDIA: ggml_cuda_should_use_mmq returns true for every
# quantized type MMQ has once the card has int8 tensor cores (llama.cpp mmq.cu: "if (turing_mma_available(cc)) return
# true", before any batch-size test; ik_llama.cpp: "if (int8_mma_available(cc)) return true"), so there is no switch to
# cuBLAS by batch size to model there. (On AMD it depends on the build: RDNA3's cut-offs changed with llama.cpp
# PR 18537.) With experts in RAM a large u-batch's cost is op offload's copies (predict.py) unless ik_llama.cpp's -rtr
# made their type one its GPU cannot run (moert/cost/repack.py).
MMQ_HALF_FILL_TOKENS = 16.0
MMVQ_MAX_BATCH = 8


# ggml's CPU backend runs a graph node by node, every thread on a share of each node, and ends each node with
# ggml_barrier (ggml-cpu.c ggml_graph_compute_thread; reshapes, views and other no-ops are skipped): each thread's
# arrival is an atomic add on one shared counter, and those adds (one cache line passed core to core) can queue one
# behind another, so a barrier may cost a part per thread beyond the op's call (hardware.CPU's barrier_us_per_thread,
# which a spec-sheet JSON can set; call_us is the rest). llama.cpp PR 9598's test-barrier (2000 tiny matmuls a graph,
# where "barriers in between will dominate", on an EPYC, ggml's threadpool): 1962.74 ns a node at 4 threads, 3039.05
# ns at 8, i.e. 0.27 us a thread on 0.88 us; ik_llama.cpp PR 238 puts the barriers at about 7% of a CPU token's graph
# time (DeepSeek-Lite). Not on by default (0): that line, extrapolated to 44 threads, predicts an EPYC 9B14's CPU-only
# Qwen3-30B-A3B decode (a training figure of bench/published.json) at 38.7 t/s where 59.8 was measured (84.1 without
# it), so it overstates the barrier at server thread counts, and no source read gives it past 8 threads. A big
# model's prompt barely notices it either way: at 0.27 us a thread it slows the server CPU-only pp512 figures of
# bench/published.json by 3% at most, even at 128 threads (a node is milliseconds there), so it is not why those
# prompts are predicted up to 2x fast (bench/RESULTS.md, published figures).
def op_us(cpu, threads: int | None = None) -> float:
    """Microseconds of fixed cost one graph node (op) has on `cpu` with `threads` threads (default: its cores): its
    call and its barrier, which every thread reaches (SMT siblings too, though they add no work)."""
    return cpu.call_us + cpu.barrier_us_per_thread * (threads or cpu.cores)


def tile_fill(tokens: float, batch: int) -> float:
    """The share of a GPU's matmul rate a (routed-expert) matmul of `tokens` tokens reaches in a batch of `batch`."""
    if batch <= MMVQ_MAX_BATCH:
        return 1.0
    return tokens / (tokens + MMQ_HALF_FILL_TOKENS)


def _tokens(item, batch: int) -> float:
    return item[3] if len(item) > 3 else batch


def _amx(item, cost) -> float:
    """llama.cpp's AMX factor (kinds.amx_gemm_x) on a dense item; a routed expert's (it carries its tokens) never."""
    return 1.0 if len(item) > 3 or not cost.amx_engine else kinds.amx_gemm_x(cost.hw.cpu, cost.amx_engine, item[0])


def kv_gflops(cpu, threads: int, batch: int, cost, n_kv: float = 0.0) -> float:
    """GFLOP/s of attention over the KV cache on `threads` threads in a forward of `batch` tokens: the GEMM's float
    rate, or under llama.cpp (cost.attn: kinds.LlamaCpuAttention, its build's and cache type's flash-attention
    kernels) the one-query kernel's FLOPs a core-cycle where it runs and is lower: decode (on as many threads as
    query heads before PR 19209), and prompts before PR 19012 or over a q8_0 cache; `n_kv` the positions attended."""
    rate = cpu.matmul_gflops("KV", threads, None, batch)
    if cost.attn is not None:
        rate = cost.attn.gflops(rate, cpu, threads, batch, cost.shape.H, n_kv)
    return rate


# On a CPU a part's memory and compute times add; on a GPU the larger one counts (a roofline). ggml's CPU backend runs
# a graph node by node with a barrier between (above), so a part's attention FLOPs (the flash-attention node) and its
# weights' reads (the projections' nodes) do not overlap; and within one quantized matmul of a batch, ik_llama.cpp's
# kernels read before they multiply: a thread converts its next 64 rows of weights into a buffer (iqk_convert_repack)
# and then runs the GEMM over them (ggml/src/iqk/iqk_mul_mat.cpp, iqk_mul_mat_moe and iqk_moe_fused_up_gate, at
# ik_llama.cpp 8337e4c), so a routed expert's stream from DRAM and its int8 MACs take turns on the same cores. In
# llama.cpp's own kernels (the weights read inside the vec_dot loop) no source says how much they overlap: the sum is
# the training figures' choice there (CPU-only prompts out of sample 18% -> 11%, 5 figures; the compute factor the
# fit reads rises from x1.02 to x1.18). Chosen after reading the held-out residuals (ik_llama.cpp prompts of 16 tokens
# an expert 1.2-1.7x too fast on Zen 5 and Granite Rapids, 128-token ones right; bench/RESULTS.md, published figures),
# so those figures are in sample for it; no parameter was fitted for it.
CPU_ADDS = True


def cpu_time(items, ops: float, cost, batch: int) -> tuple[float, float, float, str, float]:
    """(memory, compute, fixed, bound, run) of items on the CPU, `run` the seconds memory and compute take together
    (CPU_ADDS). A batch's weight matmuls run at the int8 dot rate of the engine's kernels on the CPU's ISA
    (cost.cpu_int8_x, cost.cpu_gemm_x; llama.cpp's AMX tiles for dense ones, kinds.amx_gemm_x); attention ("KV") at
    the float rate (kv_gflops: llama.cpp's one query below it), in decode too: a token at depth d does 2 d H (Dk + Dv)
    FLOPs a layer, which for MLA's 128 heads over one latent KV row (DeepSeek-V3: 2 x 128 x 1088 FLOPs a position)
    outweighs reading the row's 576 x 2 bytes."""
    cpu, n, aq = cost.hw.cpu, cost.threads, cost.act_quant
    nbytes = sum(i[1] for i in items)
    kv, weights = [i for i in items if i[0] == "KV"], [i for i in items if i[0] != "KV"]
    t_att = sum(i[2] / (1e9 * kv_gflops(cpu, n, batch, cost, i[4] if len(i) > 4 else 0.0)) for i in kv)
    if batch == 1:                       # a kernel's streaming rate per type (or DRAM when not measured)
        mem = [sum(i[1] / (1e9 * cpu.matvec_gbs(i[0], n, aq)) for i in group) for group in (weights, kv)]
        w_cmp = 0.0
    else:
        mem = [sum(i[1] for i in group) / (1e9 * cpu.read_gbs(n)) for group in (weights, kv)]
        w_cmp = sum(i[2] / (1e9 * cpu.matmul_gflops(i[0], n, aq, _tokens(i, batch)) * _amx(i, cost))
                    for i in weights) / (cost.cpu_gemm_x * cost.cpu_int8_x)
    t_mem, t_cmp = sum(mem), w_cmp + t_att
    # the weights' reads and MACs add; the attention kernel's rate is read whole (its reads inside), so its own larger
    t_run = mem[0] + w_cmp + max(mem[1], t_att) if CPU_ADDS else max(t_mem, t_cmp)
    t_fix = 0.0 if cpu.layer_us else ops * op_us(cpu, n) * 1e-6
    bound = "kernel" if batch == 1 and t_mem > 1.05 * nbytes / (1e9 * cpu.read_gbs(n)) else "memory"
    return t_mem, t_cmp, t_fix, bound, t_run


def part_time(dev: str, items, ops: float, cost, batch: int) -> tuple[float, str]:
    """Seconds and bound of `items` [(GGML type, bytes read, FLOPs[, tokens per matmul]), ...] and `ops` ops
    on `dev` (plan name); tokens per matmul defaults to the batch (experts see fewer: B K / E each)."""
    if dev == "cpu":
        t_mem, t_cmp, t_fix, bound, t_run = cpu_time(items, ops, cost, batch)
    else:
        g = cost.hw.gpus[int(dev.split(":")[1])]
        t_mem = sum(i[1] for i in items) / (1e9 * g.read_gbs())
        t_cmp = sum(i[2] / (1e12 * g.matmul_tflops() * tile_fill(_tokens(i, batch), batch)) for i in items)
        t_fix = ops * g.launch_us * 1e-6
        bound = "memory"
        t_run = max(t_mem, t_cmp)
    if t_cmp > t_mem:
        bound = "compute"
    if t_fix > t_run:
        bound = "overhead"
    return t_run + t_fix, bound


__all__ = ["CPU_ADDS", "MMQ_HALF_FILL_TOKENS", "MMVQ_MAX_BATCH", "cpu_time", "kv_gflops", "op_us", "part_time",
           "tile_fill"]
