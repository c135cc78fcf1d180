"""Which GPU kernels of a decode token replay a CUDA graph and which pay a plain launch: `apply(parts, hw, graphs)`.

llama.cpp's CUDA backend captures a decode token's GPU work as a CUDA graph and replays it, so each kernel costs
the GPU's `launch_us` (~2 us). Until January 2026 it kept ONE graph per device (ggml-cuda.cu,
ggml_backend_cuda_graph_compute; ggml-org/ggml 553c4470, 2025-09-20): every call whose nodes differ from the last
call's is an update, and

    // Disable CUDA graphs (from the next token) if the use-case is demanding too many consecutive graph updates.
    if (use_cuda_graph && cuda_graph_update_required) { number_consecutive_updates++; } else { ... = 0; }
    if (number_consecutive_updates >= 4) { disable_due_to_too_many_updates = true; ... }

A token whose experts run on the CPU reaches the GPU as several splits (attention of layer i, CPU experts, attention
of layer i+1, ...), each a different graph, so four calls in a row are updates and graphs are off for good: every
kernel of the token pays a plain launch (`launch_us_nograph`). ik_llama.cpp has the same counter and one graph per
context until its PR 1172 (2026-01-22; its author, PR 1040: "With partial offload CUDA graphs get disabled after just
a few splits"). llama.cpp PR 18934 (ggml a1f19063, 2026-01-24) keys a graph per split ("a split is keyed via the
first node in the split"), so newer builds replay hybrid decode too. A token on one GPU (all-GPU, or a layer split
over GPUs: one split per device) replays its graph in every version. Prefill is not graphed in any of them (batches
over one token disable capture), and the cost model's prefill launches are left as they were.

GRAPHS, the policy (`predict(..., graphs=)`):
  "one-per-device"  llama.cpp before PR 18934, ik_llama.cpp before PR 1172: a GPU with more than one split in a
                    decode token pays `launch_us_nograph` per kernel; a GPU with one split replays (`launch_us`).
  "per-split"       llama.cpp since PR 18934, ik_llama.cpp since PR 1172: every GPU kernel replays.
  "none"            no CUDA graphs (built without GGML_CUDA_GRAPHS, GGML_CUDA_DISABLE_GRAPHS set, HIP builds, or
                    a GPU the build does not graph): every decode kernel pays `launch_us_nograph`.
"""

from __future__ import annotations

from dataclasses import replace

from moert.errors import PlacementError
from moert.hardware import Hardware

GRAPHS = ("one-per-device", "per-split", "none")


def splits(parts, phase: str = "decode") -> dict[str, int]:
    """GPU ("gpu0", ...) -> its splits in one forward of `phase`: runs of consecutive work on it, in the order the
    parts were made (the forward's order), link copies and per-forward overheads not counting as work."""
    out: dict[str, int] = {}
    last = None
    for p in parts:
        if p.phase != phase or p.device == "link" or p.stage == "overhead":
            continue
        if p.device != last and p.device != "cpu":
            out[p.device] = out.get(p.device, 0) + 1
        last = p.device
    return out


def plain_launch_gpus(parts, graphs: str) -> set[str]:
    """The GPUs whose decode kernels pay a plain launch under the `graphs` policy."""
    if graphs not in GRAPHS:
        raise PlacementError(f"graphs={graphs!r}; use one of {', '.join(GRAPHS)}")
    n = splits(parts)
    if graphs == "none":
        return set(n)
    if graphs == "one-per-device":
        return {d for d, k in n.items() if k > 1}
    return set()


def apply(parts, hw: Hardware, graphs: str) -> list:
    """`parts` with each decode op of a GPU that cannot replay a graph costed at its `launch_us_nograph` instead of
    `launch_us` (the other parts unchanged)."""
    plain = plain_launch_gpus(parts, graphs)
    out = []
    for p in parts:
        if p.phase == "decode" and p.device in plain:
            g = hw.gpus[int(p.device[3:])]
            fixed = p.ops * g.launch_us_nograph * 1e-6
            body = p.seconds - p.ops * g.launch_us * 1e-6          # max(memory, compute) of the part
            p = replace(p, seconds=body + fixed, bound="overhead" if fixed > body else p.bound)
        out.append(p)
    return out


__all__ = ["GRAPHS", "apply", "plain_launch_gpus", "splits"]
