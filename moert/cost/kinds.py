"""Kinds of parts: what a spec sheet says a part is, and the cost terms that belong to such a kind, not to one part.

    GPU(..., api="rocm", arch="rdna3", memory="gddr6", tier="consumer")    # reads ROCm's share at decode
    CPU(..., vendor="intel", generation="cascade-lake", isa="avx512", tier="server")

A GPU's `api` is the backend llama.cpp's build for it uses, `arch` its architecture, `memory` its memory type and
`tier` its market; a CPU's `vendor`, `generation` (microarchitecture), `isa` (the widest int8 dot-product path
llama.cpp's CPU kernels take on it) and `tier`. Empty: not stated (then no kind term applies, and moert's coverage
classes, moert/cost/coverage.py, say "unknown"). A term keyed on these fields reaches a part described by its own
spec sheet or a JSON file (moert/cost/machines.py) exactly as it reaches a preset of the same kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GPU_APIS = ("cuda", "rocm", "vulkan", "metal", "sycl")
GPU_ARCHS = ("turing", "ampere", "ada", "hopper", "blackwell", "gcn5", "rdna2", "rdna3", "rdna3.5", "cdna2", "cdna3",
             "apple-m2", "intel-xe")
GPU_MEMORY = ("gddr6", "gddr6x", "gddr7", "hbm2", "hbm2e", "hbm3", "hbm3e", "lpddr5x", "unified")
GPU_TIERS = ("consumer", "workstation", "datacenter")
CPU_VENDORS = ("amd", "intel")
CPU_GENERATIONS = ("zen2", "zen3", "zen4", "zen5", "skylake-x", "skylake-sp", "cascade-lake", "ice-lake",
                   "sapphire-rapids", "emerald-rapids", "granite-rapids", "alder-lake", "raptor-lake")
# llama.cpp's CPU int8 dot products (ggml-cpu/arch/x86/quants.c, ggml_vec_dot_q4_K_q8_K and kin): AVX2's
# _mm256_maddubs_epi16 + _mm256_madd_epi16, AVX-512BW's 512-bit forms of the same, AVX512-VNNI's one
# _mm512_dpbusd_epi32, and AMX-INT8 tiles (ggml-cpu/amx/mmq.cpp) for a batch's matmuls.
CPU_ISAS = ("avx2", "avx512", "avx512-vnni", "amx")
CPU_TIERS = ("consumer", "workstation", "server")

GPU_FIELDS = {"api": GPU_APIS, "arch": GPU_ARCHS, "memory": GPU_MEMORY, "tier": GPU_TIERS}
CPU_FIELDS = {"vendor": CPU_VENDORS, "generation": CPU_GENERATIONS, "isa": CPU_ISAS, "tier": CPU_TIERS}

# The share of the data sheet's bandwidth decode kernels read, by the GPU's kind. The default: llama.cpp's CUDA
# mat-vec kernels reach ~75-85% of the data-sheet figure on large matrices (and a STREAM-like copy ~90%); 0.8 is the
# assumption. Read the same way as below, CUDA on NVIDIA gives about that: llama.cpp PR 15802, RTX 3090, llama 8B Q4_0
# (4.33 GiB) at one token 155-156 t/s, 0.77 of 936.
GPU_BW_SHARE = 0.8
# ROCm's decode kernels on discrete RDNA3 (Navi 31/32: RX 7900 XT / XTX, PRO W7800, GDDR6) read a smaller share of the
# data sheet than CUDA's. Dense llama.cpp decode read as the file's bytes over the token's time (a dense model at
# one token is its weights read once; launches overlap them):
#   llama.cpp #4763, RX 7900 XT, HIP 5.7: llama 7B Q8_0 (7.17 GiB), tg128 67.20 t/s: 517 GB/s, 0.65 of 800;
#   llama.cpp #20934, RX 7900 XTX, ROCm: Llama-7B Q4_0 (3.56 GiB), 129-144 t/s: 493-550 GB/s, 0.51-0.57 of 960;
#   llama.cpp PR 26284, RX 7900 XTX, ROCm: llama 8B Q4_K_M (4.58 GiB), tg64 105.75 t/s: 520 GB/s, 0.54 of 960.
# Geometric mean 0.58 (0.54 for the middle of llama.cpp #20934's range). Read from those dense figures only, none of
# them in bench/published.json; its two figures on these cards (gh15396's RX 7900 XT, gg24546's W7800) were not used
# to set it (though 0.6 was tried on them first: bench/HISTORY.md, 2026-11-25 04:09-04:19, "The RDNA3 term"). Not
# applied to RDNA 3.5 (the Radeon 8060S: another chip and LPDDR5X, no such reading), nor to Vulkan builds on the same
# cards (no such reading either).
RDNA3_DGPU_BW = 0.58
_GPU_BW_BY_KIND = {("rocm", "rdna3"): RDNA3_DGPU_BW}


def gpu_bw_share(api: str, arch: str) -> float:
    """The share of peak bandwidth decode kernels read on a GPU of this api and arch (GPU_BW_SHARE unless a kind
    term says otherwise)."""
    return _GPU_BW_BY_KIND.get((api, arch), GPU_BW_SHARE)


# The int8 multiply-accumulates a core does per cycle in the CPU kernels of a quantized matmul, by the path its engine's
# build takes on the ISA (read from the sources, two vector multiply ports a core as on every part here):
#   llama.cpp (ggml-cpu/arch/x86/quants.c, mul_sum_us8_pairs_float and kin): 256-bit vectors on every x86 part; with
#     __AVX512VNNI__ + __AVX512VL__ (or __AVXVNNI__) one _mm256_dpbusd_epi32 multiplies and sums 32 byte pairs, else
#     _mm256_maddubs_epi16 then _mm256_madd_epi16 take two multiply slots for the same 32: 64 or 32 a cycle;
#   ik_llama.cpp (ggml/src/iqk: HAVE_FANCY_SIMD when AVX512F, VNNI, VL, BW and DQ are all there) 512-bit
#     _mm512_dpbusd_epi32: 128 a cycle on a part with two 512-bit multiply pipes (Intel Xeon, Zen 5 desktop and server:
#     flops_per_cycle 64), 64 where zmm runs in two 256-bit halves (Zen 4); without VNNI (Skylake-SP's AVX-512)
#     its AVX2 path, as llama.cpp's: 32.
# AMX-INT8 tiles (llama.cpp's ggml-cpu/amx buffer type) take dense matmuls only: amx_gemm_x below.
# The model's CPU compute_efficiency was fitted on Zen 4 and Zen 5 figures (AVX512-VNNI), so a part's rate is
# scaled by its MACs over those of an fp32 FMA datapath of the same width there (2 x flops_per_cycle).
def int8_macs_per_cycle(isa: str, wide: bool, engine: str) -> int:
    """int8 MACs a core does per cycle in `engine`'s quantized matmul on `isa` (wide: two 512-bit multiply pipes)."""
    if isa in ("avx2", "avx512"):
        return 32
    return 128 if engine == "ik_llama.cpp" and wide else 64


