"""Attention on the GPU: causal GQA attention of new tokens over a KV cache read in its own type.

    attention(q, k_cache, v_cache, pos, scale=None, window=None, sinks=None, dv=None, n_split=None, out=None,
              work=None, stream=None, backend=None, k=None, v=None)
                                                           (T, H * Dv) float32: two launches (split, merge) up to
                                                           8 tokens, one (f16 tiles) for a prompt; two more with
                                                           this step's k and v to write first
    attention_ref(q, k_cache, v_cache, pos, scale=None, window=None, sinks=None, dv=None)    its NumPy twin
    kv_write(cache, x, pos, stream=None, backend=None)     x (T, Hk, D) into rows pos .. pos + T, rounded to the
                                                           cache's type (one launch; write_ref its twin)
    splits(keys, n_head_kv)                                the default number of key splits
    work_size(T, H, Dv, n_split)                           float32 elements of `work`

A cache is a float32 array (n_ctx, Hk, D) (-ctk f32), a float16 one (f16), or a tuple of the stored arrays:
("f32", values), ("f16", values float16), ("bf16", values uint16: the high halves of float32s), ("q8_0", values
int8, scales float16 (n_ctx, Hk, D / 32)): moert/kvcache.py's TypedKV storage as it is (anything with its `kind`
and `parts` is taken too). The caches must already hold this step's keys and values, or attention is given them
(k=, v=) and writes them first with kv_write's kernel, at the position it reads.

What is static and what is read on the device: pos (the position of the first new token; the keys visible are
0 .. pos + T) may be an int32 device array of one element, read by the kernels, so a CUDA graph captured once
replays at every position; the launch shapes depend on T, H, Hk, the head dims and n_split only. n_split (the
grid's key splits) is then fixed: by default from the cache's length with a device pos, from the visible keys with
an int pos (a new n_split compiles nothing new, unless it becomes or stops being a multiple of 16). With `out`,
`work` (work_size float32) and a device pos given, a call allocates nothing.

Semantics are moert.layers.attention's: scale (default 1/sqrt(Dh)); window: the query at p sees keys p - window < s
<= p; sinks (H,) float32: a logit per head in each softmax's denominator (gpt-oss). layers.attention has no logit
softcap, so none here. dv: read only the first dv dims of each value row: MLA (deepseek2's latent cache of 512 + 64
dims a key, its first 512 the value) passes its cache as both k and v with dv = 512. Head dims up to 576: past 256,
q is read 64 dims at a time, the values 128 at a time (a program each), rows 16 a program (_dims).
Prompts (T > 8) take one launch of FlashAttention-2's forward (src/attention.py's attn_prompt_kernel): q, K and V
rounded to f16 for tensor cores, as the tiled matmul rounds its operands (the twin does not round: the kernel is
within ~2^-10 of sum |q k| per score of it); n_split and work are not used.

Sources: kernels/gpu/src/attention.py (what each program does, why float32 tl.dot). No GPU speed has been measured.
"""

from __future__ import annotations

import numpy as np

from moert.errors import ShapeError, UnsupportedTypeError

from .ops import backend_of, run
from .table import DECODE_MAX_T

KV_CODES = {"f32": 0, "f16": 1, "bf16": 2, "q8_0": 3}     # the CT constexpr of src/attention.py's _tile
SPLIT_KEYS = 256         # a split has at least this many keys (unmeasured: reasoned, as the CPU's MIN_CHUNK)
MAX_PROGRAMS = 256       # the splits of every KV head together stop here (about two per SM of an H100)
MAX_HEAD_DIM = 576       # head dims the kernels take: MLA's keys (deepseek2: 512 latent + 64 rotated dims)
WARPS = 4


