"""`moert bench`'s measurement: llama-bench's pp and tg tests on a loaded Model, in one table.

    results = bench(model, n_prompt=64, n_gen=32, repetitions=3)     # [pp64, tg32]
    results = [run_test(model, n_prompt=512, depth=4096)]             # [pp512 @ d4096]
    print(format_table(machine_info(), model_info(model.gguf), settings, results))   # or bench_records.record

Each repetition empties the context (`Model.reset`), fills it with `depth` tokens (untimed), then times
one forward of `n_prompt` token ids (the pp test: prompt processing) or `n_gen` single-token forwards
(the tg test: text generation), as llama-bench does. The ids are seeded random ids within the
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
        from moert.devices import cuda as _cuda

        return f"{dev.name} ({_cuda.device_name(dev.index)})"
    return f"{dev.name} (simulated, {format_size(dev.capacity)})"


# ------------------------------------------------------------------------------------------ the tests

@dataclass
class TestResult:
    """One llama-bench test: `tokens` per repetition, `samples_s` wall seconds of each repetition."""

    name: str                      # 'pp64', 'tg32', 'pp512 @ d4096'
    n_prompt: int                  # tokens in one forward (pp), else 0
    n_gen: int                     # single-token forwards (tg), else 0
    depth: int                     # tokens already in the context when the test starts
    samples_s: list[float] = field(default_factory=list)
    bytes_per_token: int | None = None   # tg: weight bytes a decoded token reads (for GB/s)
    params: dict = field(default_factory=dict)   # the swept flags of its configuration: {'ngl': 'all', ...}
    config: dict = field(default_factory=dict)   # its whole configuration, llama-bench's names: {'type_k': ...}
    time: float = 0.0                            # when it started (seconds since the epoch: test_time)
    one_thread_steps: int = 0      # timed decode steps the stall guard ran on one thread (moert/threads.py)

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
                    ms_per_token=self.ms_per_token, bytes_per_token=self.bytes_per_token, GBps=self.GBps,
                    one_thread_steps=self.one_thread_steps, **self.params)


def label(n_prompt: int, n_gen: int, depth: int = 0) -> str:
    """llama-bench's test names: 'pp512', 'tg128', 'pp512 @ d4096'."""
    return (f"pp{n_prompt}" if n_prompt else f"tg{n_gen}") + (f" @ d{depth}" if depth else "")


def check_fits(tests: list[tuple[int, int, int]], context_size: int, n_ctx_train: int | None = None) -> None:
    """ContextOverflowError unless each (n_prompt, n_gen, depth) test fits in the context; GenerationError if none."""
    if any(x < 0 for t in tests for x in t):
        raise GenerationError(f"token counts must be >= 0, got {tests}")
    tests = [t for t in tests if t[0] or t[1]]
    if not tests:
        raise GenerationError("nothing to measure: -p and -n are both 0; give -p N (prompt processing) "
                              "or -n N (generation) or both")
    p, n, d = max(tests, key=sum)
    need = p + n + d
    if need > context_size:
        fix = (f"the model was trained for {n_ctx_train}: give fewer tokens" if n_ctx_train and need > n_ctx_train
               else f"give a context (-c) of {need} or more, or fewer tokens")
        what = f"-p {p}" if p else f"-n {n}"
        raise ContextOverflowError(f"{label(p, n, d)} needs {need} tokens (-d {d} + {what}), which do not fit in "
                                   f"the context of {context_size} tokens; {fix}")


def run_test(model, n_prompt: int = 0, n_gen: int = 0, depth: int = 0, repetitions: int = 3, warmup: bool = True,
             seed: int = SEED) -> TestResult:
    """One llama-bench test, `repetitions` times (after one untimed round unless warmup=False): fill the context
    with `depth` tokens (untimed), then time one forward of n_prompt ids (pp) or n_gen one-token forwards (tg)."""
    if bool(n_prompt) == bool(n_gen):
        raise GenerationError(f"a test is pp (n_prompt) or tg (n_gen), got n_prompt={n_prompt}, n_gen={n_gen}")
    check_fits([(n_prompt, n_gen, depth)], model.context_size, model.config.n_ctx_train)
    if repetitions < 1:
        raise GenerationError(f"repetitions must be >= 1, got {repetitions}")
    ids = np.random.default_rng(seed).integers(0, model.n_vocab, depth + n_prompt + n_gen)   # (D + P + N,)
    past, ids = ids[:depth], ids[depth:]
    t = TestResult(label(n_prompt, n_gen, depth), n_prompt, n_gen, depth,
                   bytes_per_token=None if n_prompt else bytes_per_token(model.gguf)["decode"], time=time.time())
    for timed in [False] * warmup + [True] * repetitions:
        model.reset()
        if depth:
            model.forward(past, last_only=True)
        guard = getattr(model, "stall_guard", None)
        t0, s0, one0 = time.perf_counter(), model.stats.total.seconds, guard.one_steps if guard else 0
        if n_prompt:
            model.forward(ids, last_only=True)
        else:
            for i in range(n_gen):
                model.forward(ids[i:i + 1])
        if timed:                 # with a virtual clock, its time: CPU measured, sim GPUs and link predicted
            clock = getattr(model, "clock", None) is not None
            t.samples_s.append(model.stats.total.seconds - s0 if clock else time.perf_counter() - t0)
            t.one_thread_steps += (guard.one_steps - one0) if guard else 0
    model.reset()
    return t


