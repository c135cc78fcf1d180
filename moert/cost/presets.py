"""Preset parts: GPUs, CPUs and links as spec sheets give them, each figure's source beside it.

`moert hardware list` prints them (table, to_dict); a machine is made of them by name in machines.py.
"""

from __future__ import annotations

from dataclasses import asdict, replace

from moert.cost import kinds
from moert.cost.hardware import CPU, GPU, Link, ddr_gbs, pcie_gbs

# ------------------------------------------------------------------------------------------- presets

# ROCm's decode share on discrete RDNA3 is a term of the GPU's kind (api "rocm", arch "rdna3"), with its sources
# in moert/cost/kinds.py: the kind fields below give it to the Navi 31 presets, as they would to any such card.
RDNA3_DGPU_BW = kinds.RDNA3_DGPU_BW

# GPUs. Bandwidth = bus width x data rate / 8; tensor TFLOPS are dense (the sparse figure halved), FP16
# inputs with FP32 accumulate, as the architecture whitepapers list them per card.
GPUS: dict[str, GPU] = {g.name: g for g in (
    # NVIDIA GeForce RTX 3060 (12 GB): 192-bit GDDR6 at 15 Gbps = 360 GB/s; 28 SMs, 1.78 GHz boost: 25.5
    # FP16/FP32-acc, 102 INT8 TOPS dense (nvidia.com/en-us/geforce/graphics-cards/30-series/rtx-3060-3060ti;
    # NVIDIA Ampere GA102 whitepaper, appendix table for GA106 figures per SM)
    GPU("rtx3060", 12, 360, 25.5, 102, pcie_gen=4, source="nvidia.com RTX 3060 specs; GA102 whitepaper"),
    # RTX 4060 (8 GB): 128-bit GDDR6 at 17 Gbps = 272 GB/s; 24 SMs at 2.46 GHz: 30.2 FP16/FP32-acc TFLOPS,
    # 121 INT8 TOPS dense; PCIe 4.0 x8 (nvidia.com RTX 4060 family specs; Ada whitepaper per-SM rates)
    GPU("rtx4060", 8, 272, 30.2, 121, pcie_gen=4, pcie_lanes=8, source="nvidia.com RTX 4060 specs; Ada whitepaper"),
    # RTX 3090: 384-bit GDDR6X at 19.5 Gbps = 936 GB/s; 71 FP16/FP32-acc TFLOPS (142 with FP16 accumulate),
    # 284 INT8 TOPS dense (NVIDIA Ampere GA102 GPU Architecture whitepaper, table 9)
    GPU("rtx3090", 24, 936, 71, 284, pcie_gen=4, source="NVIDIA Ampere GA102 whitepaper, table 9"),
    # RTX 4070: 192-bit GDDR6X at 21 Gbps = 504 GB/s; 46 SMs at 2.475 GHz: 58.3 FP16/FP32-acc, 233 INT8 TOPS
    # dense (nvidia.com RTX 4070 family specs; NVIDIA Ada GPU Architecture whitepaper, per-SM rates)
    GPU("rtx4070", 12, 504, 58.3, 233, pcie_gen=4, source="nvidia.com RTX 4070 specs; Ada whitepaper"),
    # RTX 4090: 384-bit GDDR6X at 21 Gbps = 1008 GB/s; 165.2 FP16/FP32-acc TFLOPS, 660.6 INT8 TOPS dense
    # (NVIDIA Ada GPU Architecture whitepaper v2.01, table 2)
    GPU("rtx4090", 24, 1008, 165.2, 660.6, pcie_gen=4, source="NVIDIA Ada whitepaper v2.01, table 2"),
    # RTX 5090: 512-bit GDDR7 at 28 Gbps = 1792 GB/s; 838 FP16 TFLOPS sparse = 419 dense with FP16 accumulate
    # (GeForce Blackwell is full rate with FP32 accumulate: 209.5 is the conservative reading), 838 INT8 TOPS
    # dense; PCIe 5.0 x16 (nvidia.com RTX 5090 specs; NVIDIA RTX Blackwell GPU Architecture whitepaper)
    GPU("rtx5090", 32, 1792, 209.5, 838, pcie_gen=5, source="nvidia.com RTX 5090 specs; RTX Blackwell whitepaper"),
    # RTX 5080 (16 GB): 256-bit GDDR7 at 30 Gbps = 960 GB/s; 84 SMs; "AI TOPS 1801" (FP4, sparse) against the RTX
    # 5090's 3352, so its FP16/FP32-acc and INT8 rates are the 5090 preset's x 1801 / 3352 (derived, not a listed
    # figure); PCIe 5.0 x16 (nvidia.com RTX 5080 specs; NVIDIA RTX Blackwell GPU Architecture whitepaper)
    GPU("rtx5080", 16, 960, 112.6, 450.2, pcie_gen=5, source="nvidia.com RTX 5080 specs (960 GB/s, 1801 AI TOPS); "
        "tensor rates scaled from the RTX 5090 by AI TOPS"),
    # RTX 4080 (16 GB): 256-bit GDDR6X at 22.4 Gbps = 716.8 GB/s; 97.5 FP16/FP32-acc TFLOPS, 389.9 INT8 TOPS dense
    # (NVIDIA Ada GPU Architecture whitepaper v2.01, GeForce RTX 4080 table)
    GPU("rtx4080", 16, 716.8, 97.5, 389.9, pcie_gen=4, source="NVIDIA Ada whitepaper v2.01, RTX 4080 table"),
    # RTX 2080 (8 GB, reference clocks): 256-bit GDDR6 at 14 Gbps = 448 GB/s; 40.3 FP16/FP32-acc TFLOPS, 161.1 INT8
    # TOPS; PCIe 3.0 x16 (NVIDIA Turing GPU Architecture whitepaper, appendix table for GeForce RTX 2080)
    GPU("rtx2080", 8, 448, 40.3, 161.1, pcie_gen=3, source="NVIDIA Turing whitepaper, RTX 2080 table"),
    # AMD Radeon RX 7900 XT (20 GB): 320-bit GDDR6 at 20 Gbps = 800 GB/s; "Peak Half Precision (FP16) Performance
    # 103 TFLOPs" (amd.com RX 7900 XT specifications). Decode reads at ROCm's share on RDNA3 (its kind).
    GPU("rx7900xt", 20, 800, 103, pcie_gen=4, source="amd.com Radeon RX 7900 XT specifications"),
    # AMD Radeon RX 7900 XTX (24 GB): 384-bit GDDR6 at 20 Gbps = 960 GB/s; "Peak Half Precision (FP16) Performance
    # 122.8 TFLOPs" (amd.com RX 7900 XTX specifications); Navi 31 as the RX 7900 XT, so ROCm's share (its kind).
    GPU("rx7900xtx", 24, 960, 122.8, pcie_gen=4, source="amd.com Radeon RX 7900 XTX specifications"),
    # AMD Radeon RX 6900 XT (16 GB): 256-bit GDDR6 at 16 Gbps = 512 GB/s (as bench/published.json's run states it);
    # "Peak Half Precision Compute Performance 46.08 TFLOPs" (amd.com RX 6900 XT specifications); RDNA2 has no matrix
    # cores, so its FP16 figure is the packed-math peak. PCIe 4.0 x16.
    GPU("rx6900xt", 16, 512, 46.08, pcie_gen=4, source="amd.com Radeon RX 6900 XT specifications"),
    # AMD Radeon PRO W7800 (32 GB): 256-bit GDDR6 at 18 Gbps = 576 GB/s; "Peak Half Precision (FP16) Performance
    # 90.5 TFLOPs" (amd.com Radeon PRO W7800 specifications; RDNA3 dual-issue / WMMA peak). PCIe 4.0 x16.
    GPU("w7800", 32, 576, 90.5, pcie_gen=4, source="amd.com Radeon PRO W7800 specifications"),
    # AMD Radeon Instinct MI60 (gfx906, 32 GB): 4096-bit HBM2 at 2 Gbps = 1,024 GB/s; FP16 29.49 TFLOPS (2:1 packed
    # math, no matrix cores): TechPowerUp's GPU database as sysrqmts.com lists it ("Bandbreite 1,024 GB/s", "FP16
    # (half) Leistung 29.49 TFLOPS"). The MI50 has the same memory and ~10% less compute. PCIe 4.0 x16.
    GPU("mi60", 32, 1024, 29.49, pcie_gen=4, source="TechPowerUp GPU database (via sysrqmts.com) Radeon Instinct MI60"),
    # NVIDIA GB10 (DGX Spark): 128 GB LPDDR5X shared with its CPU, "Spark's 273 GB/s peak bandwidth"
    # (github.com/NVIDIA/dgx-spark-playbooks/pull/91); "1 PFLOP" of FP4 with sparsity (nvidia.com DGX Spark), i.e.
    # 500 dense FP4, 250 INT8 TOPS, 125 FP16 TFLOPS at the usual 2:1 steps (derived, not a listed figure). The
    # GPU can address ~119 GiB of the 128 (the rest: OS and CPU).
    GPU("gb10", 119, 273, 125, 250, pcie_gen=5, source="DGX Spark: 273 GB/s (dgx-spark-playbooks PR 91); 1 PFLOP FP4 "
        "sparse (nvidia.com), FP16/INT8 derived"),
    # AMD Radeon 8060S (Strix Halo's iGPU, gfx1151): 40 RDNA 3.5 CUs at 2.9 GHz, 29.70 FP16 TFLOPS packed (fpsbench.com
    # AMD Radeon 8060S specifications), twice that with WMMA as AMD counts RDNA3 (the RX 7900 XT's 103 and W7800's 90.5
    # above): 59.4; it reads the package's 256-bit LPDDR5X-8000, 256 GB/s (the ryzen-ai-max-395 preset's memory), and
    # ROCm addresses 124 GiB of it ("VRAM: 126976 MiB" in the published run's log). No PCIe link of its own.
    GPU("radeon-8060s", 124, 256, 59.4, pcie_gen=4, source="fpsbench.com Radeon 8060S (FP16 29.70 x2 WMMA); "
        "amd.com Ryzen AI Max+ 395 (256-bit LPDDR5X-8000)"),
    # Apple M2 Max with the 38-core GPU: "400GB/s memory bandwidth" (apple.com M2 Max); 38 cores x 128 FP32 ALUs x 2
    # FLOPs x 1.398 GHz = 13.6 TFLOPS, FP16 at the same rate (derived; Apple lists no TFLOPS). Metal lets the GPU wire
    # about three quarters of unified memory (recommendedMaxWorkingSetSize): 72 of a 96 GB Studio. No PCIe link.
    GPU("m2-max-38c", 72, 400, 13.6, pcie_gen=4, source="apple.com M2 Max (400GB/s); FP16 derived from 38 GPU cores"),
    # NVIDIA RTX PRO 6000 Blackwell Max-Q (96 GB): GB202 with 188 SMs, 512-bit GDDR7 at 28 Gbps = 1,792 GB/s (the
    # workstation cards' published figures); tensor rates scaled from the RTX 5090 preset by SMs (188 / 170 x 209.5
    # and x 838), the Max-Q's lower 300 W clocks not taken off: an upper bound, derived, not a listed figure. PCIe 5.0.
    GPU("rtx-pro-6000-maxq", 96, 1792, 231.7, 926.7, pcie_gen=5, source="GB202, 188 SMs, 1792 GB/s (NVIDIA RTX PRO "
        "6000 Blackwell announcements); tensor rates scaled from the RTX 5090 by SMs"),
    # NVIDIA RTX PRO 6000 Blackwell Workstation Edition (96 GB, 600 W): the same GB202 with 188 SMs and 1,792 GB/s as
    # the Max-Q above, at full clocks, so the same derived tensor rates (scaled from the RTX 5090 by SMs) fit it better.
    GPU("rtx-pro-6000", 96, 1792, 231.7, 926.7, pcie_gen=5, source="GB202, 188 SMs, 1792 GB/s (NVIDIA RTX PRO 6000 "
        "Blackwell announcements); tensor rates scaled from the RTX 5090 by SMs"),
    # H100 PCIe 80GB: HBM2e 2.0 TB/s; 1513 FP16 tensor TFLOPS sparse = 756 dense, 1513 INT8 TOPS dense;
    # PCIe 5.0 x16 (NVIDIA H100 Tensor Core GPU data sheet)
    GPU("h100-pcie", 80, 2000, 756, 1513, pcie_gen=5, source="NVIDIA H100 Tensor Core GPU data sheet"),
    # A100 SXM4 80GB: HBM2e 2,039 GB/s; "FP16 Tensor Core 312 TFLOPS | 624 TFLOPS*" (* with sparsity: 312 dense),
    # "INT8 Tensor Core 624 TOPS" dense; PCIe 4.0 x16 to the host (NVIDIA A100 Tensor Core GPU data sheet)
    GPU("a100-sxm-80gb", 80, 2039, 312, 624, pcie_gen=4, source="NVIDIA A100 Tensor Core GPU data sheet"),
)}