def splits(keys: int, n_head_kv: int) -> int:
    """Key splits for `keys` visible keys: one per SPLIT_KEYS keys, at most MAX_PROGRAMS over all KV heads."""
    return max(1, min(-(-int(keys) // SPLIT_KEYS), MAX_PROGRAMS // max(1, n_head_kv)))


def work_size(T: int, H: int, Dv: int, n_split: int) -> int:
    """float32 elements of the partials: max, sum and weighted values per (split, token, head)."""
    return n_split * T * H * (2 + Dv)


def _stored(c, what: str) -> tuple:
    """(kind, values, scales or None) of a cache argument (module docstring)."""
    if hasattr(c, "kind") and hasattr(c, "parts"):
        c = (c.kind, *c.parts)
    if not isinstance(c, tuple):
        dt = np.dtype(c.dtype)
        kinds = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}
        if dt not in kinds:
            raise ShapeError(f"attention: the {what} cache is a {dt} array; pass float32 or float16, or a "
                             f"(kind, values[, scales]) tuple for bf16 / q8_0")
        c = (kinds[dt], c)
    kind, values, scales = (*c, None)[:3]
    if kind not in KV_CODES:
        raise UnsupportedTypeError(f"attention: no GPU kernel reads a {kind!r} KV cache; it reads "
                                   f"{', '.join(KV_CODES)} (-ctk / -ctv)")
    want = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "q8_0": np.int8}[kind]
    if values.dtype != want or values.ndim != 3 or not values.flags.c_contiguous:
        raise ShapeError(f"attention: a {kind} {what} cache is C-contiguous {np.dtype(want)} (n_ctx, Hk, D), got "
                         f"{values.dtype} {tuple(values.shape)}")
    if kind == "q8_0" and (scales is None or scales.dtype != np.float16 or tuple(scales.shape) != (
            *values.shape[:2], values.shape[2] // 32) or values.shape[2] % 32):
        raise ShapeError(f"attention: a q8_0 {what} cache needs D % 32 == 0 and float16 scales (n_ctx, Hk, D / 32), "
                         f"got values {tuple(values.shape)}, scales {getattr(scales, 'shape', None)}")
    return kind, values, scales


def _check(q, kc: tuple, vc: tuple, dv: int | None, sinks, window) -> tuple[int, int, int, int, int]:
    """(T, H, Hk, Dh, Dv) once q, the caches, dv, sinks and window fit together; else ShapeError."""
    if q.ndim != 3 or q.dtype != np.float32:
        raise ShapeError(f"attention: q must be float32 (T, H, Dh), got {q.dtype} {tuple(q.shape)}")
    T, H, Dh = q.shape
    k, v = kc[1], vc[1]
    dv = v.shape[2] if dv is None else int(dv)
    if k.shape[:2] != v.shape[:2] or k.shape[2] != Dh or not 0 < dv <= v.shape[2] or k.shape[1] == 0 or (
            H % k.shape[1]) or k.shape[0] < T:
        raise ShapeError(f"attention: q {tuple(q.shape)}, k cache {tuple(k.shape)}, v cache {tuple(v.shape)} (dv "
                         f"{dv}) do not fit: caches (n_ctx >= T, Hk, Dh) and (n_ctx, Hk, >= dv), H a multiple of Hk")
    if sinks is not None and (tuple(sinks.shape) != (H,) or sinks.dtype != np.float32):
        raise ShapeError(f"attention: sinks must be float32 ({H},), got {sinks.dtype} {tuple(sinks.shape)}")
    if max(Dh, dv) > MAX_HEAD_DIM:
        raise ShapeError(f"attention: head dims {Dh} / {dv} are past the GPU kernels' {MAX_HEAD_DIM} (MLA's keys); "
                         f"moert.layers runs them as array code")
    if window is not None and int(window) < 1:
        raise ShapeError(f"attention: window {window}: a window holds at least the query's own key (>= 1)")
    return T, H, k.shape[1], Dh, dv


def _xp(a):
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def _p2(n: int, least: int = 16) -> int:
    return max(least, 1 << (int(n) - 1).bit_length())


def attention(q, k_cache, v_cache, pos, scale: float | None = None, window: int | None = None, sinks=None,
              dv: int | None = None, n_split: int | None = None, out=None, work=None, stream=None,
              backend: str | None = None, k=None, v=None):
    """out (T, H * Dv) float32: causal GQA attention of q (T, H, Dh) float32 at positions pos .. pos + T - 1
    over the caches (module docstring); k (T, Hk, Dh) and v (T, Hk, Dv) given: written into them first (kv_write).
    CuPy arrays: the Triton kernels on CuPy's stream (or `stream`); NumPy arrays: the twin, or backend="interpret"
    for the kernels' own source under Triton's interpreter."""
    kc, vc = _stored(k_cache, "k"), _stored(v_cache, "v")
    T, H, Hk, Dh, Dv = _check(q, kc, vc, dv, sinks, window)
    backend = backend_of(q, backend)
    if (k is None) != (v is None):
        raise ShapeError("attention: give both k and v (this step's keys and values to write), or neither")
    for c, x in ((kc, k), (vc, v)) if k is not None else ():
        _check_write(c, x, T)
    xp = _xp(q)
    if out is None:
        out = xp.empty((T, H * Dv), dtype=np.float32)
    elif tuple(out.shape) != (T, H * Dv) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ShapeError(f"attention: out must be C-contiguous float32 ({T}, {H * Dv}), got {out.dtype} "
                         f"{tuple(out.shape)}")
    host_pos = isinstance(pos, (int, np.integer))
    if host_pos and not 0 <= int(pos) <= kc[1].shape[0] - T:
        raise ShapeError(f"attention: position {pos} + {T} tokens is past the cache's {kc[1].shape[0]} rows")
    if T == 0:
        return out
    if backend == "twin":
        if k is not None:
            write_ref(kc, k, pos)
            write_ref(vc, v, pos)
        out[...] = attention_ref(q, kc, vc, pos, scale, window, sinks, Dv)
        return out
    if T <= DECODE_MAX_T:
        if n_split is None:
            keys = int(pos) + T if host_pos else kc[1].shape[0]
            n_split = splits(keys if window is None else min(keys, int(window) + T - 1), Hk)
        need = work_size(T, H, Dv, n_split)
        if work is None:
            work = xp.empty(need, dtype=np.float32)
        elif work.dtype != np.float32 or work.ndim != 1 or work.size < need:
            raise ShapeError(f"attention: work must be 1-d float32 of at least {need} (work_size), got "
                             f"{work.dtype} {tuple(work.shape)}")
    pos = _device_pos(pos, xp)
    if k is not None:
        _write(kc, k, pos, backend, stream)
        _write(vc, v, pos, backend, stream)
    scale = 1.0 / float(np.sqrt(Dh)) if scale is None else float(scale)
    args = dict(q_ptr=xp.ascontiguousarray(q), k_ptr=_view(kc[1]), ks_ptr=_view(kc[2] if kc[2] is not None
                else kc[1]), v_ptr=_view(vc[1]), vs_ptr=_view(vc[2] if vc[2] is not None else vc[1]), pos_ptr=pos)
    shape = dict(T=T, H=H, Hk=Hk, Dh=Dh, Dv=Dv, Dkr=kc[1].shape[2], Dvr=vc[1].shape[2],
                 window=0 if window is None else int(window))
    if T > DECODE_MAX_T:                 # a prompt: one launch, f16 tiles into tensor cores
        const = _prompt_constexprs(kc[0], vc[0], H // Hk, Dh, Dv, window, sinks is not None)
        run("attn_prompt_kernel", (-(-T // const["BM"]), H, -(-Dv // const["DVB"])), dict(
            args, sinks_ptr=out if sinks is None else sinks, out_ptr=out, **shape, scale=scale), const, WARPS,
            backend, stream)
        return out
    n = n_split * T * H
    mp, lp, ap = work[:n], work[n:2 * n], work[2 * n:need]
    const = _split_constexprs(kc[0], vc[0], T, H // Hk, Dh, Dv, window)
    nr = -(-(T * (H // Hk)) // const["RP"])                              # row blocks of a KV head's G * T rows
    run("attn_split_kernel", (Hk * nr, n_split, -(-Dv // const["DVB"])), dict(args, mp_ptr=mp, lp_ptr=lp, ap_ptr=ap,
        **shape, n_split=n_split, scale=scale, NR=nr), const, WARPS, backend, stream)
    # without sinks the sinks pointer is never read (SINKS is False): any float32 device array stands in
    run("attn_merge_kernel", (T * H,), dict(mp_ptr=mp, lp_ptr=lp, ap_ptr=ap, sinks_ptr=mp if sinks is None else
        sinks, out_ptr=out, TH=T * H, H=H, Dv=Dv, n_split=n_split), _merge_constexprs(Dv, sinks is not None),
        WARPS, backend, stream)
    return out


def _dims(Dh: int, Dv: int) -> tuple[dict, dict]:
    """How the kernels hold a head: q's Dh dims as NC chunks of DC (one padded chunk up to 256 dims, 64 dims at a
    time past it: MLA's 576 padded whole would stage ~180-300 KB of tiles in shared memory), the Dv value dims in
    blocks of DVB, one program each (all of them up to 256, 128 past it)."""
    return dict(DC=_p2(Dh), NC=1) if Dh <= 256 else dict(DC=64, NC=-(-Dh // 64)), dict(
        DVB=_p2(Dv) if Dv <= 256 else 128)


def _split_constexprs(kt: str, vt: str, T: int, G: int, Dh: int, Dv: int, window) -> dict:
    """The split kernel's constexprs. BN = 32 keys a step (16 past 128 dims): tl.dot's float32 operands are staged
    in shared memory, 43 KB at 16 rows of 128 dims with Triton's 2 stages (sm_80 and sm_90; 64 keys: 78 KB). RP:
    the G * T rows of a KV head, at most 64 a program (16 for a wide head: MLA's 16 rows take 78-100 KB, its 128
    rows in one program 373 KB, more than any GPU has)."""
    q, v = _dims(Dh, Dv)
    return dict(KT=KV_CODES[kt], VT=KV_CODES[vt], G=G, RP=min(_p2(T * G), 16 if q["NC"] > 1 else 64), **q, **v,
                BN=32 if max(q["DC"], v["DVB"]) <= 128 else 16, WINDOW=window is not None)


def _prompt_constexprs(kt: str, vt: str, G: int, Dh: int, Dv: int, window, sinks: bool) -> dict:
    """The prompt kernel's: BM = 64 tokens by BN = 32 keys a step (32 by 16 past 128 dims or in chunks)."""
    q, v = _dims(Dh, Dv)
    wide = max(q["DC"], v["DVB"]) > 128 or q["NC"] > 1
    return dict(KT=KV_CODES[kt], VT=KV_CODES[vt], G=G, BM=32 if wide else 64, BN=16 if wide else 32, **q, **v,
                WINDOW=window is not None, SINKS=sinks)


def _merge_constexprs(Dv: int, sinks: bool) -> dict:
    return dict(CS=16, DVP=_p2(Dv), SINKS=sinks)


_PTR = {"f32": "*fp32", "f16": "*fp16", "bf16": "*fp16", "q8_0": "*u8"}


def specs(k: str = "f16", v: str | None = None, T: int = 1, G: int = 4, Dh: int = 128, Dv: int | None = None,
          window: bool = False, sinks: bool = False) -> list[tuple[str, dict, dict, int]]:
    """[(kernel, signature, constexprs, num_warps)] of one attention call with these cache types and shapes and its
    k and v writes, as attention() launches them (kernels/gpu/aot.py's form: what the compile tests build)."""
    v = k if v is None else v
    Dv = Dh if Dv is None else Dv
    f32 = "*fp32"
    sig = dict(q_ptr=f32, k_ptr=_PTR[k], ks_ptr="*fp16" if k == "q8_0" else _PTR[k], v_ptr=_PTR[v],
               vs_ptr="*fp16" if v == "q8_0" else _PTR[v], pos_ptr="*i32", mp_ptr=f32, lp_ptr=f32, ap_ptr=f32,
               **dict.fromkeys(("T", "H", "Hk", "Dh", "Dv", "Dkr", "Dvr", "window", "n_split"), "i32"), scale="fp32",
               NR="i32")
    msig = dict(mp_ptr=f32, lp_ptr=f32, ap_ptr=f32, sinks_ptr=f32, out_ptr=f32, TH="i32", H="i32", Dv="i32",
                n_split="i32")
    def wsig(kind):
        return dict(x_ptr=f32, c_ptr=_PTR[kind], cs_ptr="*fp16" if kind == "q8_0" else _PTR[kind], pos_ptr="*i32",
                    Hk="i32", D="i32")

    writes = [("kv_write_kernel", wsig(k), dict(CT=KV_CODES[k], DP=_p2(Dh, 32)), WARPS),
              ("kv_write_kernel", wsig(v), dict(CT=KV_CODES[v], DP=_p2(Dv, 32)), WARPS)]
    if T > DECODE_MAX_T:
        psig = {a: t for a, t in sig.items() if a not in ("mp_ptr", "lp_ptr", "ap_ptr", "n_split", "NR")}
        psig = dict(list(psig.items())[:6] + [("sinks_ptr", f32), ("out_ptr", f32)] + list(psig.items())[6:])
        return [("attn_prompt_kernel", psig, _prompt_constexprs(k, v, G, Dh, Dv, True if window else None, sinks),
                 WARPS)] + writes
    return [("attn_split_kernel", sig, _split_constexprs(k, v, T, G, Dh, Dv, True if window else None), WARPS),
            ("attn_merge_kernel", msig, _merge_constexprs(Dv, sinks), WARPS)] + writes


def _device_pos(pos, xp):
    """pos as the int32 (1,) device array the kernels read (an int is put there: an allocation and a fill)."""
    if isinstance(pos, (int, np.integer)):
        return xp.full(1, int(pos), dtype=np.int32)
    if tuple(pos.shape) != (1,) or pos.dtype != np.int32:
        raise ShapeError(f"attention: pos is an int or an int32 (1,) device array, got {pos.dtype} {tuple(pos.shape)}")
    return pos


def _check_write(c: tuple, x, T: int | None = None) -> None:
    want = (x.shape[0] if T is None else T, *c[1].shape[1:])
    if tuple(x.shape) != want or x.dtype != np.float32:
        raise ShapeError(f"kv_write: rows to write must be float32 {want} for this cache, got {x.dtype} "
                         f"{tuple(x.shape)}")


def kv_write(cache, x, pos, stream=None, backend: str | None = None) -> None:
    """Write x (T, Hk, D) float32 into cache rows pos .. pos + T (pos an int or an int32 (1,) device array), rounded
    to the cache's type as moert/kvcache.py's TypedKV.write rounds: one launch."""
    c = _stored(cache, "the written")
    _check_write(c, x)
    if isinstance(pos, (int, np.integer)) and not 0 <= int(pos) <= c[1].shape[0] - x.shape[0]:
        raise ShapeError(f"kv_write: position {pos} + {x.shape[0]} rows is past the cache's {c[1].shape[0]} rows")
    backend = backend_of(x, backend)
    if backend == "twin":
        write_ref(c, x, pos)
        return
    _write(c, x, _device_pos(pos, _xp(x)), backend, stream)


def _write(c: tuple, x, pos, backend: str, stream) -> None:
    T, Hk, D = x.shape
    if T:
        run("kv_write_kernel", (T * Hk,), dict(x_ptr=_xp(x).ascontiguousarray(x), c_ptr=_view(c[1]), cs_ptr=_view(
            c[1] if c[2] is None else c[2]), pos_ptr=pos, Hk=Hk, D=D), dict(CT=KV_CODES[c[0]], DP=_p2(D, 32)),
            WARPS, backend, stream)


def _view(a):
    """A cache array as a pointer type ops.run knows: bf16 bits as float16, q8_0's int8 as uint8 (the kernels
    reinterpret them)."""
    return a.view(np.float16) if a.dtype == np.uint16 else a.view(np.uint8) if a.dtype == np.int8 else a


# ------------------------------------------------------------------------------------------------ twin

def read(c) -> np.ndarray:
    """A cache argument's rows as float32 (n_ctx, Hk, D), as moert.kvcache.TypedKV.read reads them."""
    kind, values, scales = _stored(c, "a")
    values = np.asarray(values)
    if kind == "f32":
        return values
    if kind == "f16":
        return values.astype(np.float32)
    if kind == "bf16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    x = values.reshape(*values.shape[:2], -1, 32).astype(np.float32) * np.asarray(scales, np.float32)[..., None]
    return x.reshape(values.shape)


def write_ref(cache, x, pos) -> None:
    """kv_write's twin: rows pos .. pos + T of the stored arrays, rounded as moert.kvcache.TypedKV.write rounds."""
    kind, values, scales = _stored(cache, "the written")
    x = np.asarray(x, dtype=np.float32)
    p, T = int(np.asarray(pos).reshape(-1)[0]), x.shape[0]
    if kind == "f32":
        values[p:p + T] = x
    elif kind == "f16":
        values[p:p + T] = x.astype(np.float16)
    elif kind == "bf16":                                                 # round to nearest even, as ggml
        u = np.ascontiguousarray(x).view(np.uint32)
        values[p:p + T] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    else:                                                                # ggml's quantize_row_q8_0_ref
        b = x.reshape(T, x.shape[1], -1, 32)                             # (T, Hk, D/32, 32)
        d = (np.abs(b).max(axis=-1) / np.float32(127)).astype(np.float32)
        inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, np.float32(1)), np.float32(0))
        q = b * inv[..., None]
        q = np.sign(q) * np.floor(np.abs(q) + np.float32(0.5))           # roundf: halves away from zero
        values[p:p + T] = q.reshape(x.shape).astype(np.int8)
        scales[p:p + T] = d.astype(np.float16)


def attention_ref(q, k_cache, v_cache, pos, scale: float | None = None, window: int | None = None, sinks=None,
                  dv: int | None = None) -> np.ndarray:
    """attention's twin: the whole softmax of each (token, head) row in float64 over the caches read as float32."""
    q = np.asarray(q)
    T, H, Dh = q.shape
    K, V = read(k_cache).astype(np.float64), read(v_cache).astype(np.float64)
    dv = V.shape[2] if dv is None else int(dv)
    pos0 = int(np.asarray(pos).reshape(-1)[0])
    scale = 1.0 / np.sqrt(Dh) if scale is None else float(scale)
    G = H // K.shape[1]
    out = np.empty((T, H, dv), dtype=np.float32)
    for t in range(T):
        p = pos0 + t                                                     # keys s0 .. p
        s0 = 0 if window is None else max(0, p - int(window) + 1)
        for h in range(H):
            s = K[s0:p + 1, h // G] @ q[t, h].astype(np.float64) * scale                  # (S',)
            top = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            e = np.exp(s - top)
            den = e.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - top))
            out[t, h] = e @ V[s0:p + 1, h // G, :dv] / den
    return out.reshape(T, H * dv)