def cpu_int8_x(cpu, engine: str) -> float:
    """The factor on a CPU's fp32-based matmul rate (peak_gflops x compute_efficiency) for its ISA's int8 path in
    `engine` ("llama.cpp" or "ik_llama.cpp"); 1 where the ISA is not stated (the fitted parts' ratio)."""
    if not cpu.isa:
        return 1.0
    return int8_macs_per_cycle(cpu.isa, cpu.flops_per_cycle >= 64, engine) / (2 * cpu.flops_per_cycle)


# llama.cpp's AMX-INT8 tiles (ggml-cpu/amx): its AMX buffer type takes a weight only for a 2-D GGML_OP_MUL_MAT ("handle
# only 2d gemm for now", amx.cpp supports_op) of a type qtype_has_amx_kernels lists (amx/common.h: Q4_0, Q4_1, Q8_0,
# Q4_K, Q5_K, Q6_K, IQ4_XS) or F16, so routed experts (MUL_MAT_ID) never use it: only attention, shared experts and
# dense FFNs do. A batch's GEMM there against llama.cpp's own path without it: "the prompt eval time became 2x faster
# compared to no AMX supported commit" (llama.cpp PR 8998, gemma-2b Q4_0 on a Xeon with AMX): x2. A one-row matmul
# takes the file's VNNI path (decode: no change); ik_llama.cpp has no AMX path (its issue 437 asks for one).
AMX_TYPES = frozenset({"Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16"})
AMX_GEMM_X = 2.0


