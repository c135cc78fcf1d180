"""The fused MoE layer: every selected expert's gate, up, SiLU(gate)*up, down and the router-weighted
sum for a token or a batch, in ONE parallel region, straight from the experts' GGUF bytes.

    moe_ffn_fused(x, ids, weights, gate, up, down)       fast: one Numba call, one parallel region
    moe_ffn_fused_ref(x, ids, weights, gate, up, down)   reference twin: a plain loop over experts

Same signature as kernels/moe.py's moe_ffn (gate/up (E, F, D), down (E, D, F) QTensors), so it drops in.

How the work is cut. Tokens are grouped by expert (kernels.moe.group_by_expert), so each selected
expert's weights stream once per call whatever the batch. The unit of work is an item (expert e,
part p): part p of P owns expert hidden units [p F/P, (p+1) F/P) -- its rows of gate and up, and the
same columns of down, whose product is a partial sum of e's output (down . h = sum over parts). So an
item needs nothing from any other item: no barrier, one region. P = 1 unless there are too few experts
to keep every thread busy (decode with many threads). Items go to threads largest-first onto the
least-loaded thread; each item writes its own rows of Y (P, T*K, D), and the router-weighted sum of Y
into out (T, D) runs after the region (T*K*P*D adds, serially: microseconds at decode).
Results do not depend on the thread count: every item is summed in the same order wherever it runs. On
one thread PreparedExperts runs `serial_kernel`, the same code without the parallel region.

Compiled per (gate/up type, down type, act_quant mode) on first use (`layer_kernel`): a copy of one
template with the two types' row kernels bound (kernels/jit.variant, whose name also carries a hash of
the kernels' source, so editing a kernel it inlines recompiles it), so a Q4_K/Q6_K model compiles the Q4_K
and Q6_K row kernels only.

Dimension legend: T tokens, K experts per token, E experts, D hidden, F expert hidden, n tokens of one
expert, P parts per expert.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from moert.activations import ACTS, glu
from moert.kernels import matmul_q, moe_tiles
from moert.kernels.blockdot import Z0
from moert.kernels.glu import act_mul
from moert.kernels.jit import variant
from moert.kernels.ktypes import MATMUL_TYPES, PRANGE_ONLY, TYPES
from moert.kernels.matmul import matmul_ref, packs, table, threads_for
from moert.kernels.matmul_q import quantize_rows, quantized
from moert.kernels.matmul_tiles import one_blas_thread
from moert.kernels.moe import check_biases, check_experts, check_inputs, group_by_expert
from moert.kernels.qtensor import QTensor
from moert.quants.dequant import lookup, slice_expert

__all__ = ["PreparedExperts", "expert_layer", "layer_kernel", "moe_ffn_fused", "moe_ffn_fused_ref", "parts_for",
           "supports"]

ACT_CODES = {a: i for i, a in enumerate(ACTS)}     # swiglu 0, geglu 1, swiglu_oai 2 (moert.activations.ACTS)


@njit(cache=True)
def _plan(offsets, parts, n_threads, item_bytes, macs_per_token):
    """Items (expert, part) of the active experts, assigned largest-first to the least-loaded thread.
    Returns order (n_items,) of item ids grouped by thread, start (n_threads + 1,) into order. Plain loops
    (no np.argmin, np.arange, copy): each NumPy function a kernel calls adds to its first-run compile."""
    E = offsets.shape[0] - 1
    active = np.empty(E, dtype=np.int64)
    n_act = 0
    for e in range(E):
        if offsets[e + 1] > offsets[e]:
            active[n_act] = e
            n_act += 1
    n_items = n_act * parts
    cost = np.empty(n_items, dtype=np.float64)
    by_cost = np.empty(n_items, dtype=np.int64)                        # stable insertion sort, largest first
    for i in range(n_items):
        e = active[i // parts]
        cost[i] = item_bytes + macs_per_token * (offsets[e + 1] - offsets[e])
        j = i
        while j > 0 and cost[by_cost[j - 1]] < cost[i]:
            by_cost[j] = by_cost[j - 1]
            j -= 1
        by_cost[j] = i
    owner = np.empty(n_items, dtype=np.int64)
    load = np.zeros(n_threads, dtype=np.float64)
    for i in by_cost:
        th = 0
        for k in range(1, n_threads):                                   # the least-loaded thread, lowest first
            if load[k] < load[th]:
                th = k
        owner[i] = th
        load[th] += cost[i]
    start = np.zeros(n_threads + 1, dtype=np.int64)
    for i in range(n_items):
        start[owner[i] + 1] += 1
    for th in range(n_threads):
        start[th + 1] += start[th]
    fill = np.empty(n_threads, dtype=np.int64)
    for th in range(n_threads):
        fill[th] = start[th]
    order = np.empty(n_items, dtype=np.int64)
    for i in range(n_items):
        order[fill[owner[i]]] = active[i // parts] * parts + i % parts
        fill[owner[i]] += 1
    return order, start


_LAYERS: dict[tuple[str, str, int, bool, bool], tuple] = {}   # (g_type, d_type, aq, g_packed, d_packed) ->
#                                                               (parallel kernel, serial copy)


def layer_kernel(g_type: str, d_type: str, aq: int = 0, g_packed: bool = False, d_packed: bool = False):
    """The compiled layer kernel for gate/up of type g_type and down of d_type (made on first use):
    kernel(x, ids, wts, g_raw, g_f16, u_raw, u_f16, d_raw, d_f16, nb_in, nb_down, block_down, parts, act,
    gb, ub, db, n_threads) -> (T, D). n_threads = matmul.threads(), passed in: called inside, it makes the
    function uncacheable. parts = 0 picks them with parts_for. aq != 0 (kernels/matmul_q.py): an expert
    reads x quantized (matmul_q.quantized: int8 always, int16 when T == 1), for the types with quantized
    kernels; 0 compiles the float kernel. g_packed, d_packed: gate/up, down repacked (kernels/repack.py; int8)."""
    key = (g_type, d_type, aq, g_packed, d_packed)
    if key not in _LAYERS:
        g, d = TYPES[g_type], TYPES[d_type]
        gq = matmul_q.QMAX[aq] if aq and matmul_q.QMAX[aq] in g.quant else 0    # 0: float kernels
        dq = matmul_q.QMAX[aq] if aq and matmul_q.QMAX[aq] in d.quant else 0
        gm, dm = aq == 2 and g.q8_32 is not None, aq == 2 and d.q8_32 is not None     # MXFP4: x per 32
        g32, d32 = g.q8_32 or (_no_quant32, _no_rows32), d.q8_32 or (_no_quant32, _no_rows32)
        name = f"{g_type.lower()}{'r' * g_packed}_{d_type.lower()}{'r' * d_packed}_aq{aq}"
        (g_q, g_x), (d_q, d_x) = g.quant_rows(gq, g_packed) or _NO_Q, d.quant_rows(dq, d_packed) or _NO_Q
        items = variant(_moe_items, f"moe_items_{name}",
                               g_rows=g.rows, g_sums=g.sums_of, GQ=gq, g_rows_q=g_q, g_x=g_x,
                               d_rows=d.rows, d_sums=d.sums_of, DQ=dq, d_rows_q=d_q, d_x=d_x,
                               GM=gm, g_quant32=g32[0], g_rows32=g32[1], DM=dm, d_quant32=d32[0], d_rows32=d32[1])
        _LAYERS[key] = (variant(_moe_layer, f"moe_layer_{name}", parallel=PRANGE_ONLY, items=items),
                        variant(_moe_layer, f"moe_layer_{name}_serial", items=items), items)
    return _LAYERS[key][0]


def items_kernel(g_type: str, d_type: str) -> object:
    """The float layer's per-thread worker for these types (what kernels/moe_tiles.py falls back on)."""
    layer_kernel(g_type, d_type)
    return _LAYERS[(g_type, d_type, 0, False, False)][2]


