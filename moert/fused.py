"""A decode step's layer as two Numba calls (kernels/decode.py) where every tensor of it is on the CPU.

    FUSED = QKNormMoE(neox=True, renorm=True)     an architecture file declares which layer it has
    decoder(m, tokens, block, fused=FUSED)         models/blocks.py: per layer, m.fused_layer(il, x, FUSED)
                                                   (model_runtime.py), or `block` where it returns None

The architecture's Python `block` stays the definition and the twin: the fused step runs the same kernels in
the same order, so the logits are the same (bit for bit on the machine it was written on; tests/test_fused.py
asks 1e-5). It applies to one token (decode), with no full trace, expert cache, virtual clock or batch of
sequences (those go through `block`), when the layer's attention, KV cache, weights and experts are all on the
CPU, q/k/v/output have CPU kernels (not F32), the caches are float32 or f16 (the default; bf16 and q8_0 go through
`block`), and either every kernel would run on one thread anyway, or (several threads) each of q/k/v (one group
region), the output and the experts would be a parallel region and attention would not (big weights, short context):
then the two calls run those same regions, less the Python between them. Model.fused_decode = False turns it off,
e.g. to see per-phase times (a fused layer's time is counted as the phase "layer").
"""

from __future__ import annotations

import numpy as np

from moert.devices import CPU
from moert.experts import cpu_layer
from moert.kernels.jit import threads
from moert.kernels.layers import attention_parallel
from moert.kernels.matmul import threads_for
from moert.kernels.moe_fused import PreparedExperts
from moert.kvcache import TypedKV


class QKNormMoE:
    """A Qwen3-MoE-style layer: RMSNorm -> q/k/v -> per-head RMSNorm of q and k -> RoPE -> GQA attention ->
    output + residual -> RMSNorm -> softmax router -> top-k (renormalized when renorm) -> SwiGLU experts + residual.
    No biases, no shared expert, no window. neox: RoPE's pairing (i, i + Dh/2), else (2i, 2i+1)."""

    __slots__ = ("neox", "renorm")

    def __init__(self, neox: bool, renorm: bool):
        self.neox, self.renorm = bool(neox), bool(renorm)

    def prepare(self, m, il: int):
        """Layer il's LayerStep, or None where the fused kernel does not apply (see the module docstring)."""
        c, b = m.config, f"blk.{il}."
        names = {n: b + n + ".weight" for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                "attn_q_norm", "attn_k_norm", "ffn_norm", "ffn_gate_inp")}
        if m.kv.devices[il] is not CPU or any(m.device_of(n) is not CPU for n in names.values()):
            return None
        caches = [_cache_array(a) for a in (m.kv.k[il], m.kv.v[il])]
        if any(a is None for a in caches) or caches[0].dtype != caches[1].dtype:
            return None
        mms = m.weights.cpu_matmuls((names["attn_q"], names["attn_k"], names["attn_v"]))
        mo = m.weights.cpu_matmul(names["attn_output"])
        experts = cpu_layer(m, tuple(b + f"ffn_{n}_exps.weight" for n in ("gate", "up", "down")))
        if mms is None or mo is None or not isinstance(experts, PreparedExperts):
            return None
        from moert.kernels.decode import DIMS, layer_kernels

        mms.append(mo)
        g_raw, g_f16, u_raw, u_f16, d_raw, d_f16, nb_in, nb_down, block_down, parts, act, *biases = experts.args
        f16 = mms[0].f16
        if any(a.size for a in biases) or any(t is not f16 for t in (*(mm.f16 for mm in mms), g_f16, u_f16, d_f16)):
            return None                                 # biases; types of two 16-bit tables (BF16 beside F16)
        norms = [m.w(names[n], CPU) for n in ("attn_norm", "attn_q_norm", "attn_k_norm", "ffn_norm")]
        if any(a.dtype != np.float32 for a in norms):
            return None
        dims = dict(n_head=c.n_head, nb_q=mms[0].nb, nb_k=mms[1].nb, nb_v=mms[2].nb, nb_o=mms[3].nb, nb_in=nb_in,
                    nb_down=nb_down, block_down=block_down, parts=parts, act=act, neox=self.neox, renorm=self.renorm)
        step = LayerStep(m, il, caches, max(*(mm.raw.nbytes for mm in mms),
                                            min(c.n_expert_used, c.n_expert) * experts.expert_bytes))
        f16_cache = caches[0].dtype == np.uint16
        step.attention, step.experts = layer_kernels(tuple(mm.serial for mm in mms), experts.serial, f16_cache)
        group = m.weights.prepared.get((names["attn_q"], names["attn_k"], names["attn_v"]))
        if group and group.kernel is not None:                          # as the block's m.linears runs q, k, v
            step.parallel = (group.kernel, mo.parallel, experts.kernel, f16_cache)
            step.least = min(group.bytes, mo.raw.nbytes, min(c.n_expert_used, c.n_expert) * experts.expert_bytes)
        dims = np.array([int(dims[k]) for k in DIMS], dtype=np.int64)
        step.head = (*caches, step.h, *(mm.raw for mm in mms), f16, np.concatenate(norms).astype(np.float32),
                     dims, float(c.rms_eps), np.float32(1.0 / np.sqrt(c.head_dim)))   # norms (2 D + 2 Dh,)
        step.tail = (g_raw, u_raw, d_raw, f16, dims)
        step.router_t = m.w(names["ffn_gate_inp"], CPU).T                # (D, E): the operand the block's @ gets
        return step