# Each preset GPU's kind (moert/cost/kinds.py): "api arch memory tier". A card's decode share is its kind's
# (kinds.gpu_bw_share), so a card described by its spec sheet with the same kind reads the same.
GPU_KINDS = {
    "rtx3060": "cuda ampere gddr6 consumer", "rtx4060": "cuda ada gddr6 consumer",
    "rtx3090": "cuda ampere gddr6x consumer", "rtx4070": "cuda ada gddr6x consumer",
    "rtx4090": "cuda ada gddr6x consumer", "rtx5090": "cuda blackwell gddr7 consumer",
    "rtx5080": "cuda blackwell gddr7 consumer", "rtx4080": "cuda ada gddr6x consumer",
    "rtx2080": "cuda turing gddr6 consumer", "rx7900xt": "rocm rdna3 gddr6 consumer",
    "rx7900xtx": "rocm rdna3 gddr6 consumer", "rx6900xt": "rocm rdna2 gddr6 consumer",
    "w7800": "rocm rdna3 gddr6 workstation", "mi60": "rocm gcn5 hbm2 datacenter",
    "gb10": "cuda blackwell lpddr5x workstation", "radeon-8060s": "rocm rdna3.5 lpddr5x consumer",
    "m2-max-38c": "metal apple-m2 unified consumer", "rtx-pro-6000-maxq": "cuda blackwell gddr7 workstation",
    "rtx-pro-6000": "cuda blackwell gddr7 workstation", "h100-pcie": "cuda hopper hbm2e datacenter",
    "a100-sxm-80gb": "cuda ampere hbm2e datacenter",
}