def layer_of(items, name: str):
    """The layer kernel (this module's plan, region and sum) around another per-thread worker of _moe_items'
    signature (kernels/moe_tiles.py)."""
    return variant(_moe_layer, name, parallel=PRANGE_ONLY, items=items)


def serial_kernel(g_type: str, d_type: str, aq: int = 0, g_packed: bool = False, d_packed: bool = False):
    """layer_kernel's serial copy (the same code without a parallel region, same results), which
    PreparedExperts runs on one thread: it compiles 3-4 s faster on a first run than the parallel one (which
    a one-thread process, as `moert demo`, then never compiles)."""
    layer_kernel(g_type, d_type, aq, g_packed, d_packed)
    return _LAYERS[g_type, d_type, aq, g_packed, d_packed][1]


@njit(cache=True)
def _no_quant32(x):
    """Bound as the per-32 quantizer of a type without one (its branch never runs: GM or DM is False)."""
    return np.zeros(x.shape, dtype=np.int8), np.zeros((x.shape[0], max(1, x.shape[1] // 32)), dtype=np.float32)


@njit(cache=True)
def _no_rows32(w, x8, xd, out, r0, r1, b0, b1, f16):
    """Bound as the per-32 int8 row kernel of a type without one (never runs)."""
    out[:, r0:r1] = np.nan


@njit(cache=True)
def _no_rows_q(w, xq, x8, xd, xb, out, r0, r1, b0, b1, f16):
    """Bound as the quantized row kernel of a type without one (its branch never runs: GQ or DQ is 0)."""
    out[:, r0:r1] = np.nan


_NO_Q = (_no_rows_q, matmul_q.x_as_is)


# Bound per (gate/up type, down type, mode) by layer_kernel: g_rows, d_rows (the types' row kernels), g_sums,
# d_sums (their sums_of), GQ, DQ (qmax of their quantized kernels, 0 for float), g_rows_q, d_rows_q and g_x,
# d_x (the x each reads, KernelType.quant_rows); the placeholders only name them.
GQ = DQ = 0
GM = DM = False            # gate/up, down: int8 per 32 (a type's q8_32, MXFP4's) in the int8 mode
g_rows = d_rows = g_sums = d_sums = g_rows_q = d_rows_q = g_quant32 = g_rows32 = d_quant32 = d_rows32 = None
g_x = d_x = None
items = None              # _moe_layer's per-thread worker (_moe_items bound to the types)

def _moe_layer(x, ids, wts, g_raw, g_f16, u_raw, u_f16, d_raw, d_f16, nb_in, nb_down, block_down, parts,
               act, gb, ub, db, n_threads):
    """The whole routed-expert layer; see the module docstring. Raw tensors (E, rows, row_bytes) uint8;
    act an ACT_CODES code; gb, ub (E, F) and db (E, D) float32 biases, or (0, 0) arrays for none."""
    T, K = ids.shape
    E, F = g_raw.shape[0], g_raw.shape[1]
    D = d_raw.shape[1]
    offsets, slots = group_by_expert(ids, E)                            # (E+1,), (T*K,) flat t*K+k
    if parts == 0:                                                      # auto: from the experts hit
        hit = Z0
        for e in range(E):
            hit += offsets[e + 1] > offsets[e]
        parts = parts_for(hit, nb_down, n_threads)
    item_bytes = (2 * g_raw[0].size + d_raw[0].size) / parts
    order, start = _plan(offsets, parts, n_threads, item_bytes, 3.0 * F * D / parts)
    Y = np.zeros((parts, T * K, D), dtype=np.float32)                  # each item's partial outputs
    for th in prange(n_threads):                                        # the region only calls the worker:
        items(order[start[th]:start[th + 1]], offsets, slots, x, K, T, g_raw, g_f16, u_raw, u_f16, d_raw,
              d_f16, nb_in, nb_down, block_down, parts, act, gb, ub, Y)  # a parfor body compiles slowly
    out = np.zeros((T, D), dtype=np.float32)                            # (T, D)
    for e in range(E):                                                  # grouped order: by expert
        for q in range(offsets[e], offsets[e + 1]):
            s = slots[q]
            t, c = s // K, wts[s // K, s % K]
            for p in range(parts):
                for i in range(D):
                    out[t, i] += c * Y[p, q, i]
            if db.shape[1] > 0:
                for i in range(D):
                    out[t, i] += c * db[e, i]
    return out


def _moe_items(mine, offsets, slots, x, K, T, g_raw, g_f16, u_raw, u_f16, d_raw, d_f16, nb_in, nb_down,
               block_down, parts, act, gb, ub, Y):
    """One thread's items (ids e * parts + p in `mine`): expert e's tokens through part p of gate, up, act
    and down, into Y[p] at e's rows of the grouped order. Serial; _moe_layer's region calls it per thread."""
    F, D = g_raw.shape[1], d_raw.shape[1]
    Fp = nb_down // parts * block_down                                  # hidden units of a part
    for j in range(mine.shape[0]):
        e, p = mine[j] // parts, mine[j] % parts
        o0, n = offsets[e], offsets[e + 1] - offsets[e]
        xe = np.empty((n, x.shape[1]), dtype=np.float32)                # (n, D) this expert's tokens
        for i in range(n):
            src = slots[o0 + i] // K
            for c in range(x.shape[1]):                                 # not xe[i] = x[src]: see ktypes
                xe[i, c] = x[src, c]
        f0, f1 = p * Fp, (p + 1) * Fp
        g = np.zeros((n, F), dtype=np.float32)                          # (n, F), columns [f0, f1) used
        u = np.zeros((n, F), dtype=np.float32)
        if GM:                                                          # x rounded per 32 (MXFP4, int8 mode)
            x8, xd = g_quant32(xe)
            g_rows32(g_raw[e], x8, xd, g, f0, f1, Z0, nb_in, g_f16)
            g_rows32(u_raw[e], x8, xd, u, f0, f1, Z0, nb_in, u_f16)
        elif quantized(GQ, T):                                          # opt-in: x quantized
            xq, x8, xd, xb = quantize_rows(xe, GQ)
            yq, y8, yd, yb = g_x(xq, x8, xd, xb)
            g_rows_q(g_raw[e], yq, y8, yd, yb, g, f0, f1, Z0, nb_in, g_f16)
            g_rows_q(u_raw[e], yq, y8, yd, yb, u, f0, f1, Z0, nb_in, u_f16)
        else:
            xs = g_sums(xe)
            g_rows(g_raw[e], xe, xs, g, f0, f1, Z0, nb_in, g_f16)
            g_rows(u_raw[e], xe, xs, u, f0, f1, Z0, nb_in, u_f16)
        act_mul(g, u, f0, f1, act, gb, ub, e)                           # h = act(g + bg, u + bu)
        b0, b1 = f0 // block_down, f1 // block_down
        if DM:
            h8, hd = d_quant32(g)                                       # columns outside [f0, f1) are 0
            d_rows32(d_raw[e], h8, hd, Y[p, o0:o0 + n], Z0, D, b0, b1, d_f16)
        elif quantized(DQ, T):
            hq, h8, hd, hb = quantize_rows(g, DQ)                       # columns outside [f0, f1) are 0
            zq, z8, zd, zb = d_x(hq, h8, hd, hb)
            d_rows_q(d_raw[e], zq, z8, zd, zb, Y[p, o0:o0 + n], Z0, D, b0, b1, d_f16)
        else:
            d_rows(d_raw[e], g, d_sums(g), Y[p, o0:o0 + n], Z0, D, b0, b1, d_f16)


def _raw3(t: QTensor) -> np.ndarray:
    """A stacked expert tensor's bytes as a read-only (E, rows, row_bytes) uint8 view."""
    raw = t.raw
    if raw.ndim == 3 and raw.dtype == np.uint8 and not raw.flags.writeable and raw.flags.c_contiguous:
        return raw                                                      # the weight store's layout
    if raw.dtype != np.uint8:
        raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    a = np.ascontiguousarray(raw).reshape(t.shape[0], t.shape[1], -1)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


@njit(cache=True)
def parts_for(n_active, n_blocks_down, threads):
    """Parts per expert: 1, or the smallest divisor of down's blocks per row that gives every thread
    at least two items (decode on many threads: 8 experts, 16 threads -> 3 parts of 256 columns)."""
    for p in range(1, n_blocks_down + 1):
        if n_blocks_down % p == 0 and n_active * p >= 2 * threads:
            return p
    return n_blocks_down


def supports(gate: QTensor, up: QTensor, down: QTensor) -> bool:
    """Whether moe_ffn_fused takes these tensors: types with row kernels, gate and up of one type."""
    return gate.type == up.type and gate.type in MATMUL_TYPES and down.type in MATMUL_TYPES


class PreparedExperts:
    """One layer's gate/up/down made ready for repeated calls (a model keeps one per CPU expert layer): the
    checks, raw views, tables and the compiled kernel looked up once."""

    __slots__ = ("shape", "args", "kernel", "serial", "packed_bytes", "expert_bytes", "tiled")

    def __init__(self, gate: QTensor, up: QTensor, down: QTensor, act_quant: str | None = None,
                 act: str = "swiglu", biases: tuple | None = None, repack: bool = False):
        """act_quant: None (float, default), "int16" (one-token calls read x quantized) or "int8" (every
        call does); see kernels/matmul_q.py. act: the gated activation (moert.activations.ACTS); biases: None or
        float32 (bg (E, F), bu (E, F), bd (E, D)) added to gate, up and down outputs. repack: with "int8",
        Q4_K tensors are copied into kernels/repack.py's layout (same results; `packed_bytes` of memory)."""
        aq = matmul_q.mode(act_quant)
        for t in (gate, up, down):
            if t.type not in MATMUL_TYPES:
                lookup(t.type, MATMUL_TYPES, "moert.kernels.moe_fused")        # raises UnsupportedTypeError
        E, F, D = check_experts("PreparedExperts", gate, up, down)
        if gate.type != up.type:
            raise ValueError(f"gate is {gate.type} but up is {up.type}; the fused kernel reads both with one "
                             f"row kernel (use kernels.moe.moe_ffn for mixed gate/up types)")
        bd = TYPES[down.type].block
        self.shape = (E, F, D)
        gb, ub, db = check_biases("PreparedExperts", biases, E, F, D)
        gp, dp = packs(gate, act_quant, repack), packs(down, act_quant, repack)
        raws = [TYPES[t.type].packed[0](_raw3(t)) if p else _raw3(t) for t, p in ((gate, gp), (up, gp), (down, dp))]
        self.packed_bytes = sum(r.nbytes for r, p in zip(raws, (gp, gp, dp)) if p)
        self.expert_bytes = sum(r.nbytes for r in raws) // E            # one expert's gate, up and down
        self.args = (raws[0], table(gate.type), raws[1], table(up.type), raws[2], table(down.type),
                     D // TYPES[gate.type].block, F // bd, bd, 0, _act_code(act), gb, ub, db)
        self.kernel = layer_kernel(gate.type, down.type, aq, gp, dp)
        self.serial = serial_kernel(gate.type, down.type, aq, gp, dp)   # for one thread: compiles without a region
        self.tiled = None                                               # a float prompt: tiles, then sgemm
        if not (aq or gp or dp):
            self.tiled = moe_tiles.layer(gate.type, down.type, items_kernel(gate.type, down.type), layer_of)

    def __call__(self, x: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """sum_k weights[t, k] * expert_{ids[t, k]}(x[t]) -> (T, D) float32."""
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        if ids.dtype != np.int32 or not ids.flags.c_contiguous:
            ids = np.ascontiguousarray(ids, dtype=np.int32)
        if weights.dtype != np.float32 or not weights.flags.c_contiguous:
            weights = np.ascontiguousarray(weights, dtype=np.float32)
        check_inputs("moe_ffn_fused", x, ids, weights, self.shape[0], self.shape[2])   # its writes index by id
        if x.shape[0] == 0:
            return np.zeros((0, self.shape[2]), dtype=np.float32)
        hit = min(ids.size, self.shape[0])                              # at most this many experts read
        n = threads_for(hit * self.expert_bytes)                        # small: one thread, no region
        if x.shape[0] >= moe_tiles.MIN_TOKENS and self.tiled is not None:
            with one_blas_thread():
                return self.tiled(x, ids, weights, *self.args, n)
        return (self.kernel if n > 1 else self.serial)(x, ids, weights, *self.args, n)


def _act_code(act: str) -> int:
    if act not in ACT_CODES:
        raise ValueError(f"unknown activation {act!r}; one of {', '.join(ACTS)}")
    return ACT_CODES[act]


def moe_ffn_fused(x: np.ndarray, ids: np.ndarray, weights: np.ndarray, gate: QTensor, up: QTensor,
                  down: QTensor, act: str = "swiglu", biases: tuple | None = None) -> np.ndarray:
    """Routed gated experts of one layer in one parallel region: sum_k weights[t, k] * expert(x[t]) -> (T, D).
    x (T, D) float32, ids (T, K) int, weights (T, K) float32; gate/up (E, F, D), down (E, D, F); act and
    biases as PreparedExperts."""
    return PreparedExperts(gate, up, down, act=act, biases=biases)(np.asarray(x), np.asarray(ids),
                                                                   np.asarray(weights))


def _expert(t: QTensor, e: int) -> tuple[np.ndarray, str, tuple[int, ...]]:
    data, shape = slice_expert(t.raw, t.type, t.shape, e)
    return data, t.type, shape


def moe_ffn_fused_ref(x: np.ndarray, ids: np.ndarray, weights: np.ndarray, gate: QTensor, up: QTensor,
                      down: QTensor, act: str = "swiglu", biases: tuple | None = None) -> np.ndarray:
    """Reference twin: for each expert, its tokens through gate, up, act, down (matmul_ref), weighted."""
    out = np.zeros((x.shape[0], gate.shape[2]), dtype=np.float32)       # (T, D)
    for e in np.unique(ids[ids >= 0]):                                  # -1: a slot another device runs
        tok, slot = np.nonzero(ids == e)                                # (n,), (n,)
        w = [QTensor(*_expert(t, int(e))) for t in (gate, up, down)]
        g, u = matmul_ref(x[tok], w[0]), matmul_ref(x[tok], w[1])      # (n, F)
        if biases is not None:
            g, u = g + biases[0][e], u + biases[1][e]
        y = matmul_ref(glu(g, u, act), w[2])                            # (n, D)
        if biases is not None:
            y = y + biases[2][e]
        np.add.at(out, tok, y * weights[tok, slot][:, None])
    return out


def expert_layer(qs: list, biases: tuple | None, act: str, act_quant: str | None, repack: bool):
    """f(x, ids, weights) over one MoE layer's quantized gate/up/down (QTensors): this module's fused kernel where it
    takes the types, else kernels/moe.py's moe_ffn. The host's CPU expert layers (moert/experts.py) and a Ray
    worker's (moert/cluster/worker.py) both run through it."""
    from moert.kernels.moe import moe_ffn

    if supports(*qs):
        return PreparedExperts(*qs, act_quant=act_quant, act=act, biases=biases, repack=repack)
    return lambda x, ids, weights: moe_ffn(x, ids, weights, *qs, act=act, biases=biases)
