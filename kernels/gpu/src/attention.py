"""Triton attention kernels over a KV cache read in its own storage type (f32, f16, bf16, q8_0): flash-decoding for
up to 8 tokens, FlashAttention-2's forward for prompts, and the cache write.

Dimension legend: T query tokens, H query heads, Hk KV heads, G = H / Hk, Dh key dims, Dv value dims, S keys visible
(pos0 + T), NS key splits; RP rows a program (of a KV head's G * T, padded to a power of 2 >= 16, tl.dot's least;
NR programs when there are more), DC x NC q's dims read (one padded chunk, or chunks of 64 for a wide head), DVB
value dims a program (NV blocks), BN keys per step, BM tokens per prompt program.

attn_split_kernel, grid (Hk * NR, NS, NV): one program takes one KV head, all G query heads of its group and every
token (row r = t * G + g; up to RP of them), and one split of the visible keys. It converts BN keys and values at a
time to float32 tiles (each key row read once for the G * T rows), scores them with tl.dot, and keeps per row
FlashAttention's running max m, sum l and weighted values acc; then writes those partials. attn_merge_kernel, grid
(T * H,): one row's partials merged, with the attention sink in the denominator: M = max(sink, m_c), out = sum_c
acc_c e^(m_c - M) / (e^(sink - M) + sum_c l_c e^(m_c - M)). The same split and merge as kernels/flash_decode.py on
the CPU (Dao et al.'s flash-decoding; llama.cpp's ggml-cuda fattn-vec splits the same way).

The position pos0 is read from device memory (pos_ptr), and each program finds its keys from it: the grid depends on
Hk, NS, T and the head dims only, so a captured graph replays at every position. Scores and weighted values are
tl.dot with input_precision="ieee" (float32 products, no TF32): decode reads every cache byte once and does 2 FLOPs
per byte per row, so tensor cores would buy little and cost the float32 result the NumPy twin is held to.

attn_prompt_kernel, grid (cdiv(T, BM), H, NV): a prompt's BM tokens of one query head over BN-key tiles, f16 operands
into tl.dot (FlashAttention-2's forward; Triton's fused-attention tutorial), causal and windowed, sinks at the end.
kv_write_kernel, grid (T * Hk,): a step's keys or values into the cache, rounded to its type.

Cache codes (KT, VT): 0 f32, 1 f16, 2 bf16 (the uint16 bits, passed as an f16 view), 3 q8_0 (int8 values passed as
uint8, per 32 values an f16 scale in a second array (n_ctx, Hk, D / 32)). Caches are (n_ctx, Hk, D) row-major;
D the stored row (Dkr, Dvr) may exceed the dims read (Dh, Dv): MLA's latent cache is its own values' cache. Wide
heads (MLA's 576 dims) read q in NC chunks of DC dims and the values in blocks of DVB (grid axis 2), so no tile
holds a whole head.
"""

import triton
import triton.language as tl