def amx_gemm_x(cpu, engine: str, type_name: str) -> float:
    """The factor on a dense (not routed) batched matmul of `type_name` weights for llama.cpp's AMX tiles (1: none)."""
    return AMX_GEMM_X if cpu.isa == "amx" and engine == "llama.cpp" and type_name in AMX_TYPES else 1.0


# One query's attention on the CPU without flash attention (decode: llama.cpp's KQ = mul_mat(K, q), softmax, KQV =
# mul_mat(V, KQ) over the f16 cache) runs far below the batched GEMM rate: measured, not read from any entry of
# bench/published.json. bench/RESULTS.md, "e2e.py -d against llama.cpp: depth to 32768", its run at c225e20
# (2026-11-28; EPYC Zen 5 VM, 2 cores, AVX-512; llama-cpp-python 0.3.36, a 6-layer Qwen3-30B-A3B-shaped Q4_K_M file,
# 32 query / 4 KV heads of 128, f16 KV, flash attention off: llama-cpp-python's Llama() default, which e2e.py kept;
# 2 threads): tg32 159.0 t/s at depth 0, 24.2 at 16384, so 16384 keys cost (1/24.2 - 1/159.0) / 6 = 5.84 ms a
# layer for 2 x 16384 x 32 x 256 = 268 MFLOP: 46 GFLOP/s, i.e. 8.85 FLOPs a core-cycle at the 2.596 GHz /proc/cpuinfo
# gives the VM (its clock under load is not visible there; at 3 GHz it would be 7.7). At 4096 and 32768 keys the same
# reading gives 7.5 and 9.7. The prompt's attention at depth (pp512, same section) runs at 154-167 GFLOP/s, 30-32 a
# core-cycle: the GEMM rate (0.47 x 64 = 30) within the clock's uncertainty, so a batch keeps that rate. One box, one
# ISA (AVX-512 with 512-bit datapaths), so one figure for every part, in FLOPs a cycle (its per-position softmax does
# not widen with the vectors); ik_llama.cpp's own CPU flash attention (iqk) keeps the GEMM rate: read on this box too
# (bench/RESULTS.md, "llama_cpu_attention.py"), its 2-core rates made the deep published prompts x1.2-2.6 faster and
# further off, so they are not taken for many-core parts.
LLAMA_CPU_ATTN_1Q_FPC = 2 * 16384 * 32 * 256 / ((1 / 24.2 - 1 / 159.0) / 6) / (2 * 2.596e9)