def _kinded(parts: dict, table: dict, fields: tuple, shares: tuple) -> dict:
    """Each part named in `table` with its kind's fields ("api arch memory tier" / "vendor generation isa tier"), and
    bw_efficiency 0 (its kind's share, kinds.py) where it was one of the default `shares` rather than its own."""
    return {k: replace(p, **dict(zip(fields, table[k].split())),
                       bw_efficiency=0.0 if p.bw_efficiency in shares else p.bw_efficiency) if k in table else p
            for k, p in parts.items()}


GPUS = _kinded(GPUS, GPU_KINDS, kinds.GPU_FIELDS, (kinds.GPU_BW_SHARE,))

# The share of peak DRAM bandwidth the cores of an 8-12 channel server or workstation part read (EPYC, Threadripper
# PRO) is a term of the part's kind (kinds.cpu_bw_share: 0.45 from an Intel mlc figure of a dual EPYC 9965, ik_llama.cpp
# PR 612; Skylake-SP's own reading); desktop dual-channel parts keep 0.7. Not fitted on bench/published.json.
SERVER_BW_EFFICIENCY = kinds.MANY_CHANNEL_BW_SHARE

# CPUs with their official memory speed; peak = channels x MT/s x 8 bytes (ddr_gbs).
CPUS: dict[str, CPU] = {c.name: c for c in (
    # AMD Ryzen 5 7600: 6 cores, ~5.0 GHz all-core, dual-channel DDR5-5200 (amd.com product page) = 83.2 GB/s.
    # One CCD: its link reads 32 B x FCLK = 64 GB/s (FCLK 2.0 GHz, AMD's recommended fabric clock for Ryzen 7000 with
    # DDR5; an assumption for every Zen 4/5 preset), above the DRAM's 0.7 x 83.2 = 58 GB/s, so DRAM bounds it.
    CPU("ryzen-7600", 6, ddr_gbs(2, 5200), 2, 5200, ghz=5.0, ccds=1, fclk_ghz=2.0,
        source="amd.com Ryzen 5 7600 specifications"),
    # AMD Ryzen 9 7900: 12 cores (Zen 4) on 2 CCDs, dual-channel DDR5-5200 (amd.com Ryzen 9 7900 specifications) = 83.2
    # GB/s; a 65 W part: ~4.7 GHz all-core (an assumption between its 3.7 GHz base and 5.4 GHz boost)
    CPU("ryzen-7900", 12, ddr_gbs(2, 5200), 2, 5200, ghz=4.7, ccds=2, fclk_ghz=2.0,
        source="amd.com Ryzen 9 7900 specifications"),
    # AMD Ryzen AI 9 HX PRO 370 (Strix Point, monolithic: no CCD links): 12 Zen 5 cores at 4.37 GHz and dual-channel
    # DDR5-5600, both as the published run states them ("Zen 5, 12c/24t, 4.37 GHz", "96GB DDR5-5600 dual-channel")
    CPU("ryzen-ai-9-hx-pro-370", 12, ddr_gbs(2, 5600), 2, 5600, ghz=4.37,
        source="as stated by llama.cpp issue 19480; amd.com Ryzen AI 9 HX PRO 370"),
    # AMD Ryzen 9 7950X: 16 cores, ~5.0 GHz all-core, dual-channel DDR5-5200 (amd.com) = 83.2 GB/s
    CPU("ryzen-7950x", 16, ddr_gbs(2, 5200), 2, 5200, ghz=5.0, ccds=2, fclk_ghz=2.0,
        source="amd.com Ryzen 9 7950X specifications"),
    # AMD Ryzen 9 9950X: 16 cores (Zen 5: 4 x 512-bit FMA lanes of fp32 -> 64 FLOPs/cycle), DDR5-5600 (amd.com)
    CPU("ryzen-9950x", 16, ddr_gbs(2, 5600), 2, 5600, ghz=5.0, flops_per_cycle=64, ccds=2, fclk_ghz=2.0,
        source="amd.com Ryzen 9 9950X specifications"),
    # Intel Core i9-14900K: 8 P + 16 E cores (counted as 16 P-equivalents for FLOPs), dual-channel DDR5-5600,
    # "Max Memory Bandwidth 89.6 GB/s" (ark.intel.com, product 236773)
    CPU("i9-14900k", 24, ddr_gbs(2, 5600), 2, 5600, ghz=4.0, flops_per_cycle=21,
        source="ark.intel.com Core i9-14900K"),
    # AMD Ryzen 9 5900X: 12 cores (Zen 3, AVX2), dual-channel DDR4-3200 (amd.com) = 51.2 GB/s; two CCDs, FCLK 1.6 GHz
    # (Zen 2/3 run the fabric 1:1 with DDR4-3200's 1600 MHz memory clock; likewise every DDR4-3200 Zen preset)
    CPU("ryzen-5900x", 12, ddr_gbs(2, 3200), 2, 3200, ddr=4, ghz=4.3, ccds=2, fclk_ghz=1.6,
        source="amd.com Ryzen 9 5900X specifications"),
    # AMD Ryzen Threadripper PRO 5975WX: 32 cores (Zen 3) on 4 CCDs, 8 channels DDR4-3200 (amd.com) = 204.8 GB/s
    CPU("threadripper-pro-5975wx", 32, ddr_gbs(8, 3200), 8, 3200, ddr=4, ghz=4.0, ccds=4, fclk_ghz=1.6,
        bw_efficiency=SERVER_BW_EFFICIENCY,
        source="amd.com Ryzen Threadripper PRO 5975WX specifications"),
    # AMD Ryzen Threadripper PRO 3995WX: 64 cores (Zen 2, AVX2) on 8 CCDs, 8 channels DDR4-3200 = 204.8 GB/s (amd.com
    # Ryzen Threadripper PRO 3995WX specifications); WRX80, PCIe 4.0
    CPU("threadripper-pro-3995wx", 64, ddr_gbs(8, 3200), 8, 3200, ddr=4, ghz=3.2, ccds=8, fclk_ghz=1.6,
        bw_efficiency=SERVER_BW_EFFICIENCY,
        source="amd.com Ryzen Threadripper PRO 3995WX specifications"),
    # Intel Core i9-10900X: 10 cores, 2 AVX-512 FMA units (64 fp32 FLOPs/cycle), 4 channels DDR4-2933, "Max Memory
    # Bandwidth 94 GB/s" (ark.intel.com, Core i9-10900X); PCIe 3.0 (X299)
    CPU("i9-10900x", 10, ddr_gbs(4, 2933), 4, 2933, ddr=4, ghz=4.0, flops_per_cycle=64,
        source="ark.intel.com Core i9-10900X"),
    # AMD EPYC 7343: 16 cores (Zen 3) on 4 CCDs, 8 channels DDR4-3200 = 204.8 GB/s per socket (amd.com EPYC 7003 series)
    CPU("epyc-7343", 16, ddr_gbs(8, 3200), 8, 3200, ddr=4, ghz=3.6, ccds=4, fclk_ghz=1.6,
        bw_efficiency=SERVER_BW_EFFICIENCY,
        source="amd.com EPYC 7343 specifications"),
    # Intel Core i5-12600K: 6 P-cores + 4 E-cores; llama.cpp's default thread count on a hybrid CPU is the P-cores,
    # so the preset counts those (Golden Cove: 2 x 256-bit FMA = 32 fp32 FLOPs/cycle, ~4.5 GHz all-P-core);
    # "Max Memory Speed Up to DDR5 4800 MT/s", "Max # of Memory Channels 2", "Max Memory Bandwidth 76.8 GB/s"
    # (ark.intel.com, Core i5-12600K); PCIe 5.0 x16 from the CPU (LGA1700)
    CPU("i5-12600k", 6, ddr_gbs(2, 4800), 2, 4800, ghz=4.5, source="ark.intel.com Core i5-12600K"),
    # AMD Ryzen AI Max+ 395 (Strix Halo): 16 Zen 5 cores (512-bit FMA datapath: 64 fp32 FLOPs/cycle), up to 5.1 GHz;
    # LPDDR5X-8000 on a 256-bit bus = four 64-bit channels' worth = 256 GB/s (amd.com Ryzen AI Max+ 395
    # specifications: "LPDDR5x", 8000 MT/s, 256-bit). Its two CCDs reach the memory through 32-byte-per-clock links
    # (AMD on Strix Halo's fan-out die-to-die link), 2 x 32 B x 2.0 GHz = 128 GB/s: half the LPDDR5X, and below its
    # 0.7 share (179 GB/s), so the links bound the cores' reads (the iGPU, not modelled here, gets the rest).
    CPU("ryzen-ai-max-395", 16, ddr_gbs(4, 8000), 4, 8000, ghz=4.5, flops_per_cycle=64, ccds=2, fclk_ghz=2.0,
        mem_label="256-bit LPDDR5X-8000",
        source="amd.com Ryzen AI Max+ 395 specifications"),
    # AMD EPYC 9B14 (Genoa, SP5, an OEM part of the 9004 series): 96 cores, 12 channels DDR5-4800 = 460.8 GB/s per
    # socket (EPYC 9004 product brief: 12 x DDR5-4800 per socket; the cores and memory as the published run
    # states them: "Epyc 9B14 so 96 cores [...] 12ch DDR5-4800"); ~3.1 GHz all-core
    CPU("epyc-9b14", 96, ddr_gbs(12, 4800), 12, 4800, ghz=3.1, bw_efficiency=SERVER_BW_EFFICIENCY, ccds=12,
        fclk_ghz=2.0,
        source="amd.com EPYC 9004 series product brief; cores as stated by the published run"),
    # AMD EPYC 9374F (9004 series, Genoa): 32 cores on 8 CCDs, 12 channels DDR5-4800 = 460.8 GB/s per socket, 3.85 GHz
    # base (amd.com EPYC 9374F specifications; the base clock as the all-core clock under load, an assumption)
    CPU("epyc-9374f", 32, ddr_gbs(12, 4800), 12, 4800, ghz=3.85, bw_efficiency=SERVER_BW_EFFICIENCY, ccds=8,
        fclk_ghz=2.0, source="amd.com EPYC 9374F / 9004 series product brief"),
    # Intel Xeon 6980P (Granite Rapids-AP): 128 P-cores, all-core boost 3.2 GHz, 12 x DDR5-6400 = 614.4 GB/s per socket
    # (hardwareluxx.de's Xeon 6900P table, from Intel's launch figures); three compute tiles of 44 cores, each with 4 of
    # the channels (techpowerup.com); AVX-512 with 2 FMA units: 64 fp32 FLOPs a cycle. A whole socket (no SNC split).
    CPU("xeon-6980p", 128, ddr_gbs(12, 6400), 12, 6400, ghz=3.2, flops_per_cycle=64,
        bw_efficiency=SERVER_BW_EFFICIENCY,
        source="hardwareluxx.de Xeon 6900P table; techpowerup.com Granite Rapids-UCC"),
    # AMD EPYC 9554 (9004 series, Genoa): 64 cores, 12 channels DDR5-4800 = 460.8 GB/s per socket
    # (amd.com EPYC 9004 product brief), 8 CCDs; the cores read SERVER_BW_EFFICIENCY of it (above).
    CPU("epyc-9554", 64, ddr_gbs(12, 4800), 12, 4800, ghz=3.5, bw_efficiency=SERVER_BW_EFFICIENCY, ccds=8, fclk_ghz=2.0,
        source="amd.com EPYC 9554 / 9004 series product brief"),
    # AMD EPYC 9354 (Genoa): 32 cores (3.25 GHz base, 3.8 boost), 12 channels DDR5-4800 = 460.8 GB/s, 8 CCDs
    # (amd.com EPYC 9354 specifications); a common node of a multi-host cluster (moert/cost/cluster.py)
    CPU("epyc-9354", 32, ddr_gbs(12, 4800), 12, 4800, ghz=3.5, bw_efficiency=0.75, ccds=8, fclk_ghz=2.0,
        source="amd.com EPYC 9354 / 9004 series product brief"),
    # Intel Xeon Gold 6138 (Skylake-SP, 1st gen Xeon Scalable): "20 cores and 40 threads, a base frequency of 2.0GHz,
    # a maximum turbo frequency of 3.7GHz", "six-channel DDR4-2666" (m.jtti.cc/supports/2997.html); AVX-512 without
    # VNNI (the published run's system info: "AVX512 = 1 | ... | AVX512_VNNI = 0"). Two FMA units (64 fp32 FLOPs a
    # cycle) and the 2.0 GHz base as the AVX-512 all-core clock are assumptions, not on the page. Per socket.
    CPU("xeon-gold-6138", 20, ddr_gbs(6, 2666), 6, 2666, ddr=4, ghz=2.0, flops_per_cycle=64,
        bw_efficiency=SERVER_BW_EFFICIENCY, source="m.jtti.cc Xeon Gold 6138 vs Platinum 8176 (cores, clocks, memory)"),
    # AMD EPYC 9355 (Turin, Zen 5): 32 cores on 8 CCDs, "clocks up to 4.4 GHz", 12 memory controllers, each CCD on a
    # "GMI-Wide" 64 B/cycle link (chipsandcheese.com "AMD's EPYC 9355P: Inside a 32 Core Zen 5 Server Chip"); Zen 5's
    # 512-bit FMA datapath: 64 fp32 FLOPs a cycle. DDR5-6400 (AMD's EPYC 9005 rating; not on that page: an assumption
    # where a run states no speed) and ~4.0 GHz all-core (an assumption below the boost). The 32 B-per-FCLK link
    # model caps the cores at 8 x 64 GB/s, above the DRAM share, so it never binds (GMI-Wide doubles it anyway).
    CPU("epyc-9355", 32, ddr_gbs(12, 6400), 12, 6400, ghz=4.0, flops_per_cycle=64, bw_efficiency=SERVER_BW_EFFICIENCY,
        ccds=8, fclk_ghz=2.0, source="chipsandcheese.com EPYC 9355P (cores, CCDs, boost, 12 channels); DDR5-6400 "
        "assumed"),
    # Intel Xeon engineering sample QYFS (Sapphire Rapids, 4th gen Xeon Scalable; "Xeon 8480 equivalent" as the
    # published run says): "56 core e 112 thread", base 1.9 GHz, "Boost Clock [...] 3,3GHz" (tomshw.it on the ES2
    # QYFS); 8 channels DDR5-4800 (wccftech.com Sapphire Rapids-SP; the runs state "8x48GB @ 4800" and "DDR5 4800");
    # AVX-512 with VNNI and AMX, two FMA units (64 fp32 FLOPs a cycle: an assumption). Per socket.
    CPU("xeon-8480-qyfs", 56, ddr_gbs(8, 4800), 8, 4800, ghz=3.3, flops_per_cycle=64,
        bw_efficiency=SERVER_BW_EFFICIENCY, source="tomshw.it Sapphire Rapids-SP ES2 QYFS; wccftech.com Sapphire "
        "Rapids-SP (8 x DDR5-4800)"),
)}

