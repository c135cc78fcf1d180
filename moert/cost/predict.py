"""Predict prefill and decode speed of a placement on hardware you may not have: `predict(plan, hardware)`.

    hw = moert.cost.preset("rtx3090+ryzen-7950x")
    p = moert.plan(moert.zoo.path("gpt-oss-120b"), cpu_moe=True, gpu_backend="sim", gpu_memory=hw.gpu_memory())
    r = moert.predict(p, hw, n_prompt=512, n_gen=128)      # r.decode_tok_s, r.prefill_tok_s, print(r.table())

The model (llama-bench's tests: pp{n_prompt} and tg{n_gen} starting at KV position `depth`), per layer and
device. Legend: B tokens in a micro-batch, E experts, K used, q_e the chance a token selects expert e (K/E
under uniform routing, else from a trace of selection counts):
  * weight bytes read: every non-expert tensor once per forward; of an expert tensor, the experts selected:
    distinct(d, B) = sum over e on device d of 1 - (1 - q_e)^B  (uniform: E_d/E * E(1 - (1 - K/E)^B));
  * FLOPs: 2 x weights x tokens for dense tensors, 2 x (expert weights) x B x sum_{e on d} q_e for experts;
    attention 2 x B x n_kv x H x (Dk + Dv); KV reads n_kv x Hkv x (Dk + Dv) x kv_bytes per layer;
  * each part's time: max(bytes / effective bandwidth, FLOPs / effective compute) + fixed costs (GPU: a
    launch per op; CPU: a call per op, or moert's measured per-layer / per-forward cost when calibrated);
  * activations cross the link where consecutive work changes device (D floats per token, latency-bound in
    decode, bandwidth-bound in prefill), weighted by the chance the experts there are used at all; experts away
    from their router also get its selection (ids and weights, K per token: ggml_backend_sched copies every
    input of a split that another backend made);
  * prefill op offload (`policy`): "llama.cpp" copies CPU-resident weights to the GPU and runs the matmul
    there when B >= 32 (ggml-cuda offload_op; only the used experts since llama.cpp PR #15346);
    "ik_llama.cpp" does so for MoE matmuls only when B >= 32 E/K (ik_llama.cpp PR #520), and never for an op
    with ne[1] < 32, so a down-projection bias in RAM (gpt-oss, `-ot exps=CPU`) is added on the CPU between
    offloaded matmuls: B x K x D floats cross to the host and back each layer; "none" never offloads.
  * no overlap: ggml_backend_sched runs a graph's splits one after another, so CPU and GPU times add.
  * decode kernel launches (`graphs`, moert/cost/launch.py): a GPU replaying a CUDA graph pays `launch_us` a
    kernel; a split of one that cannot costs max(its replayed time, its kernels x `launch_us_nograph`), launches
    overlapping the kernels (graphs="one-per-device": llama.cpp before PR 18934 with experts on the CPU; selectable,
    not the default, which replays every decode kernel as today's builds do).

A plan's GPU i (sim:i or cuda:i) is the hardware's GPU i. `Prediction.parts` keeps every term, so a table
can say what bounds each part. The terms come from `CostModel` (one plan on one machine: a stage of a layer
on a device for B tokens); its stages are moert's phases (attention, router, ffn, experts, output), so the
virtual clock (moert/cost/vclock.py) charges a real forward's phases with the same terms.
Expert placement is read per layer as "which experts of each tensor live on which device" (`expert_sets`), so
plans that place expert ranges plug in without changing the model.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import replace

import numpy as np

from moert.cost import coverage, kinds, launch
from moert.cost.hardware import Hardware, numa_view
from moert.cost.prediction import Part, Prediction
from moert.cost.range import VALIDATION, trust
from moert.cost.repack import offloadable
from moert.cost.roofline import part_time as _time
from moert.cost.shape import ROUTER, Shape, elements, expert_load, expert_sets, md_value, selection
from moert.errors import ArgumentError, PlacementError, check_float, check_int
from moert.placement.memory import estimate

POLICIES = ("llama.cpp", "ik_llama.cpp", "none")
# ik_llama.cpp's CPU matmuls of a batch (its repacked iqk_mul_mat GEMM kernels) against mainline's: x2.55, read from
# ik_llama.cpp PR 934 (Ryzen-7950X, CPU only, Q4_0, pp2048 at N_KV 0: 721.49 t/s vs llama.cpp's 282.49 t/s). Not read
# from any entry of bench/published.json; decode (mat-vec, bandwidth-bound) is unchanged.
IK_CPU_GEMM_X = 721.49 / 282.49
# That rate is the one of ik_llama.cpp since its "Much faster CPU prompt processing" PRs 531, 533 and 534 (merged
# 2025-06-16 to 2025-06-18): a matmul of 32+ tokens now repacks a type that is not row-interleaved on the fly to
# Q8_K_R8 / Q8_0_R8 / Q8_1 before its GEMM (ggml/src/iqk/iqk_mul_mat.cpp, MulMat::is_dequant_better and
# iqk_mul_mat_moe); before, each such type ran its own kernel. PR 534's pp512 table (LLaMA-3.1-8B, Ryzen-7950X, CPU
# only): Q4_0 155.6 -> 300.9 t/s, x1.93 on PR 934's type ("gains in the range of 2X for all types": x1.80-2.30 over nine
# types). So a build older than IK_REPACK_DATE runs them at IK_CPU_GEMM_X / IK_REPACK_X; row-interleaved weights
# (-rtr, or _R4 / _R8 types in the file) ran their own interleaved kernels before and after. Read from the PRs, not
# fitted on any entry of bench/published.json. Not modelled: today's threshold itself (a routed expert seeing fewer than
# 32 tokens, 64 for Q6_K, still runs its type's own kernel): at x1.93 it would put the training Ryzen AI Max+ 395
# CPU-only gpt-oss-120b pp512 (16 tokens an expert, MXFP4) 19% too slow out of sample, where it is 37% too fast now.
IK_REPACK_DATE = "2025-06-18"
IK_REPACK_X = 300.9 / 155.6
# Sliding-window attention: llama.cpp's set_swa_pattern(n) per architecture (llama-model.cpp: gpt-oss 2, even layers
# slide; gemma3 6, layers 5, 11, ... attend globally), the same periods moert/models/gptoss.py and gemma3.py run. A
# sliding layer keeps W + u-batch positions (llama_kv_cache_iswa), so its attention stops growing with the depth.
SWA_PERIOD = {"gpt-oss": 2, "gemma3": 6}
OFFLOAD_MIN_BATCH = 32                       # ggml-cuda.cu: get_op_batch_size(op) >= 32
_DOWN_BIAS = re.compile(r"\.ffn_down_(ch|)exps\.bias$")
# ops (graph nodes) per stage beyond its matmuls: norms, RoPE, KV copies, softmax/top-k, activations, adds.
# The stages are moert's phases (moert/stats.py): "router" is the MoE block's norm and gate, "ffn" a dense FFN
# or shared expert.
_EXTRA_OPS = {"attention": 8, "router": 5, "ffn": 3, "experts": 4}
ACT_QUANT = (None, "none", "int16", "int8")     # kernels/matmul_q.ACT_QUANT's names (not imported: no Numba here)


def _check_arguments(n_prompt, n_gen, depth, threads, n_ubatch, kv_bytes, act_quant, n_ctx) -> None:
    """ArgumentError for a count out of range or an unknown act_quant, before any work."""
    for name, v in (("n_prompt", n_prompt), ("n_gen", n_gen), ("depth", depth)):
        check_int(name, v, 0)
    check_int("n_ubatch", n_ubatch, 1)
    if threads is not None:
        check_int("threads", threads, 1)
    if n_ctx is not None:
        check_int("n_ctx", n_ctx, 1)
    if check_float("kv_bytes", kv_bytes, 0.0) == 0:
        raise ArgumentError("kv_bytes must be > 0 (bytes per KV element: 2 for f16, 4 for f32, 34/32 for q8_0)")
    if act_quant not in ACT_QUANT:
        raise ArgumentError(f"act_quant={act_quant!r}; use one of none, int16, int8")


def predict(plan, hardware: Hardware, n_prompt: int = 512, n_gen: int = 128, depth: int = 0, trace=None,
            threads: int | None = None, *, policy: str = "llama.cpp", n_ubatch: int = 512, kv_bytes: float = 2,
            act_quant: str | None = None, experts: dict | None = None, n_ctx: int | None = None,
            graphs: str = "per-split", cache=None, ram_gib: float | None = None, disk: str | None = None,
            mmap: bool = True, numa: str = "none", repack: bool = False, build: str = "",
            flash_attn: bool = True) -> Prediction:
    """Predict llama-bench's pp{n_prompt} and tg{n_gen} at KV position `depth` for `plan` on `hardware`.

    `experts`: {expert tensor name: {device: range of experts}} overriding the plan's (whole-tensor) sets,
    to try expert-granular placements before rules can express them. `n_ctx`: the context the memory check
    sizes the KV cache for (default: depth + n_prompt + n_gen). `graphs`: which decode kernels replay a CUDA
    graph (predict_launch.GRAPHS; "one-per-device" is both engines' rule before January 2026, not the default:
    bench/RESULTS.md, "Published figures"). `cache`: a moert.ExpertCache over the plan's CPU experts, costed token
    by token over `trace` (a moert.Trace): moert/dynamic/predict.py. `ram_gib` (default: the CPU part's stated
    `mem_gib`; 0 or unstated: RAM not checked): where the CPU's weights do not fit, llama.cpp's memory-mapped
    paging from `disk` (moert/cost/capacity.py; memory["cpu"], settings say so); mmap=False (--no-mmap): then
    it does not fit, and op offload copies from pinned memory (mmap: from pageable, Link.staged). `numa`: llama.cpp's
    --numa on a CPU of several NUMA nodes ("none": not given; hardware.numa_view says what each sees). `repack`:
    ik_llama.cpp's -rtr (moert/cost/repack.py): mmap off, and weights in RAM whose repacked type its CUDA backend does
    not run are never offloaded. `build`: the engine build's date, YYYY-MM-DD ("": today's), where it changes a term
    (ik_cpu_gemm_x; llama.cpp's CPU attention kernels, kinds.llama_cpu_attention, with `flash_attn`: -fa)."""
    repack = repack and policy == "ik_llama.cpp"   # an ik_llama.cpp flag: mainline has none
    mmap = mmap and not repack                   # -rtr turns mmap off (ik_llama.cpp common.cpp)
    hardware = replace(hardware, cpu=numa_view(hardware.cpu, numa))
    if cache is not None:                # the cache costs itself (moert.dynamic imports this module, not back)
        return cache.predict(plan, hardware, trace, n_prompt, n_gen, depth, threads=threads, policy=policy,
                             n_ubatch=n_ubatch, kv_bytes=kv_bytes, act_quant=act_quant, experts=experts, n_ctx=n_ctx,
                             graphs=graphs)
    _check_arguments(n_prompt, n_gen, depth, threads, n_ubatch, kv_bytes, act_quant, n_ctx)
    if build and not re.fullmatch(r"\d{4}-\d\d-\d\d", build):
        raise ArgumentError(f"build={build!r}: give the engine build's date as YYYY-MM-DD (or '' for today's)")
    if policy not in POLICIES:
        raise PlacementError(f"policy={policy!r}; use one of {', '.join(POLICIES)}")
    if graphs not in launch.GRAPHS:
        raise PlacementError(f"graphs={graphs!r}; use one of {', '.join(launch.GRAPHS)}")
    used = {e.device for e in plan if e.device != "cpu"} | {d for sets in (experts or {}).values()
                                                            for d in sets if d != "cpu"}
    if any(d.startswith("ray:") for d in used):
        raise PlacementError(f"the plan puts experts on Ray workers ({', '.join(sorted(used))}); predict prices one "
                             f"machine: moert.cost.cluster.predict_cluster (moert compare --cluster) prices several")
    if any(_gpu_index(d) >= len(hardware.gpus) for d in used):
        raise PlacementError(f"the plan puts tensors on {', '.join(sorted(used))} but {hardware.name} has "
                             f"{len(hardware.gpus)} GPU(s); plan with gpu_memory={hardware.gpu_memory()} "
                             f"(or gpu_layers=0 for a CPU-only machine)")
    cost = CostModel(plan, hardware, threads, act_quant=act_quant, kv_bytes=kv_bytes, experts=experts, mmap=mmap)
    cost.repack = repack
    if policy == "ik_llama.cpp" and not hardware.cpu.kernel_gflops:   # measured rates are moert's own kernels
        cost.cpu_gemm_x = ik_cpu_gemm_x(build, repack)
    if not hardware.cpu.kernel_gflops:                # the int8 dot path the engine's kernels take on this ISA
        cost.cpu_int8_x = kinds.cpu_int8_x(hardware.cpu, policy)
        cost.amx_engine = policy                      # llama.cpp's AMX tiles for dense matmuls (kinds.amx_gemm_x)
    if policy == "llama.cpp" and not hardware.cpu.kernel_gflops:   # its CPU flash attention kernels (ik's: not it)
        cost.attn = kinds.llama_cpu_attention(hardware.cpu, build, kv_bytes, flash_attn)
    m = cost.shape
    q = selection(plan.metadata, trace, m.n_layer)
    parts: list[Part] = []
    mean_kv = depth + n_gen / 2          # linear in n_kv (llama.cpp's CPU FA kernel nearly): the mean stands for all
    parts += launch.apply(_forward(cost, q, 1, mean_kv, "decode", policy), hardware, graphs)
    # the prompt's u-batches: the full ones differ only in their KV position, and every term is linear in it (the
    # attention's bytes and FLOPs, a max of two quantities proportional to it, plus fixed costs), so one forward at
    # their mean position, times their number, is their sum: exact, and constant work for any n_prompt
    full, rest = divmod(n_prompt, n_ubatch)
    prefill_s = 0.0
    for B, count, n_kv in ((n_ubatch, full, depth + n_ubatch * (full - 1) / 2 + n_ubatch / 2),
                           (rest, 1, depth + full * n_ubatch + rest / 2)):
        if B and count:
            ub = [_times(p, count) for p in _forward(cost, q, B, n_kv, "prefill", policy)]
            parts += ub
            prefill_s += sum(p.seconds for p in ub)
    decode_s = sum(p.seconds for p in parts if p.phase == "decode")
    memory = _gpu_memory(plan, m, hardware, n_ctx or depth + n_prompt + n_gen, n_ubatch)
    settings = dict(hardware=hardware.name, n_prompt=n_prompt, n_gen=n_gen, depth=depth, policy=policy,
                    threads=cost.threads, n_ubatch=n_ubatch, kv_bytes=kv_bytes, trace=trace is not None,
                    overlap="none (splits run in order)", graphs=graphs, numa=numa, repack=repack,
                    build=build)
    pred = Prediction(1.0 / decode_s if decode_s else math.inf, n_prompt / prefill_s if prefill_s else 0.0,
                      decode_s, prefill_s, parts, all(v["need"] <= v["capacity"] for v in memory.values()),
                      memory, settings)
    pred.classes = coverage.of(pred, plan, hardware)
    ram = hardware.cpu.mem_gib if ram_gib is None else ram_gib
    if not ram:
        return pred
    from moert.cost import capacity

    return capacity.with_ram(pred, plan, ram, n_ctx, disk or capacity.DEFAULT_DISK, mmap=mmap)


def ik_cpu_gemm_x(build: str = "", repacked: bool = False) -> float:
    """ik_llama.cpp's batched CPU matmuls against mainline's, for a build of that date ("": today's) on weights
    repacked by -rtr or not: IK_CPU_GEMM_X, or / IK_REPACK_X for a build before IK_REPACK_DATE on weights not
    repacked (each type then ran its own kernel)."""
    return IK_CPU_GEMM_X / IK_REPACK_X if build and build < IK_REPACK_DATE and not repacked else IK_CPU_GEMM_X


def _times(p: Part, n: int) -> Part:
    """A part done n times: its bytes, FLOPs, ops and seconds times n."""
    return p if n == 1 else replace(p, bytes=p.bytes * n, flops=p.flops * n, ops=p.ops * n, seconds=p.seconds * n)


def _gpu_index(dev: str) -> int:
    return int(dev.split(":")[1])


def _dev(dev: str) -> str:
    return "cpu" if dev == "cpu" else f"gpu{_gpu_index(dev)}"


def _items(ents, B: int) -> list[tuple[str, float, float]]:
    """(type, bytes, FLOPs) of dense tensors read once and applied to B tokens."""
    return [(e.type, float(e.nbytes), 2.0 * B * elements(e)) for e in ents]


class CostModel:
    """The model's terms for one plan on one machine. predict() sums them over llama-bench's tests; the virtual
    clock (moert/cost/vclock.py) charges the same terms as a real forward on sim GPUs runs, so the two agree."""

    def __init__(self, plan, hardware: Hardware, threads: int | None = None, *, act_quant: str | None = None,
                 kv_bytes: float = 2, experts: dict | None = None, mmap: bool = True):
        self.plan, self.hw, self.act_quant = plan, hardware, act_quant
        link = hardware.link            # op offload copies mmap'd (pageable) weights through a staging array
        self.offload_link = link.staged(hardware.cpu) if link is not None and mmap else link
        self.threads = threads or hardware.cpu.cores
        self.cpu_gemm_x = 1.0                   # CPU batched-matmul speed relative to llama.cpp's (IK_CPU_GEMM_X)
        self.cpu_int8_x = 1.0                   # the ISA's int8 dot rate relative to the fitted one (kinds.cpu_int8_x)
        self.repack = False                     # ik_llama.cpp's -rtr: repack.offloadable decides what op offload takes
        self.amx_engine = ""                    # the engine whose AMX tiles apply (kinds.amx_gemm_x); "": none
        self.attn = None                        # llama.cpp's CPU attention kernels (kinds.LlamaCpuAttention)
        self.shape = Shape(plan, kv_bytes, experts)
        arch = plan.metadata.get("general.architecture")
        self.swa_period = SWA_PERIOD.get(arch, 0)
        self.swa_window = int(plan.metadata.get(f"{arch}.attention.sliding_window") or 0) if self.swa_period else 0

    def slides(self, layer: int) -> bool:
        """Whether a layer attends over a sliding window (llama.cpp's set_swa_pattern(n): il % n < n - 1)."""
        return bool(self.swa_window) and layer % self.swa_period < self.swa_period - 1

    def part(self, phase: str, dev: str, layer, stage: str, items, ops: float, B: int) -> Part:
        """One term: `items` [(type, bytes, FLOPs[, tokens per matmul])] and `ops` ops on dev (plan name) in a
        forward of B tokens."""
        s, bound = _time(dev, items, ops, self, B)
        return Part(phase, _dev(dev), layer, stage, sum(i[1] for i in items), sum(i[2] for i in items), ops, s,
                    bound)

    def stage(self, phase: str, dev: str, layer, stage: str, items, matmuls: int, B: int, used: float = 1.0) -> Part:
        """A stage's term: its matmuls plus the stage's other ops (norms, RoPE, top-k, adds); `used`: the chance
        it runs at all (a device's experts a batch may not select)."""
        return self.part(phase, dev, layer, stage, items, (matmuls + _EXTRA_OPS[stage]) * used, B)

    def dense(self, phase: str, dev: str, layer: int, stage: str, ents, B: int) -> Part:
        """Dense tensors `ents` of a stage ("attention", "router", "ffn") applied to B tokens on dev."""
        return self.stage(phase, dev, layer, stage, _items(ents, B), sum(len(e.shape) >= 2 for e in ents), B)

    def kv(self, phase: str, dev: str, layer: int, B: int, n_kv: float) -> Part:
        """B queries attending to n_kv cached positions (the mean over the batch): the KV read and its FLOPs."""
        m = self.shape
        if self.slides(layer):        # its own cache of window + u-batch positions (llama_kv_cache_iswa)
            n_kv = min(n_kv, self.swa_window + B / 2)
        return self.part(phase, dev, layer, "attention", [("KV", n_kv * m.Hkv * m.kv_width * m.kv_bytes,
                                                           2.0 * B * n_kv * m.H * (m.Dk + m.Dv), B, n_kv)], 2, B)

    def output(self, phase: str, dev: str, ents, rows: int, B: int) -> Part:
        """The final norm and output projection of `rows` positions on dev."""
        return self.part(phase, dev, None, "output", _items(ents, rows), len(ents) + 1, B)

    def expert_load(self, layer: int, B: int, q: np.ndarray | None = None,
                    counts: np.ndarray | None = None) -> dict[str, tuple]:
        """Per device holding some of layer's experts: ([(type, bytes of the experts read, FLOPs, tokens per
        expert)], chance the batch uses the device at all), from q (E,) the chance a token selects each expert
        (expected), or counts (E,) a batch's actual selections."""
        return expert_load(self.shape.layers[layer]["experts"], self.shape, B, q, counts)


def _forward(cost: CostModel, q: np.ndarray, B: int, n_kv: float, phase: str, policy: str) -> list[Part]:
    """The parts of one forward of B tokens with n_kv positions in the cache (mean over the batch)."""
    plan, m, hw, parts = cost.plan, cost.shape, cost.hw, []
    link, act = hw.link, B * m.D * 4                                   # activations: B x D float32
    gpu = plan.devices[0].name if plan.devices and hw.gpus else None     # where op offload runs CPU weights

    def hop(layer, nbytes, copies=1.0, stage="transfer"):
        """`copies` moves of `nbytes` each (fractional: the chance the move happens)."""
        if link is not None and copies > 0:
            s = (cost.offload_link if stage == "offload" else link).seconds(nbytes * copies, copies)
            lat = copies * link.latency_us * 1e-6
            parts.append(Part(phase, "link", layer, stage, nbytes * copies, 0, copies, s,
                              "latency" if lat > s - lat else "bandwidth"))

    def offloads(is_moe: bool, types) -> bool:
        if gpu is None or policy == "none" or B < OFFLOAD_MIN_BATCH:
            return False
        if not all(offloadable(t, cost.repack) for t in types):   # -rtr made a type the GPU cannot run
            return False
        return not (is_moe and policy == "ik_llama.cpp" and B < OFFLOAD_MIN_BATCH * m.E / max(m.K, 1))

    where = "cpu"                                                       # token_embd rows are looked up on the CPU
    for il in range(m.n_layer):
        st = m.layers[il]
        home = plan.attention_device(il).name
        if home != where:
            hop(il, act)
        where = home
        # weights: attention projections, the MoE block's norm and router, a dense FFN or shared experts
        router = home                                                   # where top-k picks the experts
        for stage in ("attention", "router", "ffn"):
            for dev, ents in _by_device(st[stage]).items():
                run_on = gpu if dev == "cpu" and offloads(False, [e.type for e in ents]) else dev  # op offload
                if run_on != dev:
                    hop(il, sum(e.nbytes for e in ents), stage="offload")
                if run_on != home:
                    hop(il, act, 2.0)
                if stage == "router" and any(ROUTER.search(e.name) for e in ents):
                    router = run_on
                parts.append(cost.dense(phase, run_on, il, stage, ents, B))
            if stage == "attention":                                    # the attention itself, where KV lives
                parts.append(cost.kv(phase, home, il, B, n_kv))
        # experts: per device, the selected experts' bytes and the FLOPs of the token-expert pairs there
        for dev, (items, p_used) in cost.expert_load(il, B, q[il]).items():
            run_on = gpu if dev == "cpu" and offloads(True, [i[0] for i in items]) else dev  # the used experts
            if run_on != dev:
                hop(il, sum(i[1] for i in items), stage="offload")
            if run_on != home:
                hop(il, act, 2.0 * p_used)
            if run_on != router:
                # the selection crosses too: ggml_backend_sched copies each input of a split from the backend that
                # made it, and mul_mat_id's ids (B x K int32) and the weights it scales by (B x K) come from top-k
                hop(il, B * m.K * 4.0, 2.0 * p_used)
            parts.append(cost.stage(phase, run_on, il, "experts", items, len(items), B, p_used))
            if run_on != dev and policy == "ik_llama.cpp" and any(_DOWN_BIAS.search(e.name) and e.device == "cpu"
                                                                  for e in st["experts"]):
                # ik_llama.cpp offloads an op whose weight is in host memory only if its ne[1] >= 32 (its CUDA
                # offload_op); the down projection's bias-add (GGML_OP_ADD_ID, [D, K, B]: ne[1] = K) never is, so
                # with the bias in RAM (`-ot exps=CPU`) it runs on the CPU between offloaded matmuls: the B x K x D
                # output goes to the host (with the B x K ids) and back, each layer. -fmoe's fused up/gate op adds
                # its own biases on the GPU. Mainline offloads ADD_ID (ggml_nrows = K B >= 32): no crossing.
                down = B * m.K * m.D * 4.0
                hop(il, down + B * m.K * 4.0, p_used)
                parts.append(cost.part(phase, "cpu", il, "experts", [("F32", 2.0 * down, B * m.K * m.D)], p_used, B))
                hop(il, down, p_used)
        if _layer_on_cpu(st) and hw.cpu.layer_us:
            parts.append(Part(phase, "cpu", il, "overhead", 0, 0, 1, hw.cpu.layer_us * 1e-6, "overhead"))
    for dev, ents in _by_device(m.outputs).items():
        if dev != where:
            hop(None, act)
        rows = 1                                                         # llama-bench keeps the last logits only
        parts.append(cost.output(phase, dev, ents, rows, B))
        if dev != "cpu":
            hop(None, rows * elements(ents[-1]) / m.D * 4)             # logits back to the host
    if hw.cpu.token_us:
        parts.append(Part(phase, "cpu", None, "overhead", 0, 0, 1, hw.cpu.token_us * 1e-6, "overhead"))
    return parts


def _layer_on_cpu(stages: dict) -> bool:
    """Whether any tensor of a layer runs on the CPU (moert's per-layer cost applies)."""
    return any(e.device == "cpu" for ents in stages.values() for e in ents)


def _by_device(entries) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for e in entries:
        out[e.device].append(e)
    return out


def gpu_memory(plan, hardware: Hardware, n_ctx: int, n_ubatch: int = 512, kv_bytes: float = 2) -> dict[str, dict]:
    """Per GPU of `hardware`: bytes needed (weights, f16 KV, buffers) and capacity, without predicting speed."""
    return _gpu_memory(plan, Shape(plan, kv_bytes), hardware, n_ctx, n_ubatch)


def _gpu_memory(plan, m: Shape, hw: Hardware, n_ctx: int, n_ubatch: int) -> dict[str, dict]:
    """Per GPU: weights and KV as moert's own estimate counts them (placement/memory.py: one memory model for the
    runtime, fit and this; KV at the prediction's bytes per element, f16 by default) + llama.cpp's compute
    buffer (flash attention: no score matrix; B x (4 D + 3 K F) floats, plus B x vocabulary logits where the
    output layer is); capacity is the card's memory less `reserved_gib` (CUDA context and workspaces)."""
    out: dict[str, dict] = {}
    F = int(md_value(plan.metadata, "expert_feed_forward_length", 0))
    est = estimate(plan, n_ctx).devices   # f16: the default KV cache type
    for d in plan.devices:
        if _gpu_index(d.name) >= len(hw.gpus):
            continue                                                   # an unused device of the plan
        g = hw.gpus[_gpu_index(d.name)]
        w, kv = est[d.name].weights, est[d.name].kv * m.kv_bytes / 2   # f16: 2 bytes an element
        out_rows = next((e.shape[0] for e in plan if e.name == "output.weight" and e.device == d.name), 0)
        scratch = n_ubatch * (4 * m.D + 3 * m.K * F + out_rows) * 4
        out[_dev(d.name)] = {"need": w + kv + scratch, "capacity": g.mem_bytes - int(g.reserved_gib * 2**30),
                             "weights": w, "kv": kv, "scratch": scratch}
    return out


predict.VALIDATION = VALIDATION      # what a user reads beside moert.predict hangs on it (moert.predict.VALIDATION)
predict.trust = trust


__all__ = ["IK_REPACK_DATE", "IK_REPACK_X", "POLICIES", "VALIDATION", "CostModel", "Part", "Prediction", "expert_sets",
           "gpu_memory", "ik_cpu_gemm_x", "predict", "trust"]
