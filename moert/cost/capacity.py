"""Does the model fit in RAM, and if not, what llama.cpp's memory-mapped file costs: `ram(...)`, `paged(...)`.

    r = capacity.with_ram(moert.predict(plan, hw), plan, ram_gib=64, disk_name="nvme-gen4")
    r.decode_tok_s, r.memory["cpu"]      # speeds with the page-ins added; RAM need, capacity, GB paged a token

llama.cpp maps the GGUF (mmap, its default): a tensor on the CPU is read from the page cache, and a page that is
not resident is read from disk when a thread touches it. Tensors on a GPU are copied to it at load; their pages
are clean and the kernel may drop them, so they take no RAM. The model here:

  * RAM for the page cache = ram_gib - os_reserve_gib (the OS, desktop and other programs: an assumption, 4 GiB
    by default, settable) - what llama.cpp allocates on the CPU (KV cache of CPU attention layers, a compute
    buffer). The CPU's tensors need that much; what does not fit is paged.
  * Which pages stay resident: the tensors every token reads (attention, dense FFN, router, norms, shared
    experts) are touched each token, so LRU keeps them; the routed experts share the rest. With uniform routing
    every expert is equally likely, and for independent uniform references any set of resident experts of size
    C serves a fraction C / (expert bytes) of reads (the independent-reference model's hit ratio; a trace's hot
    experts would hit more, so this is pessimistic for skewed routing).
  * A missed expert is read from disk at `fault_gbs`: mmap page faults read a readahead window (128 KiB) each,
    a few in flight (one per computing thread), far from the drive's sequential rate. The time adds to the
    token's (ggml computes on the faulting thread; nothing prefetches).
  * --no-mmap: the CPU tensors are read into allocated memory, so they must fit, or loading fails.

Checked against published runs of gpt-oss-120b (61 GiB) with its experts on the CPU and 64 GB of RAM
(tests/test_compare_capacity.py): Linux users report 18-25 tok/s, where the model pages nothing (25.8 tok/s on an
RTX 3090 + 7950X, 4 GiB for the OS); one published run measured 1.4-1.8 tok/s, which the model reaches only
when other programs hold 8-16 GiB and the file is on a SATA SSD (1.2-3.3 tok/s), or ~24 GiB on a PCIe 3.0 NVMe
(1.8). The run's free RAM and disk were not published, so this brackets it rather than reproduces it.
"""

from __future__ import annotations

from dataclasses import dataclass

from moert.errors import MoertError

OS_RESERVE_GIB = 4.0


class CapacityError(MoertError, ValueError):
    """An unknown disk preset or a RAM size that is not one."""


@dataclass(frozen=True)
class Disk:
    """A drive the model file is read from."""

    name: str
    read_gbs: float          # sequential read, GB/s (the drive's data sheet)
    fault_gbs: float         # what mmap page faults reach (128 KiB reads, a few in flight): the model's assumption
    source: str = ""


# Sequential figures are data-sheet maxima of common drives of each interface; the fault rates are this model's
# assumption (readahead-sized random reads at queue depth ~4-8: about a third of sequential on NVMe, half on SATA).
DISKS = {
    "sata-ssd": Disk("SATA SSD", 0.55, 0.25, "SATA III 6 Gb/s; Samsung 870 EVO data sheet: 560 MB/s sequential"),
    "nvme-gen3": Disk("NVMe PCIe 3.0 x4", 3.5, 1.2, "Samsung 970 EVO Plus data sheet: 3,500 MB/s sequential"),
    "nvme-gen4": Disk("NVMe PCIe 4.0 x4", 7.0, 2.3, "Samsung 990 PRO data sheet: 7,450 MB/s sequential"),
    "nvme-gen5": Disk("NVMe PCIe 5.0 x4", 14.0, 4.5, "Crucial T705 data sheet: 14,500 MB/s sequential"),
}
DEFAULT_DISK = "nvme-gen4"

# A CPU preset has no memory size; a typical desktop / workstation / server one, by memory channels (said so in
# the output): 2 channels 64 GiB, 4 channels 128 GiB, 8 or more 512 GiB.
TYPICAL_RAM_GIB = {2: 64.0, 4: 128.0, 8: 512.0, 12: 768.0}


def disk(name: str) -> Disk:
    """A Disk preset by name."""
    if name not in DISKS:
        raise CapacityError(f"no disk preset {name!r}; use one of: {', '.join(DISKS)}")
    return DISKS[name]


def typical_ram_gib(hw) -> float:
    """hw's CPU's RAM (its mem_gib), else a typical size for its memory channels (TYPICAL_RAM_GIB)."""
    if getattr(hw.cpu, "mem_gib", 0):
        return float(hw.cpu.mem_gib)
    ch = max(2, getattr(hw.cpu, "mem_channels", 0) or 2)
    return TYPICAL_RAM_GIB[max(k for k in TYPICAL_RAM_GIB if k <= ch)]