def _cache_array(cache) -> np.ndarray | None:
    """A KV cache as the fused kernel reads it: a float32 array, an f16 TypedKV's storage as uint16 bits (-ctk /
    -ctv f16, the default), or None for other types (bf16, q8_0: the block reads those)."""
    if isinstance(cache, TypedKV):
        return cache.parts[0].view(np.uint16) if cache.kind == "f16" else None
    ok = type(cache) is np.ndarray and cache.dtype == np.float32 and cache.ndim == 3 and cache.flags.c_contiguous
    return cache if ok else None


class LayerStep:
    """Layer il of one model made ready for fused decode steps: its two kernels (kernels/decode.py) and their
    arguments but the token's (prepare makes them), the router between them."""

    __slots__ = ("attention", "experts", "head", "tail", "router_t", "bytes", "rope", "heads", "h", "ids", "wts",
                 "parallel", "least", "halves_n")

    def __init__(self, m, il: int, caches: list, nbytes: int):
        c = m.config
        self.bytes = nbytes                                             # the most weight bytes one of its calls reads
        self.parallel = None            # (q/k/v group kernel, output's parallel driver, parallel experts kernel, f16)
        self.least = 0                  # the fewest weight bytes one of its calls reads (with `parallel`)
        self.halves_n = None            # the halves on several threads (kernels/decode.py layer_kernels_n), made once
        self.h = np.empty((1, c.n_embd), dtype=np.float32)             # (1, D) the FFN's input, ffn_norm(x)
        self.ids = np.empty((1, c.n_expert_used), dtype=np.int32)      # (1, K) the chosen experts
        self.wts = np.empty((1, c.n_expert_used), dtype=np.float32)    # (1, K) their weights
        self.rope = (c.head_dim, c.rope_base)                           # m.rope's arguments
        self.heads = (c.n_head_kv, c.head_dim, c.head_dim_v)

    def threads(self, pos: int) -> int:
        """The step's threads at position pos, as the block would run its kernels: 1 where every one would run on
        one thread; n > 1 where q/k/v (one group), the output and the experts would each be a parallel region on
        n threads and attention would not; 0 otherwise (mixed: the block runs)."""
        n = threads()
        if n == 1:
            return 1
        if attention_parallel(pos + 1, *self.heads):
            return 0
        if threads_for(self.bytes) == 1:
            return 1
        return n if self.parallel is not None and threads_for(self.least) == n else 0

    def __call__(self, x: np.ndarray, pos: int, cos: np.ndarray, sin: np.ndarray, counts: np.ndarray, il: int,
                 n: int | None = None):
        """x (1, D) float32 -> after the layer (1, D); ids, wts then hold its routing, added to counts[il]
        (counts (n_layer, E) int64: Stats.expert_counts); cos, sin (1, Dh/2) the position's RoPE angles; n the
        step's threads at pos if the caller has asked them already (`threads`, > 0)."""
        n = self.threads(pos) if n is None else n
        if n > 1:
            if self.halves_n is None:
                from moert.kernels.decode import layer_kernels_n

                self.halves_n = layer_kernels_n(*self.parallel)
            attention, experts = self.halves_n
            x = attention(x, pos, cos, sin, *self.head, n)              # (1, D); self.h = ffn_norm(x)
            logits = self.h @ self.router_t                             # (1, E) the block's router matmul
            return experts(x, self.h, logits, self.ids, self.wts, counts, il, *self.tail, n)
        x = self.attention(x, pos, cos, sin, *self.head)              # (1, D); self.h = ffn_norm(x)
        logits = self.h @ self.router_t                                 # (1, E) the block's router matmul
        return self.experts(x, self.h, logits, self.ids, self.wts, counts, il, *self.tail, 1)