# Each preset CPU's kind (moert/cost/kinds.py): "vendor generation isa tier". isa: the widest int8 dot path llama.cpp
# takes there (Zen 4 and 5 have AVX512-VNNI; Cascade Lake-X's "Intel Deep Learning Boost" is AVX512-VNNI; Alder and
# Raptor Lake have no AVX-512; Granite Rapids has AMX-INT8), from the vendors' product pages.
CPU_KINDS = {
    "ryzen-7600": "amd zen4 avx512-vnni consumer", "ryzen-7900": "amd zen4 avx512-vnni consumer",
    "ryzen-ai-9-hx-pro-370": "amd zen5 avx512-vnni consumer", "ryzen-7950x": "amd zen4 avx512-vnni consumer",
    "ryzen-9950x": "amd zen5 avx512-vnni consumer", "i9-14900k": "intel raptor-lake avx2 consumer",
    "ryzen-5900x": "amd zen3 avx2 consumer", "threadripper-pro-5975wx": "amd zen3 avx2 workstation",
    "threadripper-pro-3995wx": "amd zen2 avx2 workstation", "i9-10900x": "intel cascade-lake avx512-vnni workstation",
    "epyc-7343": "amd zen3 avx2 server", "i5-12600k": "intel alder-lake avx2 consumer",
    "ryzen-ai-max-395": "amd zen5 avx512-vnni consumer", "epyc-9b14": "amd zen4 avx512-vnni server",
    "epyc-9374f": "amd zen4 avx512-vnni server", "xeon-6980p": "intel granite-rapids amx server",
    "epyc-9554": "amd zen4 avx512-vnni server", "epyc-9354": "amd zen4 avx512-vnni server",
    "xeon-gold-6138": "intel skylake-sp avx512 server", "epyc-9355": "amd zen5 avx512-vnni server",
    "xeon-8480-qyfs": "intel sapphire-rapids amx server",
}
CPUS = _kinded(CPUS, CPU_KINDS, kinds.CPU_FIELDS, (kinds.CPU_BW_SHARE, SERVER_BW_EFFICIENCY))