def bench(model, n_prompt: int = 64, n_gen: int = 32, repetitions: int = 3, warmup: bool = True,
          seed: int = SEED, depth: int = 0) -> list[TestResult]:
    """llama-bench's default pair: pp{n_prompt} and tg{n_gen}, each from `depth` tokens of context (0 skips one)."""
    return [run_test(model, p, n, depth, repetitions, warmup, seed) for p, n in ((n_prompt, 0), (0, n_gen)) if p or n]


def placement_info(model) -> dict:
    """Weight bytes per device, the GPUs named, the -ot rules, context and batch of a loaded model."""
    clock = getattr(model, "clock", None)
    hw = clock.hardware if clock is not None else None
    return dict(bytes_by_device=model.plan.bytes_by_device(), gpus=[device_label(d) for d in model.plan.devices],
                overrides=model.plan.overrides_string(), context_size=model.context_size, n_batch=model.n_batch,
                hardware=hw.name if hw is not None else None)


# ------------------------------------------------------------------------------------------- the table

def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def format_table(machine: dict, model: dict, settings: dict, results: list[TestResult], several: bool = False) -> str:
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
           f"placement: {where}" + (" (first configuration)" if several else "")
           + (f"; GPUs: {', '.join(settings['gpus'])}" if settings["gpus"] else "")
           + (f"; -ot {settings['overrides']}" if settings["overrides"] else ""),
           f"settings:  context {settings['context_size']}, batch {settings['n_batch']}, "
           f"{settings['repetitions']} repetition{'s' if settings['repetitions'] > 1 else ''}, "
           f"{'warm-up' if settings['warmup'] else 'no warm-up'}"
           + (f", activations {settings['act_quant']}" if settings.get("act_quant", "none") != "none" else ""),
           ""]
    if settings.get("hardware"):
        out[-1:-1] = [f"clock:     sim GPU and transfer times predicted for {settings['hardware']} "
                      f"(moert/cost/vclock.py); CPU times measured here"]
    swept = list(results[0].params) if results else []        # llama-bench shows a column per swept flag
    rows = [[*(str(r.params[k]) for k in swept), r.name, f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}", f"{r.best_ts:.2f}",
             f"{r.ms_per_token:.2f}", "-" if r.GBps is None else f"{r.GBps:.3g}"] for r in results]
    head = [*swept, "test", "t/s", "best t/s", "ms/token", "GB/s"]
    left = len(swept) + 1                                     # text columns, then numbers
    w = [max(len(x) for x in col) for col in zip(head, *rows)]
    out.append("| " + " | ".join(h.ljust(w[i]) if i < left else h.rjust(w[i]) for i, h in enumerate(head)) + " |")
    out.append("| " + " | ".join("-" * w[i] if i < left else "-" * (w[i] - 1) + ":" for i in range(len(w))) + " |")
    out += ["| " + " | ".join(c.ljust(w[i]) if i < left else c.rjust(w[i]) for i, c in enumerate(r)) + " |"
            for r in rows]
    out.append("\nt/s: mean ± std over repetitions; GB/s: weight bytes a decoded token reads x t/s")
    guarded = [r for r in results if r.one_thread_steps]
    if guarded:
        out.append("stall guard: " + ", ".join(f"{r.name} {r.one_thread_steps} of {r.n_gen * len(r.samples_s)}"
                                               for r in guarded)
                   + " timed decode steps ran on one thread, another process stalling the threads (--no-stall-guard "
                     "keeps every step on -t)")
    return "\n".join(out)


__all__ = ["TestResult", "bench", "bytes_per_token", "check_fits", "cpu_model", "device_label", "format_table",
           "machine_info", "model_info", "placement_info", "run_test", "label"]
