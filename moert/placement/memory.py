"""Pre-flight memory: what a plan needs on each device (`estimate`); strategies.py finds plans that fit.

The estimate, per device d, for a context of n_ctx tokens processed in chunks of at most T = min(n_batch,
n_ctx) tokens (legend: E embedding, H / Hkv query / KV heads, Dk Dv head dims, X experts, K experts
used, F expert hidden (expert_feed_forward_length, else feed_forward_length), Ff the widest dense FFN or
shared expert, V vocabulary, s = bytes per KV element, f32 = 4 bytes):

    weights(d) = sum of the GGUF bytes of the tensors placed on d (quantized bytes: no dequantization at load)
    kv(d)      = sum over layers whose attention runs on d of  n_ctx * Hkv * (Dk + Dv) * s  (the architecture's
                 Config.kv_spec() when it has one: deepseek2 caches Hkv = 1, Dk = kv_lora_rank + rope dims, Dv = 0)
                 (s: bytes per value of the cache type: f32 4, f16 and bf16 2, q8_0 34/32)
    scratch(d) = temporaries of one chunk, an upper bound over the layers on d: what lives through a layer,
                 plus the largest of its phases (each phase's temporaries die before the next one starts):
                 4 * T * E * f32                           hidden, residual, normed, attention/FFN output
               + max of, for the phases that run on d:
                   attention  T * (2 * H * max(Dk, Dv) + 2 * Hkv * Dk) * f32   q, attention output, new k, v
                              + max(H * T * n_ctx * f32 + T * n_ctx * 7,   the scores (scaled, masked, softmaxed
                                                           in place) and the mask (3 bool, 1 float32); flash:
                                                           three arrays of H * T * 256 keys and the running sums;
                                    dq)                    or a projection's dequantized weight
                              (+ 2 * keys * Hkv * (Dk + Dv) * f32: K and V read back, if the cache is not f32)
                   router     2 * T * X * f32  (+ T * K * (3 * F + E) * f32: gate, up, act, out, experts on d) + dq
                   dense FFN  T * (3 * Ff + E) * f32 + dq  (a dense FFN or shared expert on d)
                   logits     2 * R * V * f32 + dq         (R = 1: generation's last position; T with all_logits)
                   dq         3 * the largest dequantized matrix on d * f32 (one expert of an *_exps tensor; any
                              other tensor whole: a dequantized output.weight is alive three times), or on a
                              GPU 2 * a row chunk of 2^24 values of a bigger 2-D weight (Model.linear)
    total(d)   = weights + kv + scratch;  on a GPU it must be <= capacity (fit also keeps `margin` free)

`estimate` is an upper bound of what `load_weights` plus `allocate_kv_cache` and a forward pass really allocate
on a sim device, and a tight one: within 1.3x of the sim's measured peak over a full context for every TINY
architecture and Gemma-3-270M (tests/test_memory.py). The scratch term assumes the forward pass works in chunks
of at most n_batch tokens and dequantizes one expert at a time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from moert.devices import format_size
from moert.errors import PlacementError
from moert.kvcache import DEFAULT_KV_TYPE, KVSpec
from moert.placement.plan import EXPERT_REGEX, Plan

F32 = 4
Q4K_BLOCK_BYTES = (144, 148)    # a Q4_K block in the file, and in kernels/repack.py's layout (not imported: Numba)
EXPERT_TENSORS = re.compile(EXPERT_REGEX)
DENSE_FFN = re.compile(r"\.ffn_(gate|up|down)(_shexp)?\.weight$")      # dense FFNs and shared experts


# --------------------------------------------------------------------------------------------- estimate

@dataclass
class DeviceEstimate:
    """Bytes one device needs: weights + KV + scratch (+ the repack's extra bytes, estimate(repack=True))."""

    device: str
    capacity: int | None
    weights: int = 0
    kv: int = 0
    scratch: int = 0
    repack: int = 0            # --repack: what its copy of the Q4_K weights adds (4 bytes a block)
    repacked: int = 0          # the bytes of that copy

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.scratch + self.repack

    @property
    def free(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.total

    def fits(self, margin: int = 0) -> bool:
        return self.capacity is None or self.total + margin <= self.capacity


@dataclass
class Estimate:
    """Per-device memory of a plan at a context size (see the module docstring for the formula)."""

    context_size: int
    n_batch: int
    kv_dtype: str
    devices: dict[str, DeviceEstimate]

    def fits(self, margin: int | dict[str, int] = 0) -> bool:
        """Every device fits with `margin` bytes free (one for all, or per device name)."""
        return all(d.fits(margin.get(n, 0) if isinstance(margin, dict) else margin)
                   for n, d in self.devices.items())

    def total_by_device(self) -> dict[str, int]:
        return {n: d.total for n, d in self.devices.items()}

    def table(self) -> str:
        """llama.cpp-style memory breakdown: device, capacity, weights, KV, scratch, total, free."""
        head = f"{'device':<8} {'capacity':>11} {'weights':>11} {'KV':>11} {'scratch':>11} {'total':>11} {'free':>11}"
        rows = [f"memory at context {self.context_size} (KV {self.kv_dtype}, batch {self.n_batch}):", head]
        for d in self.devices.values():
            rows.append(f"{d.device:<8} {format_size(d.capacity):>11} {format_size(d.weights):>11} "
                        f"{format_size(d.kv):>11} {format_size(d.scratch):>11} {format_size(d.total):>11} "
                        f"{format_size(d.free):>11}")
        for d in self.devices.values():
            if d.repacked:
                rows.append(f"{d.device}: --repack copies {format_size(d.repacked)} of Q4_K weights into the int8 "
                            f"kernels' layout, in memory instead of the file's pages: +{format_size(d.repack)}, "
                            f"in the total")
        return "\n".join(rows)

    def to_dict(self) -> dict:
        return {"context_size": self.context_size, "n_batch": self.n_batch, "kv_dtype": self.kv_dtype,
                "devices": {n: {"capacity": d.capacity, "weights": d.weights, "kv": d.kv, "scratch": d.scratch,
                                "repacked": d.repacked, "total": d.total, "free": d.free}
                            for n, d in self.devices.items()}}


DEQUANT_CHUNK_ELEMENTS = 1 << 24   # Model.linear dequantizes a bigger weight on a GPU this many values at a time


def metadata_int(md: dict, key: str, default: int = 0) -> int:
    v = md.get(f"{md.get('general.architecture')}.{key}", default)
    return int(max(v) if isinstance(v, (list, tuple)) else v)


def estimate(plan: Plan, context_size: int, n_batch: int = 512, kv_dtype: Any = DEFAULT_KV_TYPE,
             flash_attn: bool | None = None, repack: bool = False, all_logits: bool = False) -> Estimate:
    """Bytes of weights + KV cache + compute scratch per device, for `context_size` tokens. kv_dtype: the cache
    type of K and V ("f16", the default of moert.load and llama.cpp; "f32", "bf16", "q8_0") or a (K, V) pair;
    flash_attn: attention holds the scores of FLASH_CHUNK keys at a time instead of the whole context
    (layers.flash_attention); None (default): as moert.load's flash_attn="auto", on unless the cache is f32;
    repack: the CPU's Q4_K weights (but token_embd, a row lookup) are copied into kernels/repack.py's 148-byte
    blocks, as moert.load(act_quant="int8", repack=True) does (Model.repacked_bytes); all_logits: forward()
    returns every position's logits (generation, run, serve and bench ask for the last one only, the default)."""
    from moert.kvcache import flash_mode, has_kv, kv_type
    from moert.layers import FLASH_CHUNK

    types = tuple(kv_type(t) for t in (kv_dtype if isinstance(kv_dtype, tuple) else (kv_dtype, kv_dtype)))
    flash_attn = flash_mode("auto" if flash_attn is None else bool(flash_attn), types)
    label = types[0] if types[0] == types[1] else f"K {types[0]}, V {types[1]}"
    if context_size < 0:
        raise PlacementError(f"context_size must be >= 0, got {context_size}")
    md = plan.metadata
    devs = {n: DeviceEstimate(n, plan.device(n).capacity) for n in plan.device_names()}
    for e in plan:
        devs[e.device].weights += e.nbytes
        if repack and e.device == "cpu" and e.type == "Q4_K" and not e.name.startswith("token_embd"):
            copy = e.nbytes // Q4K_BLOCK_BYTES[0] * Q4K_BLOCK_BYTES[1]
            devs["cpu"].repacked += copy
            devs["cpu"].repack += copy - e.nbytes
    n_ctx = int(context_size)
    T = max(min(n_batch, n_ctx), 1)
    spec = KVSpec.from_metadata(md) if md else None
    if spec is None:  # a names-only plan: weights only
        return Estimate(n_ctx, n_batch, label, devs)
    E, H = metadata_int(md, "embedding_length"), metadata_int(md, "attention.head_count")
    X, K = metadata_int(md, "expert_count"), metadata_int(md, "expert_used_count")
    F_dense = metadata_int(md, "feed_forward_length")
    F = metadata_int(md, "expert_feed_forward_length") or F_dense     # olmoe, llama: experts of feed_forward_length
    F_ffn = max(F_dense, metadata_int(md, "expert_shared_feed_forward_length"))   # dense FFNs, shared experts
    V = metadata_int(md, "vocab_size") or (plan["token_embd.weight"].shape[0] if "token_embd.weight" in plan else 0)
    Dk, Dv, Hkv = spec.head_dim_k, spec.head_dim_v, spec.n_head_kv

    attn_on: set[str] = set()
    for il in range(spec.n_layer):
        d = plan.attention_device(il).name
        if has_kv(md, il):                  # not a hybrid model's linear-attention layer (a fixed-size state)
            devs[d].kv += spec.layer_bytes(n_ctx, types)
        attn_on.add(d)
    experts_on = {e.device for e in plan if EXPERT_TENSORS.search(e.name)}
    ffn_on = {e.device for e in plan if DENSE_FFN.search(e.name)}
    out = "output.weight" if "output.weight" in plan else "token_embd.weight"     # tied: the embedding projects
    logits_on = {plan.device_of(out)} if out in plan else set()
    biggest: dict[str, int] = {}
    for e in plan:
        if e.type in ("F32", "?") or len(e.shape) < 2:
            continue
        one = len(e.shape) >= 3 and EXPERT_TENSORS.search(e.name)      # experts: dequantized one at a time
        n = int(np.prod(e.shape[-2:] if one else e.shape, dtype=np.int64))   # else whole (MLA's attn_k_b)
        copies = 3                 # the matrix, its transpose's product, and a chunk's copy (or dequant's temporaries)
        if len(e.shape) == 2 and e.device != "cpu" and DEQUANT_CHUNK_ELEMENTS // e.shape[1] < e.shape[0]:
            n = max(1, DEQUANT_CHUNK_ELEMENTS // e.shape[1]) * e.shape[1]   # Model.linear on a GPU: row chunks,
            copies = 2                                                      # one alive at a time, and dequant's work
        biggest[e.device] = max(biggest.get(e.device, 0), copies * n * F32)
    rows = T if all_logits else 1                  # generation asks for the last position's logits only
    for name, d in devs.items():
        if d.weights == 0 and d.kv == 0:
            continue
        dq = biggest.get(name, 0)                # a dequantized matrix (or a GPU's row chunk of one), at work
        phases = [dq]                            # one at a time: each one's temporaries die before the next
        if name in attn_on:
            a = 0
            flash = flash_attn and Dv > 0  # MLA's latent cache (no V) has no flash path: latent_attention's scores
            keys = min(FLASH_CHUNK, n_ctx) if flash else n_ctx
            if flash:             # a chunk's scores, exp and mask; running max, sum, output and its update
                a += 3 * H * T * keys * F32 + 3 * H * T * (Dv + 2) * F32
            else:                      # the scores, scaled, masked and softmaxed in place; the mask: causal,
                a += H * T * keys * F32 + T * keys * (F32 + 3)    # window and both (bool), as float32
            if types != ("f32", "f32") and Dv:   # K and V read back as float32 (and rounding what is written)
                a += 2 * keys * Hkv * (Dk + Dv) * F32 + 4 * T * Hkv * (Dk + Dv) * F32
            elif types != ("f32", "f32"):        # MLA: the latent (K and V at once) read back, this chunk rounded
                a += (keys + T) * Hkv * Dk * F32
            # q, the attention output, new k and v; with the scores, or with a projection's dequantized weight
            phases.append(T * (2 * H * max(Dk, Dv) + 2 * Hkv * Dk) * F32 + max(a, dq))
        if name in experts_on or name in attn_on:
            phases.append(2 * T * X * F32 + (T * K * (3 * F + E) * F32 if name in experts_on else 0) + dq)
        if name in ffn_on:
            phases.append(T * (3 * F_ffn + E) * F32 + dq)
        if name in logits_on:
            phases.append(2 * rows * V * F32 + dq)  # the logits, in row-chunk parts and concatenated
        d.scratch = 4 * T * E * F32 + max(phases)  # + the hidden state, residual, normed input, a layer's output
    return Estimate(n_ctx, n_batch, label, devs)


__all__ = ["DeviceEstimate", "Estimate", "estimate"]