# Which of ggml's CPU flash-attention kernels runs (ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_f16) changed
# with llama.cpp's build and depends on the KV cache's type:
#   * a prompt's query rows (GGML_FA_TILE_Q = 64 or more) run flash_attn_ext_tiled since llama.cpp PR 19012
#     ("ggml-cpu: Use tiled FA for prompt-processing", 2026-01-22: "the FA performance is gimped on CPU for long
#     contexts because it essentially uses a vector kernel"; gpt-oss 20B pp512@d16384 25.12 -> 97.29 t/s on a 64-core
#     EPYC), its tiles SIMD GEMMs (the GEMM rate, above) since PR 19422 (below), and only with K and V both F16 or F32
#     ("use_tiled = ... kv_is_f32_or_f16 && k->type == v->type && neq1 >= Q_TILE_SZ": a q8_0 K or V, or one of each,
#     does not; llama.cpp PR 26948, quantized K/V in the tiled kernel, is still open). Otherwise every query row runs
#     the one-query kernel (LLAMA_CPU_ATTN_VEC);
#   * one query's positions are split over the threads (partial softmax sums, then a reduction) since PR 19209
#     ("ggml-cpu: FA split across kv for faster TG", 2026-01-30: "we only parallelize the query heads which can be <
#     n_threads"), for F16/F32 K and V of 512+ positions ("use_split_kv_path"). Before it, or over a q8_0 cache, a
#     token's attention keeps at most one thread a query head busy.
# The one-query kernel's rate falls with the positions each query head streams (its rows of K and V outgrow the caches:
# the kernel re-reads them for every query and head), so it is read at two depths, per cache type and build, with
# bench/llama_cpu_attention.py on this box (bench/RESULTS.md, "llama_cpu_attention.py: llama.cpp's CPU flash attention
# by build"; 2 threads, 32 query / 4 KV heads of 128): "old" llama-cpp-python 0.3.16 (llama.cpp 4227c9b, August
# 2025), "today" 0.3.36. (mean positions, FLOPs a core-cycle) at depth 4096 and 16384; between them log-log, flat
# below the first, continued beyond the second (an extrapolation: PR 19012's own table shows its speed-up still
# growing at 16384). A split decode runs the same rate a thread on every thread (on 2 threads and 32 heads the split
# changes nothing, so "today" is read there too). Without flash attention (-fa off, llama-cpp-python's default) ggml
# runs KQ and KQV as mul_mat, a GQA group's queries over one read of its K and V: decode at attn_1q_flops_per_cycle
# (above; 5.38 and 1.90 a core-cycle with flash attention at 4096 and 16384 positions against its 7.5 and 8.85, one
# query head at a time re-reading its group's rows), a batch at the GEMM rate.
LLAMA_CPU_TILED_FA = "2026-01-22"
LLAMA_CPU_SPLIT_KV_FA = "2026-01-30"
LLAMA_FA_Q_TILE = 64
# The first tiled kernel summed its tiles with ggml_vec_dot_f16 / ggml_vec_mad_f32; llama.cpp PR 19422 ("ggml-cpu: FA
# add GEMM microkernel", 2026-02-07) made them SIMD GEMMs, the kernel this box's 0.3.36 runs at the GEMM rate. PR
# 19422's table (64-core EPYC, gpt-oss 20B): pp512@d16384 88.44 -> 130.36 t/s, @d32768 56.46 -> 91.62, over pp512's
# 234.75 -> 237.96: the attention's time (what depth adds) x2.03 and x2.00 before it. So between the two PRs a prompt's
# attention runs at the GEMM rate / LLAMA_CPU_TILED_PRE_GEMM_X.
LLAMA_CPU_FA_GEMM = "2026-02-07"
LLAMA_CPU_TILED_PRE_GEMM_X = 2.0
LLAMA_CPU_ATTN_VEC = {
    ("prompt", "f16", "old"): ((4351.5, 8.669), (16639.5, 2.064)),
    ("prompt", "q8_0", "old"): ((4351.5, 3.799), (16639.5, 2.623)),
    ("prompt", "q8_0", "today"): ((4351.5, 4.94), (16639.5, 4.05)),
    ("decode", "f16", "old"): ((4103.5, 2.679), (16391.5, 1.895)),
    ("decode", "f16", "today"): ((4103.5, 5.38), (16391.5, 1.90)),
    ("decode", "q8_0", "old"): ((4103.5, 3.634), (16391.5, 3.193)),
    ("decode", "q8_0", "today"): ((4103.5, 4.20), (16391.5, 3.86)),
}


def vec_fpc(key: tuple[str, str, str], n_kv: float) -> float:
    """FLOPs a core-cycle of llama.cpp's one-query kernel (LLAMA_CPU_ATTN_VEC[key]) at `n_kv` positions."""
    (n0, r0), (n1, r1) = LLAMA_CPU_ATTN_VEC[key]
    if n_kv <= n0:
        return r0
    return r0 * math.exp(math.log(r1 / r0) * math.log(n_kv / n0) / math.log(n1 / n0))


