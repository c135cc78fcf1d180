"""Hardware you may not have: a CPU, GPUs and the link between them, as spec-sheet figures.

    hw = moert.hardware.preset("rtx3090+ryzen-7950x")      # GPU + CPU (+ link: the slower PCIe of the two)
    hw = moert.Hardware(cpu=moert.CPU("my box", 8, 76.8), gpus=[moert.GPU("my card", 12, 504, 58)],
                        link=moert.Link(31.5, 10))
    cpu = moert.hardware.calibrate()                        # this machine's CPU side, measured (calibrate.py)

The preset parts are in presets.py; a machine from a name or a JSON file in machines.py.

Figures are the vendors' peaks: a CPU's memory bandwidth is channels x MT/s x 8 bytes (a DDR channel is
64 bits wide), a GPU's is its data-sheet figure, a link's is PCIe lanes x GT/s x 128/130 / 8 per direction.
What a program really gets is a share of the peak; those shares (the `*_efficiency` fields) are the cost
model's assumptions, each default documented where it is set, and meant to be fitted to measurements.
A calibrated CPU carries measured rates instead (`kernel_gbs`, `kernel_gflops`, overheads).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from moert.cost import kinds
from moert.errors import MoertError


class HardwareError(MoertError, ValueError):
    """An unknown hardware preset, or a figure that cannot be right (zero bandwidth, negative cores)."""


# ------------------------------------------------------------------------------------------ the parts

@dataclass(frozen=True)
class CPU:
    """A CPU and its memory: peak figures, the model's efficiency factors, and measured rates if calibrated."""

    name: str
    cores: int                          # physical cores (threads default to this)
    mem_bw_gbs: float                   # peak DRAM bandwidth, GB/s (1e9 B/s): channels x MT/s x 8 bytes
    mem_channels: int = 0               # 64-bit DDR channels (0: unknown)
    mem_mts: int = 0                    # DDR transfers per second, millions
    ddr: int = 5                        # DDR generation (for the listing)
    mem_label: str = ""                 # the listing's memory column where "channels x DDRn-MT/s" is not it
    mem_gib: float = 0.0                # installed RAM, GiB (0: not given; moert/cost/capacity.py then assumes
                                        # a typical size for the memory channels and says so; --ram sets it)
    ghz: float = 3.0                    # all-core clock under load
    flops_per_cycle: int = 32           # fp32 FLOPs per core per cycle: 2 FMA units x 8 lanes x 2 (AVX2/Zen 4)
    # The share of peak DRAM bandwidth a many-thread read stream gets; 0: its kind's (kinds.cpu_bw_share). 0.7 for a
    # desktop: DDR5 read tests land at 60-65 GB/s of 83-90 GB/s peak (a one-CCD part is capped by its CCD link too).
    # CPU-only decode on a Ryzen 7950X and an EPYC 9B14 in bench/published.json lands at -19%..+13% of it; with a GPU
    # beside it decode is slower by box-dependent amounts (bench/HISTORY.md, 2026-11-23 to 2026-11-24).
    bw_efficiency: float = 0.0
    # AMD chiplet CPUs: the cores read DRAM through a link per CCD (two on some: kinds.gmi_links_per_ccd) to the I/O
    # die, 32 bytes per fabric clock (FCLK) each way (Zen 2-5 Infinity Fabric; "32 bytes per cycle in both directions"
    # for Strix Halo's link too): at most ccds x 32 B x FCLK, below the DRAM's peak on a one-CCD Ryzen with fast DDR5 or
    # Strix Halo's LPDDR5X. 0: no such cap (Intel, or unknown). A one-CCD 7800X3D with DDR5-6000 reads "about 64 GB/s
    # [...] (Limited by 1 CCD)" (llama.cpp PR 13435), i.e. 32 B x 2.0 GHz.
    ccds: int = 0
    fclk_ghz: float = 0.0
    # NUMA nodes the cores and memory channels divide into: sockets (x NPS / SNC domains where a source states them).
    # The figures are the machine's; `sockets(cpu, n)` makes such a CPU, `numa_view` what llama.cpp's --numa sees.
    numa_nodes: int = 1
    numa_read_gbs: float = 0.0          # the most a run reads with its pages on one node (numa_view "none"); 0: none
    # The share of peak fp32 FLOPs a quantized batched matmul gets: 0.47, fitted by bench/validate_published.py (its
    # cpu_compute factor, x1.18 on 0.4 once a CPU part's reads and MACs add: roofline.CPU_ADDS) on the CPU-only prefill
    # figures of bench/published.json (5 figures, 3 sources; ik_llama.cpp's: predict.py IK_CPU_GEMM_X).
    compute_efficiency: float = 0.47
    call_us: float = 2.0                # fixed cost of one op (its call and ggml's per-node barrier: a few us), and
    barrier_us_per_thread: float = 0.0  # per thread: the barrier growing with them (roofline.op_us; 0: not modelled)
    attn_1q_flops_per_cycle: float = kinds.LLAMA_CPU_ATTN_1Q_FPC  # llama.cpp's decode attention (0: GEMM rate)
    layer_us: float = 0.0               # fixed cost per layer per forward beyond the ops (moert: Python glue)
    token_us: float = 0.0               # fixed cost per forward call (embedding, logits, bookkeeping)
    # Measured, per thread: (("Q4_K", GB/s of weights one thread's matvec streams), ("Q4_K/int8", ...), ...)
    # and (("Q4_K", GFLOP/s of one thread's batched matmul), ...). Empty: kernels keep up with memory.
    kernel_gbs: tuple[tuple[str, float], ...] = ()
    kernel_gflops: tuple[tuple[str, float], ...] = ()
    bw_1thread_gbs: float = 0.0         # one thread's DRAM read rate: measured, else its kind's (kinds.core_read_gbs)
    source: str = ""                    # where the figures come from
    # What kind of part it is (moert/cost/kinds.py; "" = not stated): terms of a kind apply to any CPU of it, and
    # moert's coverage classes (moert/cost/coverage.py) say how many published figures a kind has.
    vendor: str = ""                    # "amd", "intel"
    generation: str = ""                # microarchitecture: "zen4", "cascade-lake", "granite-rapids", ...
    isa: str = ""                       # widest int8 dot path llama.cpp takes: "avx2", "avx512", "avx512-vnni", "amx"
    tier: str = ""                      # "consumer", "workstation", "server"
    sockets: int = 1                    # CPU packages (`sockets(cpu, n)` makes n of one)

    def __post_init__(self):
        _positive(self, "cores", "mem_bw_gbs", "ghz", "flops_per_cycle", "numa_nodes", "sockets")
        kinds.check(self, kinds.CPU_FIELDS, HardwareError)
        _not_negative(self, "mem_channels", "mem_mts", "mem_gib", "call_us", "layer_us", "token_us", "bw_1thread_gbs",
                      "ccds", "fclk_ghz", "numa_read_gbs", "barrier_us_per_thread", "attn_1q_flops_per_cycle")
        if self.bw_efficiency == 0:                          # not given: the share of the part's kind
            object.__setattr__(self, "bw_efficiency", kinds.cpu_bw_share(self))
        if self.bw_1thread_gbs == 0:                         # not measured: a core's rate on the part's kind, if read
            object.__setattr__(self, "bw_1thread_gbs", kinds.core_read_gbs(self))
        _share(self, "bw_efficiency", "compute_efficiency")
        if (self.ccds > 0) != (self.fclk_ghz > 0):
            raise HardwareError(f"CPU {self.name!r}: ccds and fclk_ghz go together (both > 0, or both 0 for no "
                                f"fabric cap); got ccds={self.ccds!r}, fclk_ghz={self.fclk_ghz!r}")

    @property
    def fabric_gbs(self) -> float:
        """The cores' read cap through the CCD links: ccds x 32 bytes x FCLK x links a CCD, GB/s (0: none modelled)."""
        return self.ccds * self.ccd_gbs

    @property
    def ccd_gbs(self) -> float:
        """One CCD's read cap: 32 bytes a fabric clock over each of its GMI links (two on kinds.gmi_links_per_ccd)."""
        return 32 * self.fclk_ghz * kinds.gmi_links_per_ccd(self)

    @property
    def peak_gflops(self) -> float:
        """fp32 peak: cores x GHz x FLOPs per cycle."""
        return self.cores * self.ghz * self.flops_per_cycle

    def read_gbs(self, threads: int | None = None) -> float:
        """GB/s `threads` threads stream from DRAM: the DRAM's share (at most the CCD links'), or a thread's x n."""
        n = self._threads(threads)
        whole = self.mem_bw_gbs * self.bw_efficiency
        if self.fabric_gbs:
            whole = min(whole, self.fabric_gbs)
        if self.bw_1thread_gbs:
            rate = min(whole, n * self.bw_1thread_gbs)
        elif self.ccds:
            # threads fill CCDs in order (llama.cpp pins none; Linux spreads over the first cores), and a CCD's link
            # reads 32 B x FCLK whether one or all of its cores stream: fewer threads than cores lose only the links
            # of the CCDs they leave idle, not a proportional share (a 96-core EPYC at 44 threads keeps 6 of 12 links)
            active = min(self.ccds, math.ceil(n * self.ccds / self.cores))
            rate = min(whole, active * self.ccd_gbs)
        else:
            rate = whole * n / self.cores
        return min(rate, self.numa_read_gbs) if self.numa_read_gbs else rate

    def matvec_gbs(self, type_name: str, threads: int | None = None, act_quant: str | None = None) -> float:
        """GB/s of `type_name` weights a one-token matmul reads on `threads` threads (kernel or DRAM bound)."""
        n = self._threads(threads)
        per = dict(self.kernel_gbs)
        rate = per.get(f"{type_name}/{act_quant}") if act_quant else None
        rate = rate or per.get(type_name) or per.get("*")
        return min(self.read_gbs(n), n * rate) if rate else self.read_gbs(n)

    def matmul_gflops(self, type_name: str, threads: int | None = None, act_quant: str | None = None,
                      tokens: float = 64) -> float:
        """GFLOP/s a matmul of `tokens` tokens by `type_name` weights reaches on `threads` threads (measured
        rates: "TYPE" at 64 tokens, "TYPE@8" at 8, "TYPE/int8" with int8 activations; between, interpolated)."""
        n = self._threads(threads)
        per = dict(self.kernel_gflops)
        key = f"{type_name}/{act_quant}" if act_quant and f"{type_name}/{act_quant}" in per else type_name
        rate = per.get(key) or per.get("*")
        small = per.get(f"{key}@8")
        if rate and small and tokens < 64:           # log-linear between the 8- and 64-token rates
            w = min(max(math.log(max(tokens, 1) / 8) / math.log(8), 0.0), 1.0)
            rate = small * (rate / small) ** w
        return n * rate if rate else self.peak_gflops * self.compute_efficiency * n / self.cores

    def _threads(self, threads: int | None) -> int:
        """Threads that add work: at most the physical cores (an SMT sibling shares its core's FMA units and load
        ports; llama.cpp's default is the physical cores, common.cpp cpu_get_num_math; users find more threads no
        faster: llama.cpp issue 6434, a 96-core EPYC 9654 peaks at about 60 threads, memory-bound)."""
        n = self.cores if threads is None else int(threads)
        if n < 1:
            raise HardwareError(f"{self.name}: threads must be >= 1, got {threads}")
        return min(n, self.cores)


