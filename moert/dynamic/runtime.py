"""The expert cache at run time: `moert.load(..., cpu_moe=True, gpu_backend="sim", expert_cache=cache)`.

    m = moert.load(path, cpu_moe=True, gpu_backend="sim", expert_cache=moert.ExpertCache("sim:0", slots=4))
    m.generate("...", 32); m.stats.cache.hits, m.stats.cache.misses, m.stats.cache.weight_bytes

The cache holds, on a GPU, copies of some of the experts the plan put on the CPU (cpu_moe: all of them;
n_cpu_moe=N: the first N layers'; -ot exps=CPU); the experts the plan put on a GPU stay there and never ask the
cache (moert.dynamic.requests.cacheable; replay(..., plan=) leaves them out too). In each forward chunk, layer
by layer, the cache is asked for the chunk's distinct selected experts in ascending id (the requests
`moert.replay` replays, so its counts equal these exactly). On a hit the expert runs on the cache device from
its copy. On a miss it runs on the CPU where the plan put it (today's
behaviour: nothing waits for a copy), and then, if the policy admits it, its quantized bytes (gate, up, down
and biases) are copied to the cache device, evicting the policy's victim: the next request hits. The copies
are counted as weights (TransferStats.weight_bytes), apart from activations; on a virtual clock they take the
link's time. An expert's output is the same wherever it runs, so the logits match the static placement's to
float rounding. Belady needs the future and exists for replays only; `static` needs its hot set (hot=).

prefetch="next-router" (the approximation Pre-gated MoE, HybriMoE and llama.cpp PR 28414 rely on): while layer
l's experts run, layer l + 1's router is applied to layer l's MoE input, and the top-K experts it picks over
the chunk's tokens are inserted into the cache (policy.insert: bookkept as a reference, not counted as a
request) and copied on a "copy stream": on a virtual clock those copies cost the link's time less the layer's
expert compute they hide behind (the cost model's time for the hits on the GPU and the misses where they live:
`window`, what moert.predict charges too), never below 0. m.stats.cache.precision / .recall say, per layer,
how many predicted experts were then requested and how many requests were predicted. The guesses go into the
trace (Trace.prefetch), so moert.replay(trace, cache) gives the run's counts exactly;
`m.expert_cache.prefetch_log` holds them in the cache's own chunks (replay(..., prefetch=log)).

A forward that fails part way leaves the cache as it was (Model.forward: snapshot before, restore on failure):
the policies' bookkeeping, the resident copies (those made since freed, those evicted since copied again), the
counters and m.stats.cache.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, fields

import numpy as np

from moert.devices import CPU
from moert.dynamic.cache import CacheError, ExpertCache
from moert.dynamic.policies import NEVER, POLICIES
from moert.dynamic.requests import cacheable
from moert.layers import glu_ffn
from moert.moe import dispatch
from moert.stats import Phase
from moert.weights import SplitWeight, Weight


@dataclass
class CacheStats:
    """`m.stats.cache`: per MoE layer (L,) int64 hits, misses, admissions, evictions; weight bytes copied."""

    hits: np.ndarray
    misses: np.ndarray
    admissions: np.ndarray
    evictions: np.ndarray
    weight_bytes: int = 0
    prefetched: np.ndarray = None           # prefetch="next-router": experts predicted for each layer,
    prefetch_admissions: np.ndarray = None  # of them copied in (not resident yet),
    prefetch_correct: np.ndarray = None     # of them requested when the layer ran,
    prefetch_requests: np.ndarray = None    # and the requests of the layers a prediction was made for

    @classmethod
    def zeros(cls, n_layer: int) -> CacheStats:
        z = lambda: np.zeros(n_layer, dtype=np.int64)          # noqa: E731
        return cls(z(), z(), z(), z(), 0, z(), z(), z(), z())

    @property
    def precision(self) -> np.ndarray:
        """(L,) share of each layer's predicted experts that it then requested (NaN: no prediction)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.prefetch_correct / np.where(self.prefetched > 0, self.prefetched, np.nan)

    @property
    def recall(self) -> np.ndarray:
        """(L,) share of each layer's requests that were predicted (NaN: no prediction)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.prefetch_correct / np.where(self.prefetch_requests > 0, self.prefetch_requests, np.nan)

    @property
    def hit_rate(self) -> float:
        n = int(self.hits.sum() + self.misses.sum())
        return float(self.hits.sum()) / n if n else 0.0

    def to_dict(self) -> dict:
        return {"hit_rate": self.hit_rate, "hits": self.hits.tolist(), "misses": self.misses.tolist(),
                "admissions": self.admissions.tolist(), "evictions": self.evictions.tolist(),
                "weight_bytes": self.weight_bytes, "prefetched": self.prefetched.tolist(),
                "prefetch_admissions": self.prefetch_admissions.tolist(),
                "precision": [None if np.isnan(v) else round(float(v), 4) for v in self.precision],
                "recall": [None if np.isnan(v) else round(float(v), 4) for v in self.recall]}


class RuntimeCache:
    """An ExpertCache attached to a model (Model.use_expert_cache): its policies, its copies of experts."""

    def __init__(self, m, spec: ExpertCache):
        if not isinstance(spec, ExpertCache):
            raise CacheError(f"expert_cache= takes a moert.ExpertCache, not {type(spec).__name__}: "
                             f"expert_cache=moert.ExpertCache('sim:0', slots=8)")
        name = spec.device if isinstance(spec.device, str) else spec.device.name
        dev = next((d for d in m.plan.devices if d.name == name), None)
        if dev is None or not dev.is_gpu:
            raise CacheError(f"the expert cache's device {name!r} is not a GPU of this plan "
                             f"({', '.join(m.plan.device_names()) or 'CPU only'}); load with gpu_backend='sim' "
                             f"(or a real GPU) and give one of its GPUs, e.g. ExpertCache('sim:0', ...)")
        if not POLICIES[spec.policy].online:
            raise CacheError(f"policy {spec.policy!r} needs the future (the next request of each expert): it exists "
                             f"for replays, moert.replay(trace, cache); run lru, lfu, lfru or static")
        c = m.config
        self.spec, self.dev, self.E, self.L = spec, dev, int(c.n_expert), int(c.n_layer)
        self.cacheable = cacheable(m.plan, self.L, self.E)       # (L, E): the experts the plan put on the CPU
        if not self.cacheable.any():
            raise CacheError("the plan puts no routed expert on the CPU, so an expert cache has nothing to copy: "
                             "load with cpu_moe=True (--cpu-moe), n_cpu_moe=N or -ot exps=CPU")
        counts = spec.hot_counts(None)
        if spec.policy == "static" and counts is None:
            raise CacheError("a static cache at run time needs its hot set: ExpertCache(..., policy='static', "
                             "hot=trace) with a trace of this model (moert run --trace)")
        if counts is not None and counts.shape != (self.L, self.E):
            raise CacheError(f"hot= counts are {counts.shape}, the model {self.L} layers x {self.E} experts")
        self.policies = spec.policies(self.L, self.E, counts)
        self.resident: dict[int, tuple] = {}                   # key -> (Weight, ...) copies on dev
        self.t, self.step, self._last = 0, -1, self.L           # requests, chunks so far; the last layer seen
        self._cost = None                                        # the hits' CostModel on a virtual clock
        self._guess: dict[tuple, set] = {}                       # (chunk, layer) -> experts prefetched for it
        self.prefetch_log: list[tuple] = []                      # (chunk, layer, experts): replay(prefetch=)
        m.stats.cache = self._stats = CacheStats.zeros(self.L)
        self._weights = m.weights

    def run(self, m, il: int, ffn, x, ids_h: np.ndarray, weights, counts: np.ndarray, src, placed):
        """Layer il's experts: the chunk's requests go to the policy; hits run on the cache device from the
        copies, misses through placed(ids with hits masked -1, their counts); admissions copy after, then
        (prefetch="next-router") the experts layer il + 1's router picks for x."""
        if il <= self._last:                                     # layers run in order: a new chunk
            self.step += 1
        self._last = il
        E, st = self.E, m.stats.cache
        requested = np.flatnonzero((counts > 0) & self.cacheable[il])   # the GPU's own experts never ask
        guess = self._guess.pop((self.step, il), None)           # what layer il - 1 predicted for this layer
        if guess is not None:
            st.prefetch_correct[il] += len(guess.intersection(requested.tolist()))
            st.prefetch_requests[il] += len(requested)
        pol = self.policies[il if self.spec.per_layer else 0]
        hit = np.zeros(E, dtype=bool)
        events = []                                              # (evicted, admitted key, layer, prefetch)
        for e in requested.tolist():
            h, admitted, evicted = pol.access(il * E + e, self.t, self.step, NEVER)
            self.t += 1
            hit[e] = h
            if admitted or evicted >= 0:
                events.append((evicted, il * E + e if admitted else -1, il, False))
        st.hits[il] += int(hit.sum())
        st.misses[il] += len(requested) - int(hit.sum())
        held = {e: self.resident[il * E + e] for e in np.flatnonzero(hit).tolist()}   # before evictions
        if self.spec.prefetch == "next-router":
            events += self._prefetch(m, il + 1, x)
        y, t0 = None, time.perf_counter()
        miss = np.where(counts > 0, ~hit, False)
        if miss.any():
            ids_m = np.where(hit[ids_h] & (ids_h >= 0), -1, ids_h).astype(np.int32)      # (T, K) -1: a hit's slot
            y = placed(ids_m, np.where(miss, counts, 0))
        busy = time.perf_counter() - t0                          # the layer's compute a prefetch copy hides behind
        if m.clock is not None and m.clock.covers(self.dev):    # ... on a virtual clock, the cost model's
            busy = window(m.clock.cost, il, np.where(miss & self.cacheable[il], counts, 0), int(x.shape[0]))
        if held:
            part, gpu_s = self._on_cache(m, il, ffn, x, ids_h, weights, np.where(hit, counts, 0), src, held)
            busy += gpu_s
            y = part if y is None else y + part
        hidden = []
        for evicted, admitted, layer, early in events:
            if evicted >= 0:
                st.evictions[layer] += 1                         # by the layer of the request, as replay
                if evicted in hidden:                            # prefetched just now, not copied yet
                    hidden.remove(evicted)
                else:
                    for w in self.resident.pop(evicted):
                        self.dev.free(w.data)
            if admitted < 0:
                continue
            if early:
                st.prefetch_admissions[layer] += 1
                hidden.append(admitted)
                continue
            st.admissions[layer] += 1
            self.resident[admitted] = self._copy(m, ffn, admitted % E, layer)
            st.weight_bytes += sum(w.nbytes for w in self.resident[admitted])
        if hidden:
            self._copy_early(m, ffn, hidden, busy)
        return y

    def _prefetch(self, m, layer: int, x) -> list[tuple]:
        """Layer `layer`'s router applied to x (this layer's MoE input): its top-K experts over the chunk's
        tokens are inserted into the cache now (policy.insert); returns the copy events."""
        name = f"blk.{layer}.ffn_gate_inp.weight"
        if layer >= self.L or not m.has(name) or not self.cacheable[layer].any():
            m.record_prefetch(layer, ())                         # nothing to predict (the GPU's own experts)
            return []
        dev = m.device_of(name)
        with m.phase("router", dev):
            logits = m.linear(m.to(x, dev, "prefetch: hidden"), name, dev)              # (T, E)
        lg = logits if dev is CPU else m.to(logits, CPU, "prefetch: router logits")
        k = self.spec.prefetch_k or int(m.config.n_expert_used)
        guess = sorted(set(np.argsort(-lg, axis=1, kind="stable")[:, :k].reshape(-1).tolist()))
        m.record_prefetch(layer, guess)                          # the trace keeps it: replay and predict read it
        guess = [e for e in guess if self.cacheable[layer, e]]
        self._guess[(self.step, layer)] = set(guess)
        self.prefetch_log.append((self.step, layer, tuple(guess)))
        m.stats.cache.prefetched[layer] += len(guess)
        pol = self.policies[layer if self.spec.per_layer else 0]
        out = []
        for e in guess:
            admitted, evicted = pol.insert(layer * self.E + e, self.t, self.step)
            self.t += 1
            if admitted or evicted >= 0:
                out.append((evicted, layer * self.E + e if admitted else -1, layer, True))
        return out

    def _copy_early(self, m, ffn, keys: list[int], busy: float) -> None:
        """Prefetched experts copied on a copy stream beside this layer's expert compute: on a virtual clock
        the link's time less the `busy` seconds it hides behind (never below 0); else measured."""
        clock = m.clock
        predicted = None
        if clock is not None and clock.covers(self.dev):
            sizes = [_raw(m.weights[n], k % self.E).nbytes for k in keys for n in _tensors(ffn, k // self.E)]
            predicted = max(0.0, sum(clock.transfer_seconds(b) for b in sizes) - busy)
        with Phase(m, "transfers", f"cpu->{self.dev.name} prefetch", predicted):
            for k in keys:
                self.resident[k] = self._copy(m, ffn, k % self.E, k // self.E, timed=False)
                m.stats.cache.weight_bytes += sum(w.nbytes for w in self.resident[k])

    def _copy(self, m, ffn, e: int, layer: int, timed: bool = True) -> tuple:
        """Expert e of `layer`: its gate, up, down (and bias) rows copied to the cache device, one-expert Weights
        there (timed: each a link transfer on a virtual clock; else inside the caller's timer)."""
        out = []
        for n in _tensors(ffn, layer):
            w = m.weights[n]
            host = np.ascontiguousarray(_raw(w, e)[None])                  # (1, rows, row bytes)
            what = f"expert cache: {n}[{e}]"
            data = m.copy_weights(host, self.dev, what) if timed else self.dev.put_weights(host, what)
            out.append(Weight(n, w.type, w.shape, self.dev, data, (e,)))
        return tuple(out)

    def _phase(self, m, il: int, counts: np.ndarray, B: int):
        """The hits' timer: on a virtual clock (load(hardware=): m.clock) the cost model's expert term for these experts
        on the cache's sim GPU (dynamic/predict.py's, so predict and the clock agree), else measured."""
        clock = m.clock
        if clock is None or not clock.covers(self.dev):
            return m.phase("experts", self.dev)
        from moert.dynamic.predict import cache_cost_model

        if self._cost is None:
            self._cost = cache_cost_model(m.plan, clock.hardware, self.dev.name)
        items, used = self._cost.expert_load(il, B, counts=counts)[self.dev.name]
        return Phase(m, "experts", self.dev, self._cost.stage("clock", self.dev.name, il, "experts", items,
                                                              len(items), B, used).seconds)

    def _on_cache(self, m, il: int, ffn, x, ids_h, weights, counts, src, held: dict):
        """The hit experts (`held`: e -> its copies) on the cache device: (T, D) on src, and the seconds they
        took (the virtual clock's, else measured)."""
        names, act, biases = ffn
        dev = self.dev
        ids = np.where(np.isin(ids_h, list(held)), ids_h, -1).astype(np.int32)
        ids, w, xd = m.to(ids, dev, "expert ids"), m.to(weights, dev, "expert weights"), m.to(x, dev, "hidden")

        def run(e: int, xs):
            ws = held[e]
            b = tuple(t.dequantize_expert(e) for t in ws[3:]) if biases else None
            return glu_ffn(xs, *(t.dequantize_expert(e) for t in ws[:3]), act, b, dev.xp)
        timer, t0 = self._phase(m, il, counts, int(x.shape[0])), time.perf_counter()
        with timer:
            y = dispatch(xd, ids, w, counts, run, dev.xp)
        took = timer.predicted if timer.predicted is not None else time.perf_counter() - t0
        return m.to(y, src, "expert output"), took

    def snapshot(self) -> tuple:
        """The cache's state before a forward (Model.forward restores it if the forward fails): the policies'
        bookkeeping, which copies are resident, the counters and the stats."""
        st = self._stats
        return ([p.state() for p in self.policies], dict(self.resident), self.t, self.step, self._last,
                dict(self._guess), len(self.prefetch_log),
                {f.name: _copied(getattr(st, f.name)) for f in fields(st)})

    def restore(self, snap: tuple) -> None:
        """Back to `snapshot`'s state: the copies made since are freed, those evicted since copied again (a
        real move: the device's counters see it, m.stats.cache does not)."""
        pols, resident, self.t, self.step, self._last, guess, n_log, stats = snap
        for p, state in zip(self.policies, pols):
            p.restore(state)
        for k, ws in self.resident.items():
            if k not in resident:
                for w in ws:
                    self.dev.free(w.data)
        self.resident = {k: self.resident[k] if k in self.resident else self._recopy(ws) for k, ws in resident.items()}
        self._guess = guess
        del self.prefetch_log[n_log:]
        for name, v in stats.items():
            setattr(self._stats, name, v)

    def _recopy(self, ws: tuple) -> tuple:
        """Copies of an expert evicted (and freed) during a forward that failed, made again from the CPU."""
        out = []
        for w in ws:
            e = w.experts[0]
            host = np.ascontiguousarray(_raw(self._weights[w.name], e)[None])
            data = self.dev.put_weights(host, f"expert cache: {w.name}[{e}]")
            out.append(Weight(w.name, w.type, w.shape, self.dev, data, (e,)))
        return tuple(out)

    def close(self) -> None:
        """Free every copy on the cache device."""
        for ws in self.resident.values():
            for w in ws:
                self.dev.free(w.data)
        self.resident.clear()


def window(cost, il: int, counts: np.ndarray, B: int) -> float:
    """Seconds the cost model gives layer il's missed cacheable experts (counts (E,) of them, where the plan put
    them) for B tokens: with the hits' seconds, the layer's expert compute a prefetch copy hides behind."""
    return sum(cost.stage("clock", d, il, "experts", items, len(items), B, used).seconds
               for d, (items, used) in cost.expert_load(il, B, counts=counts).items()) if counts.any() else 0.0


def _raw(w, e: int):
    """Expert e's bytes of w (a tensor split over devices: of its piece holding e), a view."""
    return (w.piece_of(e) if isinstance(w, SplitWeight) else w).raw_expert(e)


def _copied(v):
    return v.copy() if isinstance(v, np.ndarray) else v


def _tensors(ffn, layer: int) -> list[str]:
    """The expert tensors (gate, up, down, biases) of `layer`, named as ffn's of its own layer are."""
    names, _, biases = ffn
    return [re.sub(r"^blk\.\d+\.", f"blk.{layer}.", n) for n in (*names, *(biases or ()))]


__all__ = ["CacheStats", "RuntimeCache"]
