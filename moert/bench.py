"""`moert bench`'s measurement: llama-bench's pp and tg tests on a loaded Model, in one table.

    results = bench(model, n_prompt=64, n_gen=32, repetitions=3)     # [pp64, tg32 @ d64]
    print(format_table(machine_info(), model_info(model.gguf), settings, results))

Each repetition empties the context (`Model.reset`), times one forward of `n_prompt` token ids (the pp
test: prompt processing), then `n_gen` single-token forwards that continue after them (the tg test: text
generation at depth `n_prompt`, as in a conversation). The ids are seeded random ids within the
vocabulary, so any GGUF works, with or without a tokenizer; no sampling is timed (llama-bench does the
same). Reported per test, as llama-bench does: tokens/s as mean ± standard deviation over repetitions,
plus the best repetition, ms per token, and for tg the effective bandwidth: the weight bytes one decoded
token must read (`bytes_per_token`) times tokens/s. bench/e2e.py builds on the same pieces to compare
with llama.cpp.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moert.devices import format_size
from moert.errors import ContextOverflowError, GenerationError, GGUFError
from moert.gguf import GGUFFile

SEED = 0  # the token ids every run uses, so two runs read the same experts


# ------------------------------------------------------------------------------------ the model's side

def bytes_per_token(model: str | Path | GGUFFile) -> dict:
    """Weight bytes one decoded token reads: every dense tensor, K of E experts per layer, one embedding row.

    {'file': all tensor bytes, 'decode': what one token reads, 'experts_per_token': its expert part, 'dense': the rest}
    """
    from moert import gguf

    if not isinstance(model, GGUFFile):
        with gguf.open(model) as g:
            return bytes_per_token(g)
    g, arch = model, model.architecture
    total = dense = experts = 0
    for name, t in g.tensors.items():
        n = int(t.nbytes)
        total += n
        if "_exps" in name:                               # routed experts: (E, rows, cols), K of E are read
            E, K = _key(g, f"{arch}.expert_count"), _key(g, f"{arch}.expert_used_count")
            experts += n * K // E
        elif name == "token_embd.weight":
            dense += n // int(t.shape[0])                 # one row
            if "output.weight" not in g.tensors:
                dense += n                                # tied: the output reads all of it
        else:
            dense += n
    return dict(file=total, decode=dense + experts, experts_per_token=experts, dense=dense)


def _key(g: GGUFFile, key: str) -> int:
    if key not in g.metadata:
        raise GGUFError(f"{g.path}: GGUF key {key!r} is missing but the file has expert tensors; "
                        f"re-convert the model with llama.cpp's convert_hf_to_gguf.py")
    return int(g.metadata[key])


def model_info(g: GGUFFile) -> dict:
    """File, architecture, size, parameters, bytes by type, trained context and bytes per decoded token."""
    arch = g.architecture
    by_type: Counter[str] = Counter()
    for t in g.tensors.values():
        by_type[t.type] += int(t.nbytes)
    return dict(file=g.path.name, path=str(g.path), architecture=arch, name=g.metadata.get("general.name"),
                size=sum(by_type.values()), file_size=g.file_size,
                params=sum(t.n_elements for t in g.tensors.values()), bytes_by_type=dict(by_type.most_common()),
                n_ctx_train=_int(g.metadata.get(f"{arch}.context_length")),
                n_expert=_int(g.metadata.get(f"{arch}.expert_count")),
                n_expert_used=_int(g.metadata.get(f"{arch}.expert_used_count")), bytes_per_token=bytes_per_token(g))


def _int(v) -> int | None:
    return None if v is None else int(v)


# ---------------------------------------------------------------------------------- the machine's side

def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() is often empty on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(threads: int | None = None) -> dict:
    """CPU model, cores, kernel threads (Numba's current setting unless given), versions, load average."""
    import numba

    return dict(cpu=cpu_model(), cores=os.cpu_count(), threads=threads or numba.get_num_threads(),
                python=platform.python_version(), numpy=np.__version__, numba=numba.__version__,
                load_avg=round(os.getloadavg()[0], 2))


def device_label(dev) -> str:
    """'sim:0 (simulated, 24.00 GiB)', 'cuda:0 (NVIDIA H100 80GB HBM3)': what a table header says of a GPU."""
    if dev.name.startswith("cuda"):
        from moert import _cuda

        return f"{dev.name} ({_cuda.device_name(dev.index)})"
    return f"{dev.name} (simulated, {format_size(dev.capacity)})"


# ------------------------------------------------------------------------------------------ the tests

@dataclass
class TestResult:
    """One llama-bench test: `tokens` per repetition, `samples_s` wall seconds of each repetition."""

    name: str                      # 'pp64', 'tg32 @ d64'
    n_prompt: int                  # tokens in one forward (pp), else 0
    n_gen: int                     # single-token forwards (tg), else 0
    depth: int                     # tokens already in the context when the test starts
    samples_s: list[float] = field(default_factory=list)
    bytes_per_token: int | None = None   # tg: weight bytes a decoded token reads (for GB/s)

    __test__ = False               # not a pytest class, despite the name

    @property
    def tokens(self) -> int:
        return self.n_prompt or self.n_gen

    @property
    def samples_ts(self) -> list[float]:
        return [self.tokens / s for s in self.samples_s]

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        return statistics.stdev(self.samples_ts) if len(self.samples_s) > 1 else 0.0

    @property
    def best_ts(self) -> float:
        return max(self.samples_ts)

    @property
    def ms_per_token(self) -> float:
        return statistics.fmean(self.samples_s) / self.tokens * 1e3

    @property
    def GBps(self) -> float | None:  # noqa: N802 - the unit
        """Weight bytes a decoded token reads / mean seconds per token (tg only)."""
        return None if self.bytes_per_token is None else self.bytes_per_token / self.ms_per_token / 1e6

    def to_dict(self) -> dict:
        """llama-bench's JSON names (samples_ns, samples_ts, avg_ts, stddev_ts) plus best_ts, ms/token, GB/s."""
        return dict(test=self.name, n_prompt=self.n_prompt, n_gen=self.n_gen, n_depth=self.depth,
                    samples_ns=[round(s * 1e9) for s in self.samples_s], samples_ts=self.samples_ts,
                    avg_ts=self.avg_ts, stddev_ts=self.stddev_ts, best_ts=self.best_ts,
                    ms_per_token=self.ms_per_token, bytes_per_token=self.bytes_per_token, GBps=self.GBps)


def check_fits(n_prompt: int, n_gen: int, context_size: int, n_ctx_train: int | None = None) -> None:
    """ContextOverflowError unless the prompt and the generated tokens fit in the context together."""
    if n_prompt < 0 or n_gen < 0:
        raise GenerationError(f"token counts must be >= 0, got n_prompt (-p) {n_prompt}, n_gen (-n) {n_gen}")
    if n_prompt + n_gen == 0:
        raise GenerationError("nothing to measure: -p and -n are both 0; give -p N (prompt processing) "
                              "or -n N (generation) or both")
    need = n_prompt + n_gen
    if need > context_size:
        fix = (f"the model was trained for {n_ctx_train}: give fewer tokens" if n_ctx_train and need > n_ctx_train
               else f"give a context (-c) of {need} or more, or fewer tokens")
        raise ContextOverflowError(f"n_prompt (-p) {n_prompt} + n_gen (-n) {n_gen} = {need} tokens do not fit in "
                                   f"the context of {context_size} tokens; {fix}")


def bench(model, n_prompt: int = 64, n_gen: int = 32, repetitions: int = 3, warmup: bool = True,
          seed: int = SEED) -> list[TestResult]:
    """Time the pp test (one forward of n_prompt ids) and the tg test (n_gen one-token forwards after it),
    `repetitions` times each from an empty context; one untimed round first unless warmup=False."""
    check_fits(n_prompt, n_gen, model.context_size, model.config.n_ctx_train)
    if repetitions < 1:
        raise GenerationError(f"repetitions must be >= 1, got {repetitions}")
    ids = np.random.default_rng(seed).integers(0, model.n_vocab, n_prompt + n_gen)   # (P + N,)
    prompt, gen = ids[:n_prompt], ids[n_prompt:]
    pp = TestResult(f"pp{n_prompt}", n_prompt, 0, 0)
    tg = TestResult(f"tg{n_gen}" + (f" @ d{n_prompt}" if n_prompt else ""), 0, n_gen, n_prompt,
                    bytes_per_token=bytes_per_token(model.gguf)["decode"])
    if warmup:                                  # as llama-bench: batched kernels and caches warm, untimed
        model.reset()
        if n_prompt:
            model.forward(prompt, last_only=True)
        if n_gen:
            model.forward(gen[:1])
    for _ in range(repetitions):
        model.reset()
        if n_prompt:
            t0 = time.perf_counter()
            model.forward(prompt, last_only=True)
            pp.samples_s.append(time.perf_counter() - t0)
        if n_gen:
            t0 = time.perf_counter()
            for i in range(n_gen):
                model.forward(gen[i:i + 1])
            tg.samples_s.append(time.perf_counter() - t0)
    model.reset()
    return [t for t in (pp, tg) if t.samples_s]


def placement_info(model) -> dict:
    """Weight bytes per device, the GPUs named, the -ot rules, context and batch of a loaded model."""
    return dict(bytes_by_device=model.plan.bytes_by_device(), gpus=[device_label(d) for d in model.plan.devices],
                overrides=model.plan.overrides_string(), context_size=model.context_size, n_batch=model.n_batch)


# ------------------------------------------------------------------------------------------- the table

def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def format_table(machine: dict, model: dict, settings: dict, results: list[TestResult]) -> str:
    """The header (model, machine, placement, settings) and llama-bench's markdown table, one row per test."""
    bpt = model["bytes_per_token"]
    types = ", ".join(f"{t} {n / model['size']:.0%}" for t, n in model["bytes_by_type"].items()
                      if n / model["size"] >= 0.005)
    experts = (f" ({format_size(bpt['experts_per_token'])} of experts: {model['n_expert_used']} of "
               f"{model['n_expert']} per layer)" if bpt["experts_per_token"] else "")
    where = ", ".join(f"{d} {format_size(n)}" for d, n in settings["bytes_by_device"].items() if n)
    out = [f"model:     {model['file']}: {model['architecture']}, {format_size(model['size'])}, "
           f"{_count(model['params'])} params ({types})",
           f"           a decoded token reads {format_size(bpt['decode'])} of weights{experts}",
           f"machine:   {machine['cpu']}, {machine['cores']} cores, {machine['threads']} "
           f"thread{'s' if machine['threads'] > 1 else ''}; python "
           f"{machine['python']}, numpy {machine['numpy']}, numba {machine['numba']}; load average "
           f"{machine['load_avg']}",
           f"placement: {where}" + (f"; GPUs: {', '.join(settings['gpus'])}" if settings["gpus"] else "")
           + (f"; -ot {settings['overrides']}" if settings["overrides"] else ""),
           f"settings:  context {settings['context_size']}, batch {settings['n_batch']}, "
           f"{settings['repetitions']} repetition{'s' if settings['repetitions'] > 1 else ''}, "
           f"{'warm-up' if settings['warmup'] else 'no warm-up'}"
           + (f", activations {settings['act_quant']}" if settings.get("act_quant", "none") != "none" else ""),
           ""]
    rows = [[r.name, f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}", f"{r.best_ts:.2f}", f"{r.ms_per_token:.2f}",
             "-" if r.GBps is None else f"{r.GBps:.3g}"] for r in results]
    head = ["test", "t/s", "best t/s", "ms/token", "GB/s"]
    w = [max(len(x) for x in col) for col in zip(head, *rows)]
    out.append("| " + " | ".join(h.ljust(w[i]) if i == 0 else h.rjust(w[i]) for i, h in enumerate(head)) + " |")
    out.append("| " + " | ".join("-" * w[0] if i == 0 else "-" * (w[i] - 1) + ":" for i in range(len(w))) + " |")
    out += ["| " + " | ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)) + " |"
            for r in rows]
    out.append("\nt/s: mean ± std over repetitions; GB/s: weight bytes a decoded token reads x t/s")
    return "\n".join(out)


__all__ = ["TestResult", "bench", "bytes_per_token", "check_fits", "cpu_model", "device_label", "format_table",
           "machine_info", "model_info", "placement_info"]