@dataclass(frozen=True)
class GPU:
    """A GPU: memory size, peak bandwidth and tensor-core FLOPs, and the model's efficiency factors."""

    name: str
    mem_gib: float                      # memory, GiB as sold ("24 GB" cards have 24 GiB)
    bw_gbs: float                       # peak memory bandwidth, GB/s (data sheet)
    fp16_tflops: float                  # dense FP16 tensor-core TFLOPS with FP32 accumulate (data sheet)
    int8_tops: float = 0.0              # dense INT8 tensor-core TOPS (llama.cpp's MMQ kernels use these)
    pcie_gen: int = 4                   # the slot generation the card speaks
    pcie_lanes: int = 16                # electrical lanes (the RTX 4060 has 8)
    # The share of peak bandwidth decode kernels get; 0: the share of the card's kind (kinds.gpu_bw_share of its api
    # and arch: 0.8 for CUDA, ROCm's 0.58 on RDNA3), set when the GPU is made.
    bw_efficiency: float = 0.0
    # The share of dense tensor-core peak a prefill GEMM of quantized weights gets (llama.cpp's MMQ: dequantize +
    # int8 mma, activation quantization, the MoE gather) at full tiles: 0.21, fitted by bench/validate_published.py (its
    # gpu_compute factor, 0.52 x the earlier assumed 0.4) on the all-GPU prefill figures of bench/published.json (21
    # figures, 7 sources, NVIDIA and AMD, u-batch 512-4096; out of sample, leaving each source out, 18%). Tiles that
    # routed experts do not fill cost more on top (moert/cost/predict.py tile_fill).
    compute_efficiency: float = 0.21
    # Per-kernel fixed cost: a launch is ~2-5 us; llama.cpp replays decode graphs with CUDA graphs, which
    # brings the per-node cost to ~2 us (the assumption here).
    launch_us: float = 2.0
    # Per-kernel cost when decode cannot replay a graph (moert/cost/launch.py: llama.cpp before PR 18934 turns
    # graphs off for a token with CPU splits): a plain launch, the top of the ~2-5 us above. Launches overlap the
    # kernels, so a split costs max(its replayed time, its kernels x this). An assumption, not fitted on any figure
    # (llama.cpp PR 18934's graph/no-graph deltas would want 6-9 us; bench/HISTORY.md, published figures, 2026-11-24).
    launch_us_nograph: float = 5.0
    # Memory the CUDA context, cuBLAS workspace and driver take before any tensor: ~0.3-0.6 GiB on these cards
    # (what nvidia-smi shows for an idle llama.cpp process); moert.fit keeps 512MiB free on CUDA for the same.
    reserved_gib: float = 0.5
    source: str = ""
    # What kind of card it is (moert/cost/kinds.py; "" = not stated): terms of a kind apply to any GPU of it.
    api: str = ""                       # llama.cpp's backend for it: "cuda", "rocm", "vulkan", "metal"
    arch: str = ""                      # "ampere", "ada", "hopper", "blackwell", "rdna3", ...
    memory: str = ""                    # "gddr6", "gddr6x", "gddr7", "hbm2e", "hbm3", "lpddr5x", "unified"
    tier: str = ""                      # "consumer", "workstation", "datacenter"

    def __post_init__(self):
        kinds.check(self, kinds.GPU_FIELDS, HardwareError)
        if self.bw_efficiency == 0:                          # not given: the share of the card's kind
            object.__setattr__(self, "bw_efficiency", kinds.gpu_bw_share(self.api, self.arch))
        _positive(self, "mem_gib", "bw_gbs", "fp16_tflops", "launch_us_nograph", "pcie_lanes")
        _share(self, "bw_efficiency", "compute_efficiency")
        _not_negative(self, "int8_tops", "launch_us", "reserved_gib")
        if self.pcie_gen not in PCIE_GT_S:
            raise HardwareError(f"GPU {self.name!r}: pcie_gen must be one of {', '.join(map(str, PCIE_GT_S))}, "
                                f"got {self.pcie_gen!r}")

    @property
    def mem_bytes(self) -> int:
        return int(self.mem_gib * (1 << 30))

    def read_gbs(self) -> float:
        """Bytes per ns decode kernels stream."""
        return self.bw_gbs * self.bw_efficiency

    def matmul_tflops(self) -> float:
        """Tera-FLOP/s a prefill GEMM reaches: the int8 path if the card has one, else FP16."""
        peak = max(self.fp16_tflops, self.int8_tops / 2)  # an int8 MMQ tile does half the work of its TOPS
        return peak * self.compute_efficiency