@triton.jit
def _tile(ptr, sptr, keys, kh, Hk, D, d, ok, CT: tl.constexpr):
    """(BN, DP) float32: dims d (DP,) of rows keys (BN,) of KV head kh, in cache type CT; 0 where not ok."""
    row = (keys.to(tl.int64) * Hk + kh) * D                                  # (BN,) each row's first value
    off = row[:, None] + d[None, :]                                          # (BN, DP)
    if CT == 0:
        x = tl.load(ptr + off, mask=ok, other=0.0)
    elif CT == 1:
        x = tl.load(ptr + off, mask=ok, other=0.0).to(tl.float32)
    elif CT == 2:        # bf16: the high half of a float32
        bits = tl.load(ptr + off, mask=ok, other=0.0).to(tl.uint16, bitcast=True)
        x = (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:                # q8_0: value * its block's scale
        q = tl.load(ptr + off, mask=ok, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        soff = (row // 32)[:, None] + (d // 32)[None, :]                     # D % 32 == 0: row // 32 is exact
        x = q * tl.load(sptr + soff, mask=ok, other=0.0).to(tl.float32)
    return x


@triton.jit
def _scores(q_ptr, qrow, rok, Dh, scale, k_ptr, ks_ptr, keys, kok, kh, Hk, Dkr, KT: tl.constexpr,
            RP: tl.constexpr, BN: tl.constexpr, DC: tl.constexpr, NC: tl.constexpr, F16: tl.constexpr):
    """(RP, BN) float32 scores of rows qrow (RP,) of q against keys (BN,), NC chunks of DC dims at a time, q
    reloaded per chunk (a wide head, MLA's 576 dims, would not fit whole in registers); F16: operands rounded to
    f16 (the prompt kernel's), else float32 products (tl.dot "ieee")."""
    s = tl.zeros((RP, BN), tl.float32)
    for c in tl.static_range(NC):
        d = c * DC + tl.arange(0, DC)
        qc = tl.load(q_ptr + qrow[:, None] * Dh + d[None, :], mask=rok[:, None] & (d < Dh)[None, :], other=0.0)
        kt = _tile(k_ptr, ks_ptr, keys, kh, Hk, Dkr, d, kok[:, None] & (d < Dh)[None, :], KT)          # (BN, DC)
        if F16:
            s += tl.dot(qc.to(tl.float16), tl.trans(kt.to(tl.float16)))
        else:
            s += tl.dot(qc * scale, tl.trans(kt), input_precision="ieee")
    if F16:
        s = s * scale
    return s


@triton.jit
def attn_split_kernel(q_ptr, k_ptr, ks_ptr, v_ptr, vs_ptr, pos_ptr, mp_ptr, lp_ptr, ap_ptr,
                      T, H, Hk, Dh, Dv, Dkr, Dvr, window, n_split, scale, NR,
                      KT: tl.constexpr, VT: tl.constexpr, G: tl.constexpr, RP: tl.constexpr, DC: tl.constexpr,
                      NC: tl.constexpr, DVB: tl.constexpr, BN: tl.constexpr, WINDOW: tl.constexpr):
    """Partials of split sp = program_id(1) for rows rb * RP .. of KV head kh, program_id(0) = kh * NR + rb (NR row
    blocks: one but for many rows of a wide head): mp, lp (NS, T, H) and ap (NS, T, H, Dv) float32 at
    [sp, t, kh * G + g]; value dims vb * DVB .. of them for vb = program_id(2) (one block but for wide heads; every
    block finds the same m and l, block 0 stores them). q (T, H, Dh) float32, read NC chunks of DC
    dims (one: held for the whole loop); pos_ptr: pos0 (int32); window: keys s with p - window < s <= p for the
    query at p (WINDOW), else p >= s only. A split past the visible keys writes m = -inf, l = 0, acc = 0."""
    kh = tl.program_id(0) // NR
    sp = tl.program_id(1)
    vb = tl.program_id(2)
    pos0 = tl.load(pos_ptr)
    S = pos0 + T
    s0 = 0
    if WINDOW:
        s0 = tl.maximum(pos0 - window + 1, 0)                                # no query here sees keys before s0
    per = tl.cdiv(tl.cdiv(S - s0, n_split), BN) * BN                         # keys per split, whole steps
    a0 = s0 + sp * per
    a1 = tl.minimum(S, a0 + per)
    r = tl.program_id(0) % NR * RP + tl.arange(0, RP)                        # (RP,) rows t * G + g
    t = r // G
    h = kh * G + r % G
    rok = r < T * G
    dv = vb * DVB + tl.arange(0, DVB)
    qrow = (t * H + h).to(tl.int64)
    if NC == 1:
        d = tl.arange(0, DC)
        qv = tl.load(q_ptr + qrow[:, None] * Dh + d[None, :], mask=rok[:, None] & (d < Dh)[None, :], other=0.0)
        qv = qv * scale                                                      # (RP, DC)
    p = pos0 + t                                                             # (RP,) each row's position
    m = tl.full((RP,), float("-inf"), tl.float32)
    l = tl.zeros((RP,), tl.float32)
    acc = tl.zeros((RP, DVB), tl.float32)
    for a in range(a0, a1, BN):
        keys = a + tl.arange(0, BN)                                          # (BN,)
        kok = keys < a1
        if NC == 1:
            kt = _tile(k_ptr, ks_ptr, keys, kh, Hk, Dkr, d, kok[:, None] & (d < Dh)[None, :], KT)     # (BN, DC)
            s = tl.dot(qv, tl.trans(kt), input_precision="ieee")                                        # (RP, BN)
        else:
            s = _scores(q_ptr, qrow, rok, Dh, scale, k_ptr, ks_ptr, keys, kok, kh, Hk, Dkr, KT, RP, BN, DC, NC,
                        False)
        seen = (keys[None, :] <= p[:, None]) & kok[None, :]
        if WINDOW:
            seen = seen & (keys[None, :] > p[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)                  # a row with nothing seen yet stays 0
        alpha = tl.exp(m - base)                                             # rescales what was summed before
        e = tl.exp(s - base[:, None])                                        # (RP, BN)
        l = l * alpha + tl.sum(e, axis=1)
        vt = _tile(v_ptr, vs_ptr, keys, kh, Hk, Dvr, dv, kok[:, None] & (dv < Dv)[None, :], VT)      # (BN, DVB)
        acc = acc * alpha[:, None] + tl.dot(e, vt, input_precision="ieee")
        m = m_new
    prow = (sp * T * H + qrow)                                               # (RP,) [sp, t, h]
    first = rok & (r * 0 + vb == 0)                                          # block-shaped: a mask of its own
    tl.store(mp_ptr + prow, m, mask=first)
    tl.store(lp_ptr + prow, l, mask=first)
    tl.store(ap_ptr + prow[:, None] * Dv + dv[None, :], acc, mask=rok[:, None] & (dv < Dv)[None, :])


@triton.jit
def attn_merge_kernel(mp_ptr, lp_ptr, ap_ptr, sinks_ptr, out_ptr, TH, H, Dv, n_split,
                      CS: tl.constexpr, DVP: tl.constexpr, SINKS: tl.constexpr):
    """out[t, h] (Dv,) of row t * H + h = program_id(0): the NS splits' partials merged, CS splits at a time (one
    compile for any NS), the sink logit sinks[h] in the denominator (SINKS). out (T, H, Dv) float32."""
    row = tl.program_id(0)
    c = tl.arange(0, CS)
    big = tl.full((CS,), float("-inf"), tl.float32)
    for c0 in range(0, n_split, CS):                                         # the largest max of any split
        big = tl.maximum(big, tl.load(mp_ptr + (c0 + c) * TH + row, mask=c0 + c < n_split, other=float("-inf")))
    big = tl.max(big, axis=0)
    if SINKS:
        sink = tl.load(sinks_ptr + row % H)
        big = tl.maximum(big, sink)
    dv = tl.arange(0, DVP)
    tot = tl.zeros((CS,), tl.float32)
    acc = tl.zeros((DVP,), tl.float32)
    for c0 in range(0, n_split, CS):
        cok = c0 + c < n_split
        mc = tl.load(mp_ptr + (c0 + c) * TH + row, mask=cok, other=float("-inf"))                # (CS,)
        f = tl.where(mc == float("-inf"), 0.0, tl.exp(mc - big))            # splits this row saw nothing of: 0
        tot += tl.load(lp_ptr + (c0 + c) * TH + row, mask=cok, other=0.0) * f
        prow = ((c0 + c) * TH + row).to(tl.int64)
        ac = tl.load(ap_ptr + prow[:, None] * Dv + dv[None, :], mask=cok[:, None] & (dv < Dv)[None, :], other=0.0)
        acc += tl.sum(ac * f[:, None], axis=0)                               # (DVP,)
    den = tl.sum(tot, axis=0)
    if SINKS:
        den += tl.exp(sink - big)
    tl.store(out_ptr + row.to(tl.int64) * Dv + dv, acc / den, mask=dv < Dv)


@triton.jit
def kv_write_kernel(x_ptr, c_ptr, cs_ptr, pos_ptr, Hk, D, CT: tl.constexpr, DP: tl.constexpr):
    """Row (t, kh) = program_id(0) of x (T, Hk, D) float32 into cache row (pos0 + t, kh), rounded to cache type CT
    as moert/kvcache.py's TypedKV.write rounds: f16 to nearest even, bf16 to nearest even by integer ops, q8_0 as
    ggml's quantize_row_q8_0_ref (d = amax / 127, q = x / d rounded half away from zero, d stored as f16). Divisions
    are IEEE (div_rn), as NumPy's. pos0 is read from pos_ptr, so a captured graph writes at each step's position."""
    i = tl.program_id(0)
    t = i // Hk
    kh = i % Hk
    pos0 = tl.load(pos_ptr)
    row = ((pos0 + t).to(tl.int64) * Hk + kh) * D                          # the cache row's first value
    src = i.to(tl.int64) * D
    if CT == 3:
        b = tl.arange(0, DP // 32)[:, None]                                 # (DP / 32, 32): a q8_0 block a row
        j = b * 32 + tl.arange(0, 32)[None, :]
        ok = j < D
        x = tl.load(x_ptr + src + j, mask=ok, other=0.0)
        d = tl.math.div_rn(tl.max(tl.abs(x), axis=1), 127.0)                # (DP / 32,)
        one = tl.full((DP // 32,), 1.0, tl.float32)
        inv = tl.where(d > 0, tl.math.div_rn(one, tl.where(d > 0, d, one)), 0.0)
        q = x * inv[:, None]
        q = tl.where(q < 0, -tl.floor(-q + 0.5), tl.floor(q + 0.5))         # roundf: halves away from zero
        tl.store(c_ptr + row + j, q.to(tl.int8).to(tl.uint8, bitcast=True), mask=ok)
        bb = tl.arange(0, DP // 32)
        tl.store(cs_ptr + row // 32 + bb, d.to(tl.float16), mask=bb * 32 < D)
    else:
        j = tl.arange(0, DP)
        ok = j < D
        x = tl.load(x_ptr + src + j, mask=ok, other=0.0)
        if CT == 0:
            tl.store(c_ptr + row + j, x, mask=ok)
        elif CT == 1:
            tl.store(c_ptr + row + j, x.to(tl.float16), mask=ok)
        else:
            u = x.to(tl.uint32, bitcast=True)
            h = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).to(tl.uint16)
            tl.store(c_ptr + row + j, h.to(tl.float16, bitcast=True), mask=ok)


@triton.jit
def attn_prompt_kernel(q_ptr, k_ptr, ks_ptr, v_ptr, vs_ptr, pos_ptr, sinks_ptr, out_ptr,
                       T, H, Hk, Dh, Dv, Dkr, Dvr, window, scale,
                       KT: tl.constexpr, VT: tl.constexpr, G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       DC: tl.constexpr, NC: tl.constexpr, DVB: tl.constexpr, WINDOW: tl.constexpr,
                       SINKS: tl.constexpr):
    """out[t, h] (value dims vb * DVB ..) for BM tokens t0 .. t0 + BM of query head h: t0 = program_id(0) * BM,
    h = program_id(1), vb = program_id(2) (FlashAttention-2's forward, causal, over the cache in its own type).
    q and each BN-key tile of K and V are rounded to f16 for tl.dot (tensor cores), accumulated in float32, the
    probabilities rounded to f16 for the second dot; the keys seen run from the block's first token's window to its
    last token. q is read NC chunks of DC dims (one: held for the whole loop). out (T, H, Dv)."""
    t0 = tl.program_id(0) * BM
    h = tl.program_id(1)
    vb = tl.program_id(2)
    kh = h // G
    pos0 = tl.load(pos_ptr)
    t = t0 + tl.arange(0, BM)                                                # (BM,)
    tok = t < T
    dv = vb * DVB + tl.arange(0, DVB)
    qrow = (t * H + h).to(tl.int64)
    if NC == 1:
        d = tl.arange(0, DC)
        qv = tl.load(q_ptr + qrow[:, None] * Dh + d[None, :], mask=tok[:, None] & (d < Dh)[None, :], other=0.0)
        qv = qv.to(tl.float16)                                               # (BM, DC)
    p = pos0 + t                                                             # (BM,) each token's position
    lo = 0
    if WINDOW:
        lo = tl.maximum(pos0 + t0 - window + 1, 0)
    hi = tl.minimum(pos0 + T, pos0 + t0 + BM)                                # past the block's last token: none
    m = tl.full((BM,), float("-inf"), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, DVB), tl.float32)
    for a in range(lo, hi, BN):
        keys = a + tl.arange(0, BN)
        kok = keys < hi
        if NC == 1:
            kt = _tile(k_ptr, ks_ptr, keys, kh, Hk, Dkr, d, kok[:, None] & (d < Dh)[None, :], KT).to(tl.float16)
            s = tl.dot(qv, tl.trans(kt)) * scale                             # (BM, BN) float32
        else:
            s = _scores(q_ptr, qrow, tok, Dh, scale, k_ptr, ks_ptr, keys, kok, kh, Hk, Dkr, KT, BM, BN, DC, NC,
                        True)
        seen = (keys[None, :] <= p[:, None]) & kok[None, :]
        if WINDOW:
            seen = seen & (keys[None, :] > p[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - base)
        e = tl.exp(s - base[:, None])
        l = l * alpha + tl.sum(e, axis=1)
        vt = _tile(v_ptr, vs_ptr, keys, kh, Hk, Dvr, dv, kok[:, None] & (dv < Dv)[None, :], VT).to(tl.float16)
        acc = acc * alpha[:, None] + tl.dot(e.to(tl.float16), vt)
        m = m_new
    if SINKS:            # the sink's logit joins the denominator: both sides scaled to max(m, sink)
        sink = tl.load(sinks_ptr + h)
        big = tl.maximum(m, sink)
        f = tl.exp(m - big)
        acc = acc * f[:, None]
        l = l * f + tl.exp(sink - big)
    o = acc / tl.where(tok, l, 1.0)[:, None]
    tl.store(out_ptr + qrow[:, None] * Dv + dv[None, :], o, mask=tok[:, None] & (dv < Dv)[None, :])