# Links: PCIe 4.0 16 GT/s and 5.0 32 GT/s per lane, 128b/130b encoding (PCI-SIG base specifications).
LINKS: dict[str, Link] = {
    "pcie3x16": Link(pcie_gbs(3), 10.0, "pcie3x16"),   # 15.8 GB/s per direction (8 GT/s)
    "pcie4x8": Link(pcie_gbs(4, 8), 10.0, "pcie4x8"),  # 15.8 GB/s per direction
    "pcie4x16": Link(pcie_gbs(4), 10.0, "pcie4x16"),   # 31.5 GB/s per direction
    "pcie5x16": Link(pcie_gbs(5), 10.0, "pcie5x16"),   # 63.0 GB/s per direction
}

# The CPUs' platforms: AM5 (Ryzen 7000/9000), LGA1700 (12th-14th gen) and SP5 (EPYC 9004) have PCIe 5.0 x16; AM4
# (Ryzen 5000), WRX80 (Threadripper PRO 3000/5000) and SP3 (EPYC 7003) PCIe 4.0 (Strix Halo: x4 lanes of 4.0 for a card,
# unused here, the entries with it are CPU-only); X299 (Core i9-10900X) PCIe 3.0; SP5 with EPYC 9005 and LGA4677
# (Sapphire Rapids) PCIe 5.0, LGA3647 (Skylake-SP) 3.0. A two-socket part keys on its "2x " name (sockets()).
_PLATFORM_PCIE = {"ryzen-7600": 5, "epyc-9374f": 5, "xeon-6980p": 5, "ryzen-ai-9-hx-pro-370": 4,
                  "ryzen-7900": 5, "ryzen-7950x": 5, "ryzen-9950x": 5, "i9-14900k": 5, "epyc-9554": 5,
                  "i5-12600k": 5, "epyc-9b14": 5, "ryzen-ai-max-395": 4,
                  "ryzen-5900x": 4, "threadripper-pro-5975wx": 4, "threadripper-pro-3995wx": 4, "epyc-7343": 4,
                  "i9-10900x": 3, "epyc-9355": 5, "2x epyc-9355": 5, "xeon-8480-qyfs": 5, "xeon-gold-6138": 3}