# ------------------------------------------------------------------------------------------ NUMA

# llama.cpp's --numa (common/arg.cpp): "distribute: spread execution evenly over all nodes; isolate: only spawn
# threads on CPUs on the node that execution started on; numactl: use the CPU map provided by numactl"; "none"
# is moert's name for giving no --numa (llama.cpp's default).
NUMA_MODES = ("none", "distribute", "isolate", "numactl")
MAX_SOCKETS = 8


def sockets(cpu: CPU, n: int) -> CPU:
    """A machine of n sockets of `cpu`, one NUMA node each: n times its cores, channels, bandwidth and RAM."""
    if not 1 <= n <= MAX_SOCKETS:
        raise HardwareError(f"{n}x {cpu.name}: a socket count goes from 1 to {MAX_SOCKETS}")
    if n == 1:
        return cpu
    return replace(cpu, name=f"{n}x {cpu.name}", cores=cpu.cores * n, mem_bw_gbs=cpu.mem_bw_gbs * n,
                   sockets=cpu.sockets * n, mem_channels=cpu.mem_channels * n, mem_gib=cpu.mem_gib * n,
                   ccds=cpu.ccds * n, numa_nodes=cpu.numa_nodes * n, source=f"{n} sockets of: {cpu.source}")


def numa_view(cpu: CPU, numa: str = "none") -> CPU:
    """What a llama.cpp run sees of a CPU of several NUMA nodes, by its --numa mode (NUMA_MODES):
      * "isolate", "numactl" (pinned to one node, as `numactl -N 0 -m 0`): one node's cores, channels and RAM;
      * "none" (no --numa, the default): every core, but the mmap'd weights sit in the page cache where they were
        first read, so the run reads at most one node's DRAM bandwidth; on several sockets the other sockets'
        threads, (s - 1) / s of the work, reach it through the socket links (kinds.remote_read_gbs), so the whole
        reads at most remote x s / (s - 1) (numa_read_gbs); each thread reads at a core's rate, so -t 20 on two
        20-core sockets reads what 20 cores read (so too --no-mmap's weights, first-touched by the loading thread);
      * "distribute" with the pages first read by the threads that use them: every node's bandwidth.
    Read from: llama.cpp issue 11744 (dual EPYC 9175F, 16 x DDR5-6400, Llama-3.1-70B f16: tg 2.4 t/s by default,
    4.31 with --numa distribute and the page cache filled by the tg threads after drop_caches: x1.8 against this
    model's x2), and llamafile issue 765 (2 x Xeon 5218: 4 t/s spanning both sockets, 8 pinned to one with
    numactl --cpunodebind=1 --membind=1: with the socket links, spanning two such sockets reads at most 2 x 34 =
    68 GB/s where one socket's cores read ~112 locally (McCalpin's figures, kinds.py), so slower than pinned, as
    measured, where the model without the links said equal; it binds only where a node's share is above it).
    Neither is an entry of bench/published.json (dense models moert's zoo lacks); one node is the identity."""
    if numa not in NUMA_MODES:
        raise HardwareError(f"numa={numa!r}: one of {', '.join(NUMA_MODES)} (llama.cpp's --numa; none: not given)")
    k = cpu.numa_nodes
    if k == 1 or numa == "distribute":
        return cpu
    if numa == "none":
        # cores and rates stay the machine's: a core's read rate is its own (its misses in flight over the latency,
        # McCalpin's "Little's Law" for single-core bandwidth), up to the one node that holds the pages
        cap = cpu.mem_bw_gbs / k * cpu.bw_efficiency
        if cpu.sockets > 1 and kinds.remote_read_gbs(cpu):      # the other sockets read through the links
            cap = min(cap, kinds.remote_read_gbs(cpu) * cpu.sockets / (cpu.sockets - 1))
        return replace(cpu, numa_read_gbs=min(cap, cpu.numa_read_gbs or cap))
    return replace(cpu, mem_bw_gbs=cpu.mem_bw_gbs / k, mem_channels=cpu.mem_channels // k, numa_nodes=1,
                   cores=max(1, cpu.cores // k), ccds=cpu.ccds // k, mem_gib=cpu.mem_gib / k,
                   sockets=max(1, cpu.sockets // k))


# DRAM passes of a copy from pageable memory through the driver's pinned staging array (Link.staged): the read of
# the weights and the write of the staging array, as STREAM's Copy counts a copy's bytes (read + written); the DMA's
# read of the array just written is served from the CPU's last-level cache (Intel DDIO; the lines are still there)
# and is not counted. A count from the mechanism, not a fit, but chosen knowing the figures: it was written after
# seeing the carteakey figure in bench/published.json (op offload from DDR5 at 2000 MT/s, in sample for it), and
# 3 passes (the DMA read from DRAM too) made the training figures on Ryzen 7950X boxes 15-20% slower, against them.
STAGED_PASSES = 2


@dataclass(frozen=True)
class Link:
    """The host <-> GPU link: bandwidth per direction and the fixed cost of one copy."""

    bw_gbs: float                       # peak per direction, GB/s
    latency_us: float = 10.0            # one small cudaMemcpy (launch + DMA setup + sync): ~5-10 us measured
    name: str = ""
    # Pinned-memory copies reach ~80-85% of the PCIe peak (bandwidthTest: ~25-26 GB/s on 4.0 x16 = 31.5).
    efficiency: float = 0.8

    def __post_init__(self):
        _positive(self, "bw_gbs")
        _share(self, "efficiency")
        _not_negative(self, "latency_us")

    def seconds(self, nbytes: float, copies: int = 1) -> float:
        """Time of `copies` copies moving `nbytes` in total."""
        return copies * self.latency_us * 1e-6 + nbytes / (self.bw_gbs * self.efficiency * 1e9)

    def staged(self, cpu: CPU) -> Link:
        """This link copying from pageable host memory: what op offload does with llama.cpp's and ik_llama.cpp's
        mmap'd weights (their default). llama.cpp's loader puts CPU weights in the GPU backend's pinned host buffer
        only without mmap (src/llama-model.cpp: "avoid using a host buffer when using mmap"); ik_llama.cpp pins the
        mapping only with GGML_CUDA_REGISTER_HOST set (ggml-cuda.cu, ggml_backend_cuda_register_host_buffer). From
        pageable memory "the CUDA driver must first allocate a temporary page-locked, or pinned, host array, copy
        the host data to the pinned array, and then transfer the data from the pinned array to device memory"
        (NVIDIA, "How to Optimize Data Transfers in CUDA C/C++"): each byte crosses the host's DRAM STAGED_PASSES
        times (the read of the weights, the write of the staging array), so the copy runs at most at
        the CPU's achieved DRAM rate / STAGED_PASSES: slower than the PCIe link on a desktop with slow or
        dual-channel DRAM, no change on a many-channel server."""
        dram = cpu.mem_bw_gbs * cpu.bw_efficiency / STAGED_PASSES
        if dram >= self.bw_gbs * self.efficiency:
            return self
        return replace(self, efficiency=dram / self.bw_gbs, name=f"{self.name}, pageable")

    @staticmethod
    def pcie(gen: int, lanes: int = 16) -> Link:
        """A PCIe slot's link: its peak per direction (pcie_gbs) and 10 us a copy."""
        return Link(pcie_gbs(gen, lanes), 10.0, f"pcie{gen}x{lanes}")


@dataclass(frozen=True)
class Hardware:
    """One machine: a CPU, zero or more GPUs (GPU i is cuda:i / sim:i) and the link they share."""

    cpu: CPU
    gpus: tuple[GPU, ...] = ()
    link: Link | None = None
    name: str = ""

    def __post_init__(self):
        object.__setattr__(self, "gpus", tuple(self.gpus))
        if self.gpus and self.link is None:
            g = min(self.gpus, key=lambda g: pcie_gbs(g.pcie_gen, g.pcie_lanes))
            object.__setattr__(self, "link", Link.pcie(g.pcie_gen, g.pcie_lanes))
        if not self.name:
            object.__setattr__(self, "name", "+".join([*(g.name for g in self.gpus), self.cpu.name]))

    def gpu_memory(self) -> list[str]:
        """The GPUs' sizes as moert.plan's gpu_memory (sim GPUs of the same sizes): "24GiB", or bytes where a
        short GiB figure would round (a size set with --gpu-mem 1536MiB or 1KiB)."""
        out = []
        for g in self.gpus:
            short = f"{g.mem_gib:g}"
            exact = "e" not in short and int(float(short) * 2**30) == g.mem_bytes
            out.append(f"{short}GiB" if exact else str(g.mem_bytes))
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def _positive(obj: Any, *names: str) -> None:
    for n in names:
        if not getattr(obj, n) > 0:
            raise HardwareError(f"{type(obj).__name__} {getattr(obj, 'name', '')!r}: {n} must be > 0, "
                                f"got {getattr(obj, n)!r}")


def _not_negative(obj: Any, *names: str) -> None:
    for n in names:
        if not getattr(obj, n) >= 0:
            raise HardwareError(f"{type(obj).__name__} {getattr(obj, 'name', '')!r}: {n} must be >= 0, "
                                f"got {getattr(obj, n)!r}")


def _share(obj: Any, *names: str) -> None:
    for n in names:
        if not 0 < getattr(obj, n) <= 1:
            raise HardwareError(f"{type(obj).__name__} {getattr(obj, 'name', '')!r}: {n} is a share of the "
                                f"peak, in (0, 1]; got {getattr(obj, n)!r}")


def ddr_gbs(channels: int, mts: int) -> float:
    """Peak DRAM bandwidth: channels x MT/s x 8 bytes (a 64-bit channel), in GB/s."""
    return channels * mts * 8 / 1000


PCIE_GT_S = {3: 8.0, 4: 16.0, 5: 32.0}     # GT/s per lane of the PCIe generations with 128b/130b encoding


def pcie_gbs(gen: int, lanes: int = 16) -> float:
    """Peak PCIe bandwidth per direction: lanes x GT/s x 128/130 (encoding) / 8 bits, in GB/s."""
    return lanes * PCIE_GT_S[gen] * 128 / 130 / 8


MAX_GPUS = 64                                   # one machine; a bigger count is a typo, not a box

__all__ = ["CPU", "GPU", "Hardware", "HardwareError", "Link", "MAX_GPUS", "MAX_SOCKETS", "NUMA_MODES", "ddr_gbs",
           "numa_view", "pcie_gbs", "sockets"]