@dataclass(frozen=True)
class LlamaCpuAttention:
    """Which CPU attention kernels a llama.cpp build runs over its KV cache: `cache` "f16" (F16 or F32 K and V) or
    "q8_0" (any quantized cache), `tiled` and `split` the build's (PR 19012's, PR 19209's), `decode_fpc` the CPU
    part's one-query rate without flash attention (attn_1q_flops_per_cycle; 0: no term, the GEMM rate throughout)."""

    cache: str
    tiled: bool
    split: bool
    decode_fpc: float
    old: bool                          # a build before the kernel the cache's one-query rate was read on (today's)
    tiled_x: float = 1.0               # the tiled kernel's time over the GEMM rate's (before PR 19422: x2)
    flash: bool = True                 # -fa on; off: ggml's mul_mat attention (decode at decode_fpc, batches GEMM)

    def gflops(self, rate: float, cpu, threads: int, batch: int, heads: int, n_kv: float) -> float:
        """GFLOP/s of the attention of `batch` queries of `heads` heads over `n_kv` positions: `rate` (the GEMM's)
        or the kernel's that runs."""
        if not self.decode_fpc:
            return rate
        workers, era = min(threads, cpu.cores), "old" if self.old else "today"
        if not self.flash:                 # KQ and KQV as mul_mat: one query at the CPU part's rate, a batch the GEMM's
            return min(rate, workers * cpu.ghz * self.decode_fpc) if batch == 1 else rate
        if batch == 1:
            workers = workers if self.split else min(workers, heads)
            return min(rate, workers * cpu.ghz * vec_fpc(("decode", self.cache, era), n_kv))
        if self.tiled and batch >= LLAMA_FA_Q_TILE:
            return rate / self.tiled_x
        era = "old" if self.cache == "f16" else era      # F16 rows off the tiles: 64 rows short (no other reading)
        return min(rate, workers * cpu.ghz * vec_fpc(("prompt", self.cache, era), n_kv))


def llama_cpu_attention(cpu, build: str = "", kv_bytes: float = 2, flash: bool = True) -> LlamaCpuAttention:
    """llama.cpp's CPU attention for a build of that date ("": today's) over K and V of `kv_bytes` a value (2: F16, 4:
    F32; anything else, e.g. q8_0's 34/32, takes the one-query kernel), with flash attention (-fa) on or off."""
    f16 = kv_bytes in (2, 4)

    def before(date: str) -> bool:
        return bool(build) and build < date
    return LlamaCpuAttention("f16" if f16 else "q8_0", f16 and not before(LLAMA_CPU_TILED_FA),
                             f16 and not before(LLAMA_CPU_SPLIT_KV_FA), cpu.attn_1q_flops_per_cycle,
                             before(LLAMA_CPU_TILED_FA),
                             LLAMA_CPU_TILED_PRE_GEMM_X if before(LLAMA_CPU_FA_GEMM) else 1.0, flash)