def preset_link(cpu: CPU, gpus) -> Link:
    """The link presets get: the slower of the cards' slots and the CPU platform's PCIe (4.0 if not known)."""
    gen = min([g.pcie_gen for g in gpus] + [_PLATFORM_PCIE.get(cpu.name, 4)])
    lanes = min(g.pcie_lanes for g in gpus)
    return LINKS.get(f"pcie{gen}x{lanes}") or Link.pcie(gen, lanes)


def examples() -> list[str]:
    """A few preset combinations, for `moert hardware list`."""
    return ["rtx4060+ryzen-7600", "rtx3060+ryzen-7600", "rtx3090+ryzen-7950x", "rtx4070+i9-14900k",
            "rtx4090+ryzen-7950x", "rtx5090+ryzen-9950x", "h100-pcie+epyc-9554", "2x rtx3090+epyc-9554", "ryzen-9950x"]


def table() -> str:
    """`moert hardware list`: every preset part with its figures."""
    w = max(11, *(len(g.name) for g in GPUS.values()))
    rows = ["GPUs:", f"  {'name':<{w}} {'memory':>8} {'GB/s':>7} {'FP16 TFLOPS':>12} {'INT8 TOPS':>10} {'PCIe':>6}"]
    rows += [f"  {g.name:<{w}} {g.mem_gib:>5g}GiB {g.bw_gbs:>7g} {g.fp16_tflops:>12g} {g.int8_tops:>10g} "
             f"{f'{g.pcie_gen}.0 x{g.pcie_lanes}':>6}" for g in GPUS.values()]
    rows += ["", "CPUs:", f"  {'name':<23} {'cores':>5} {'memory':>20} {'peak GB/s':>10} {'CCD links':>14} "
                          f"{'GFLOPS':>7}"]
    rows += [f"  {c.name:<23} {c.cores:>5} {c.mem_label or f'{c.mem_channels} x DDR{c.ddr}-{c.mem_mts}':>20} "
             f"{c.mem_bw_gbs:>10.1f} "
             f"{f'{c.ccds} x {c.fabric_gbs / c.ccds:g} GB/s' if c.ccds else '-':>14} {c.peak_gflops:>7.0f}"
             for c in CPUS.values()]
    rows += ["", "links:"] + [f"  {k:<11} {v.bw_gbs:.1f} GB/s per direction, {v.latency_us:g} us per copy"
                              for k, v in LINKS.items()]
    rows += ["", "combine with '+': " + ", ".join(examples()) + " ('local': this CPU, measured; a part or a "
             "whole machine may be a .json file of these fields: moert/cost/machines.py)"]
    return "\n".join(rows)


def to_dict() -> dict:
    """Every preset part as plain data (`moert hardware list --json`)."""
    return {"gpus": {k: asdict(v) for k, v in GPUS.items()}, "cpus": {k: asdict(v) for k, v in CPUS.items()},
            "links": {k: asdict(v) for k, v in LINKS.items()}, "examples": examples()}


__all__ = ["CPUS", "CPU_KINDS", "GPUS", "GPU_KINDS", "LINKS", "examples", "preset_link", "table", "to_dict"]