@dataclass(frozen=True)
class Ram:
    """RAM use of a plan on the CPU (bytes)."""

    capacity: float          # installed RAM
    reserve: float           # kept for the OS and other programs
    weights: float           # CPU tensors (mmap'd: page cache; --no-mmap: allocated)
    dense: float             # of which read every token (not routed experts)
    other: float             # CPU KV cache and compute buffer
    mmap: bool = True

    @property
    def cache(self) -> float:
        """Bytes of page cache the CPU tensors can have."""
        return max(self.capacity - self.reserve - self.other, 0.0)

    @property
    def fits(self) -> bool:
        return self.weights <= self.cache

    @property
    def miss(self) -> tuple[float, float]:
        """(dense, expert) fractions of reads that go to disk (0 when everything is resident)."""
        if self.fits:
            return 0.0, 0.0
        if self.cache < self.dense:
            return 1.0 - self.cache / self.dense, 1.0
        experts = self.weights - self.dense
        return 0.0, 1.0 - (self.cache - self.dense) / experts if experts else 0.0

    def to_dict(self) -> dict:
        return {"capacity": self.capacity, "reserve": self.reserve, "weights": self.weights, "dense": self.dense,
                "other": self.other, "mmap": self.mmap, "fits": self.fits, "expert_miss": self.miss[1]}


def ram(plan, ram_gib: float, n_ctx: int, kv_bytes: float = 2, reserve_gib: float = OS_RESERVE_GIB,
        mmap: bool = True) -> Ram:
    """RAM use of `plan`: its CPU tensors, and the KV cache of its CPU attention layers for n_ctx tokens."""
    from moert.cost.shape import EXPERT, Shape
    from moert.cost.zoo_arch import kv_layers

    if not ram_gib > 0:
        raise CapacityError(f"RAM size {ram_gib!r} GiB; give a positive size such as --ram 64GiB")
    on_cpu = [e for e in plan if e.device == "cpu"]
    weights = float(sum(e.nbytes for e in on_cpu))
    dense = float(sum(e.nbytes for e in on_cpu if not EXPERT.search(e.name)))
    m = Shape(plan, kv_bytes)
    cpu_attn = sum(plan.attention_device(il).name == "cpu" for il in range(m.n_layer))
    kv = n_ctx * m.Hkv * m.kv_width * kv_bytes * kv_layers(plan.metadata, cpu_attn)
    other = kv + 0.5 * 2**30                                       # + ~0.5 GiB compute buffer
    return Ram(ram_gib * 2**30, reserve_gib * 2**30, weights, dense, other, mmap)


def paged(pred, r: Ram, d: Disk) -> tuple[float, float, float]:
    """(decode tok/s, prefill tok/s, GB read from disk per decoded token) with the page-ins added."""
    dense_miss, expert_miss = r.miss
    if not (dense_miss or expert_miss):
        return pred.decode_tok_s, pred.prefill_tok_s, 0.0

    def disk_bytes(phase: str) -> float:
        # CPU reads, and weights copied from RAM for a GPU to run (prefill op offload: mostly the used experts)
        cpu = [p for p in pred.parts if p.phase == phase and p.device == "cpu"]
        copied = sum(p.bytes for p in pred.parts if p.phase == phase and p.stage == "offload")
        return (sum(p.bytes for p in cpu if p.stage == "experts") * expert_miss + copied * expert_miss
                + sum(p.bytes for p in cpu if p.stage not in ("experts", "overhead")) * dense_miss)

    tg_bytes, pp_bytes = disk_bytes("decode"), disk_bytes("prefill")
    decode_s = pred.decode_s + tg_bytes / (d.fault_gbs * 1e9)
    prefill_s = pred.prefill_s + pp_bytes / (d.fault_gbs * 1e9)
    n_prompt = pred.settings.get("n_prompt", 0)
    return 1.0 / decode_s, (n_prompt / prefill_s if prefill_s else 0.0), tg_bytes / 1e9


def with_ram(pred, plan, ram_gib: float, n_ctx: int | None = None, disk_name: str = DEFAULT_DISK,
             reserve_gib: float = OS_RESERVE_GIB, mmap: bool = True):
    """`pred` (moert.predict's Prediction of `plan`) with the RAM checked: memory["cpu"] (need, capacity, paged
    GB a token), speeds with the page-ins added, fits False where --no-mmap cannot load it."""
    from dataclasses import replace

    s = pred.settings
    kv_bytes = s.get("kv_bytes", 2)
    r = ram(plan, ram_gib, n_ctx or s.get("depth", 0) + s.get("n_prompt", 0) + s.get("n_gen", 0), kv_bytes,
            reserve_gib, mmap)
    tg, pp, gb = paged(pred, r, disk(disk_name))
    cpu = {"need": r.weights + r.other + r.reserve, "capacity": r.capacity, "weights": r.weights, "kv": r.other,
           "paged": not r.fits, "disk_gb_per_token": gb}
    return replace(pred, decode_tok_s=tg, prefill_tok_s=pp, decode_s=1 / tg if tg else pred.decode_s,
                   prefill_s=s.get("n_prompt", 0) / pp if pp else pred.prefill_s, fits=pred.fits and (r.fits or mmap),
                   memory={**pred.memory, "cpu": cpu}, settings={**s, "ram_gib": ram_gib, "disk": disk_name,
                                                                  "mmap": mmap, "os_reserve_gib": reserve_gib})


__all__ = ["DISKS", "DEFAULT_DISK", "Disk", "CapacityError", "OS_RESERVE_GIB", "Ram", "TYPICAL_RAM_GIB", "disk",
           "paged", "ram", "typical_ram_gib", "with_ram"]