# The share of the data sheet's DRAM bandwidth a many-core server part's cores read, by generation, where a measurement
# of that platform was read (else MANY_CHANNEL_BW_SHARE below, 0.45: an Intel mlc figure of a dual EPYC 9965, 256 GiB/s
# of 12 x DDR5-6400 a socket, ik_llama.cpp PR 612):
#   Skylake-SP (Cascade Lake keeps its mesh and memory controllers): John McCalpin's 2-socket Xeon Platinum 8160,
#     "Local Bandwidth for Reads (each socket) ~112 GB/s" of 6 x DDR4-2666 = 128 GB/s (stackoverflow.com question
#     47995130, the answer the socket links below come from): 0.875.
# Not taken: Granite Rapids' mlc figure (a 6980P "benchmarked ~512GB/s RAM bandwidth" a socket, 0.83 of 614.4,
# ik_llama.cpp PR 534), because the same post finds llama.cpp's decode "not saturating the expected ~512GB socket RAM
# bandwidth during generation" there (so it keeps the stand-in); Sapphire Rapids, Ice Lake and Zen 2-4: no reading of
# the platform; McCalpin's multi-core STREAM across generations is "75%-85% of the peak DRAM bandwidth" ('Single-core
# memory bandwidth', 2025), above what llama.cpp's decode reads on the many-core parts of bench/published.json's
# training figures (EPYC 9B14, Threadripper PRO 5975WX: predicted too fast at 0.45 already).
SERVER_READ_SHARE = {"skylake-sp": 112 / 128, "cascade-lake": 112 / 128}
# A desktop's cores saturate its two channels: 0.7 (hardware.CPU's bw_efficiency); the cores of an 8-12 channel server
# or workstation part do not: 0.45, the EPYC 9965 mlc figure above ("mlc clocks it at around 256GiB/s RAM bandwidth per
# socket", against 12 x DDR5-6400 = 614 GB/s), not fitted on bench/published.json.
CPU_BW_SHARE = 0.7
MANY_CHANNEL_BW_SHARE = 0.45


def cpu_bw_share(cpu) -> float:
    """The share of peak DRAM bandwidth the cores of a CPU of this kind read: its generation's server reading, the
    many-channel share (8+ channels a socket, server or workstation), or the desktop default."""
    if cpu.tier == "server" and cpu.generation in SERVER_READ_SHARE:
        return SERVER_READ_SHARE[cpu.generation]
    many = cpu.tier in ("server", "workstation") and cpu.mem_channels >= 8 * max(cpu.sockets, 1)
    return MANY_CHANNEL_BW_SHARE if many else CPU_BW_SHARE


# One core's DRAM read rate is its misses in flight over the latency (Little's law: John McCalpin, "Single-core memory
# bandwidth: latency, bandwidth and concurrency", 2025), not a share of the socket's channels: fewer threads than cores
# read min(threads x a core's rate, the socket's share), saturating at a few threads where a linear share would lose
# three quarters of the bandwidth at a quarter of the cores. Read on Intel's mesh server parts: one core of a Xeon Gold
# 5512U (Emerald Rapids, 28 cores, 8 x DDR5-4800 = 307 GB/s, 2.1 GHz with turbo off) streams 18.5 GB/s of sequential
# reads ("read_thp", DRAM) at 99 ns of latency (2 MiB pages): ~29 lines in flight (github.com/joshliu14/cpu-inference,
# results/2026-10-05_microbench/processed/machine_model.json). Sapphire Rapids (Golden Cove, the same core, L2 and
# mesh) and Granite Rapids (Redwood Cove) take the same reading: an extrapolation (a many-tile part's higher latency
# would lower it; it binds only below the socket's share over 18.5 GB/s, 12 threads on a Xeon 6980P). Chosen after the
# held-out Xeon 6980P and QYFS figures showed decode at 32-64 threads as fast as at all cores (bench/published.json:
# they are in sample for this term); other kinds keep the linear share (AMD's: by CCD link, hardware.CPU.read_gbs).
CORE_READ_GBS = {"sapphire-rapids": 18.5, "emerald-rapids": 18.5, "granite-rapids": 18.5}


def core_read_gbs(cpu) -> float:
    """GB/s one core of `cpu` reads from DRAM by its kind (0: no reading for its kind)."""
    return CORE_READ_GBS.get(cpu.generation, 0.0) if cpu.vendor == "intel" and cpu.tier == "server" else 0.0


# Zen 5's server IO die has 16 GMI links, and a part of at most 8 CCDs joins each CCD by two ("GMI-Wide": "giving
# each CCD 64B/cycle of bandwidth to the rest of the system in both the read and write directions", chipsandcheese.com,
# "AMD's EPYC 9355P: Inside a 32 Core Zen 5 Server Chip"): a CCD then reads twice the 32 B a fabric clock of one link.
GMI_LINKS = {"zen5": 16}


def gmi_links_per_ccd(cpu) -> int:
    """GMI links joining each CCD of `cpu` to its IO die: 2 on a Zen 5 server part of at most 8 CCDs a socket, else
    1."""
    links = GMI_LINKS.get(cpu.generation, 0) if cpu.tier == "server" else 0
    per_socket = cpu.ccds // max(cpu.sockets, 1)
    return 2 if per_socket and links // per_socket >= 2 else 1


# Reads from the other socket's memory cross the links between the sockets. John McCalpin's measurement on a 2-socket
# Xeon Platinum 8160 (Skylake-SP, 2 UPI links between the chips): "Local Bandwidth for Reads (each socket) ~112 GB/s",
# "Remote Bandwidth for Reads (one-direction at a time) ~34 GB/s" (stackoverflow.com question 47995130, "Memory
# bandwidth for many channels x86 systems", answer). Two UPI links at 10.4 GT/s carry 2 x 20.8 GB/s each way (2 bytes a
# transfer: Intel's Xeon Scalable platform brief), so remote reads get 34 / 41.6 = 0.82 of the links' peak; other
# platforms get that share of theirs, from the data sheets' link counts and rates: Sapphire Rapids 4 UPI 2.0 links at
# 16 GT/s, Granite Rapids-AP 6 at 24 GT/s (ark.intel.com Xeon 8480+ / 6980P), EPYC 9004/9005 4 xGMI links of 16 lanes
# at 32 Gb/s (AMD EPYC 9004 architecture overview). Per direction, between two sockets; no entry: not modelled.
REMOTE_READ_SHARE = 34 / 41.6
SOCKET_LINK_GBS = {"skylake-sp": 41.6, "cascade-lake": 41.6, "sapphire-rapids": 4 * 32.0,
                   "emerald-rapids": 4 * 32.0, "granite-rapids": 6 * 48.0, "zen4": 4 * 64.0, "zen5": 4 * 64.0}


def remote_read_gbs(cpu) -> float:
    """GB/s one socket's cores read from another socket's memory (0: not known for this generation)."""
    return SOCKET_LINK_GBS.get(cpu.generation, 0.0) * REMOTE_READ_SHARE if cpu.tier == "server" else 0.0


def check(part, allowed: dict[str, tuple[str, ...]], error) -> None:
    """`error` (an exception class) if a kind field of `part` is neither empty nor one of its allowed values."""
    for name, values in allowed.items():
        v = getattr(part, name)
        if v and v not in values:
            raise error(f"{type(part).__name__} {part.name!r}: {name}={v!r} is not a kind moert knows; use one of "
                        f"{', '.join(values)} (or leave it empty: not stated)")


__all__ = ["AMX_GEMM_X", "AMX_TYPES", "CORE_READ_GBS", "CPU_BW_SHARE", "CPU_FIELDS", "CPU_GENERATIONS", "CPU_ISAS",
           "CPU_TIERS", "CPU_VENDORS", "GMI_LINKS", "GPU_APIS", "GPU_ARCHS", "GPU_BW_SHARE", "GPU_FIELDS", "GPU_MEMORY",
           "GPU_TIERS", "LLAMA_CPU_ATTN_1Q_FPC", "LLAMA_CPU_ATTN_VEC", "LLAMA_CPU_FA_GEMM", "LLAMA_CPU_SPLIT_KV_FA",
           "LLAMA_CPU_TILED_FA", "LLAMA_CPU_TILED_PRE_GEMM_X", "LLAMA_FA_Q_TILE", "LlamaCpuAttention",
           "MANY_CHANNEL_BW_SHARE", "RDNA3_DGPU_BW", "REMOTE_READ_SHARE", "SERVER_READ_SHARE", "SOCKET_LINK_GBS",
           "amx_gemm_x", "check", "core_read_gbs", "cpu_bw_share", "cpu_int8_x", "gmi_links_per_ccd", "gpu_bw_share",
           "int8_macs_per_cycle", "llama_cpu_attention", "remote_read_gbs", "vec_fpc"]
