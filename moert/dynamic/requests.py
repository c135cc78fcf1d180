"""The requests an expert cache sees while a model processes a trace's tokens, and one policy's answers.

    acc = accesses(trace)                      # keys (n,) = layer * E + expert, in request order
    acc, hit, admitted, early = decisions(trace, cache)

What a request is (the runtime asks the cache the same questions in the same order): the model runs a
forward in chunks (a prompt in pieces of n_batch tokens, a decode step one token); in each chunk, layer by
layer, each distinct expert the chunk's tokens selected in that layer is requested once, in ascending expert
id (the order moert's dispatch runs them). `chunks(trace)` rebuilds the chunks from the trace's positions,
prefill flags and header["n_batch"]. Dimension legend: N tokens, L layers, K experts per token, E experts,
n requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moert.dynamic.policies import NEVER, CacheError


@dataclass
class Accesses:
    """A trace's expert requests in order: key = layer * E + expert, the chunk (step) of each, and the index
    of the same key's next request (NEVER: none)."""

    keys: np.ndarray             # (n,) int64
    step: np.ndarray             # (n,) int64
    nxt: np.ndarray              # (n,) int64
    n_layer: int
    n_expert: int
    n_tokens: int
    n_steps: int

    def _memo(self, name: str, make):
        if name not in self.__dict__:            # computed once per trace, however many caches replay it
            self.__dict__[name] = make()
        return self.__dict__[name]

    @property
    def layer(self) -> np.ndarray:
        """(n,) int64: each request's layer."""
        return self._memo("_layer", lambda: self.keys // self.n_expert)

    def requests_per_layer(self) -> np.ndarray:
        """(L,) int64: requests per layer (hits + misses of any cache)."""
        return self._memo("_requests", lambda: np.bincount(self.layer, minlength=self.n_layer).astype(np.int64))

    def cold(self) -> np.ndarray:
        """(L,) int64: first requests of an expert, per layer (a miss for every cache)."""
        return self._memo("_cold", lambda: np.bincount(np.unique(self.keys) // self.n_expert,
                                                       minlength=self.n_layer).astype(np.int64))

    def __len__(self) -> int:
        return int(self.keys.shape[0])


def chunks(trace, n_batch: int | None = None) -> np.ndarray:
    """(N,) int64: the forward chunk of each token. A decode token (prefill False) is a chunk; consecutive
    prompt tokens with consecutive positions form one, cut every n_batch tokens (default header["n_batch"])."""
    pos, pre = np.asarray(trace.positions), np.asarray(trace.prefill, dtype=bool)
    N = pos.shape[0]
    if N == 0:
        return np.zeros(0, np.int64)
    run = np.ones(N, dtype=bool)                                    # a new run of prompt tokens starts here
    run[1:] = ~pre[1:] | ~pre[:-1] | (pos[1:] != pos[:-1] + 1)
    n_batch = n_batch or trace.header.get("n_batch")
    new = run.copy()
    if n_batch:
        start = np.maximum.accumulate(np.where(run, np.arange(N), 0))   # (N,) index where each run starts
        new |= (np.arange(N) - start) % int(n_batch) == 0
    return np.cumsum(new) - 1


def cacheable(plan, n_layer: int, n_expert: int) -> np.ndarray:
    """(L, E) bool: the experts a cache may hold, those whose tensors (gate, up, down, biases) `plan` put on the
    CPU. An expert the plan put on a GPU stays there, outside the cache: never a request, hit or miss."""
    from moert.placement.memory import EXPERT_TENSORS

    out = np.zeros((n_layer, n_expert), dtype=bool)
    layers: dict[int, list[str]] = {}
    for e in plan:
        if EXPERT_TENSORS.search(e.name) and e.layer is not None and e.layer < n_layer:
            layers.setdefault(e.layer, []).append(e.name)
    for il, names in layers.items():
        out[il] = True
        for name in dict.fromkeys(names):
            devs = plan.expert_devices(name)
            if len(devs) != n_expert:
                raise CacheError(f"{name} has {len(devs)} experts, the trace or model {n_expert}: give the plan "
                                 f"of the model the trace was recorded on")
            out[il] &= np.array([d == "cpu" for d in devs])
    return out


def accesses(trace, n_batch: int | None = None, fast: bool = True, cacheable: np.ndarray | None = None) -> Accesses:
    """The requests a cache sees while the model processes `trace`'s tokens (module docstring). cacheable: (L, E)
    bool, the experts the plan put on the CPU (moert.dynamic.cache.cacheable); the others are no requests."""
    ids = np.asarray(trace.ids)
    N, L, K = ids.shape
    E = int(trace.n_expert)
    if cacheable is not None:                                       # a GPU's own experts: as if unselected
        ids = np.where((ids >= 0) & cacheable[np.arange(L)[None, :, None], np.maximum(ids, 0)], ids, -1)
    ids = np.sort(ids, axis=2)                                      # (N, L, K) each token's experts ascending
    chunk = chunks(trace, n_batch)
    multi = np.bincount(chunk, minlength=1)[chunk] > 1 if N else np.zeros(0, bool)   # tokens of a prompt chunk
    code = (chunk[:, None, None] * L + np.arange(L)[None, :, None]) * E + ids     # (N, L, K) int64
    one = code[~multi][ids[~multi] >= 0]                            # in order already: chunk, layer, expert
    many = np.unique(code[multi][ids[multi] >= 0])                  # a chunk's tokens share requests
    code = np.sort(np.concatenate([one, many]), kind="stable")      # two sorted runs: merged in linear time
    keys, step = code % (L * E), code // (L * E)
    nxt = _next_use(keys, L * E) if fast else next_use_numpy(keys)
    return Accesses(keys.astype(np.int64), step.astype(np.int64), nxt, L, E, N, int(chunk[-1]) + 1 if N else 0)


def next_use_numpy(keys: np.ndarray) -> np.ndarray:
    """(n,) index of each request's next request of the same key (NEVER: none); kernels.next_use's twin."""
    order = np.argsort(keys, kind="stable")                         # each key's requests, in time order
    nxt = np.full(keys.shape[0], NEVER, dtype=np.int64)
    same = keys[order[1:]] == keys[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


def _next_use(keys: np.ndarray, n_keys: int) -> np.ndarray:
    from moert.dynamic import kernels

    return kernels.next_use(keys.astype(np.int64), n_keys, NEVER)


def partitions(acc: Accesses, cache) -> tuple[np.ndarray, int]:
    """(n,) the cache each request goes to (its layer, or 0 for a pool), and how many caches."""
    return (acc.layer, acc.n_layer) if cache.per_layer else (np.zeros(len(acc), np.int64), 1)


def prefetches(trace, cache, n_batch: int | None = None, cacheable: np.ndarray | None = None) -> list | None:
    """What a prefetching cache (prefetch="next-router") inserts before each chunk's requests of a layer,
    [(chunk, layer, experts), ...] in order, from the predictions the trace recorded (Trace.prefetch: a run with
    such a cache attached records them; they depend on the router and hidden states only, not on the cache's
    size or policy). None for a cache without prefetch."""
    if not cache.prefetch:
        return None
    rows = getattr(trace, "prefetch", None)
    if rows is None:
        raise CacheError("a prefetching cache replays the predictions its run made, and this trace has none: record "
                         "the trace with the cache attached (moert.load(..., expert_cache=ExpertCache(..., prefetch="
                         "'next-router'), trace=True)), or replay ExpertCache(..., prefetch=None)")
    rows = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
    if cacheable is not None:
        rows = rows[cacheable[rows[:, 1], rows[:, 2]]]
    chunk = chunks(trace, n_batch)[rows[:, 0]]
    out: dict[tuple, list] = {}
    for c, il, e in zip(chunk.tolist(), rows[:, 1].tolist(), rows[:, 2].tolist()):
        out.setdefault((c, il), []).append(e)
    return [(c, il, tuple(sorted(es))) for (c, il), es in sorted(out.items())]


def decisions(trace, cache, acc: Accesses | None = None, cacheable: np.ndarray | None = None) -> tuple:
    """The requests of `trace` and, per request, whether it hit and whether it was admitted (n,) bool: what
    predict() costs token by token; and with prefetch, {(chunk, layer): experts a prefetch copied in for it}."""
    from moert.dynamic import kernels

    acc = acc if acc is not None else accesses(trace, cacheable=cacheable)
    if cache.prefetch:
        counts = cache.hot_counts(trace) if cache.policy == "static" else None
        hit, admitted, _, early = steps(acc, cache, counts, prefetches(trace, cache, cacheable=cacheable))
        return acc, hit, admitted, early
    counts = cache.hot_counts(trace) if cache.policy == "static" else None
    part, n_parts = partitions(acc, cache)
    keep = cache.keep(counts) if counts is not None else np.zeros(acc.n_layer * acc.n_expert, dtype=bool)
    hit, admitted, _ = kernels.run(kernels.KINDS[cache.policy], acc.keys, acc.step, acc.nxt, part, n_parts,
                                   int(cache.slots), acc.n_layer * acc.n_expert, keep, 1.0 / cache.half_life,
                                   acc.layer, acc.n_layer)
    return acc, hit.astype(bool), admitted.astype(bool), {}


def steps(acc: Accesses, cache, counts, prefetch: list | None = None) -> tuple:
    """policies.py's objects stepped one request at a time, with the prefetches' inserts [(chunk, layer,
    experts), ...] each before the first request at or after its (chunk, layer): per request (n,) bool hit,
    admitted, evicted, and {(chunk, layer): (admitted, evicted, copied)} of the inserts (copied: the admitted
    ones still resident when the prefetch ends, which the runtime copies; another insert of the same prefetch
    may evict one before)."""
    part, _ = partitions(acc, cache)
    pols = cache.policies(acc.n_layer, acc.n_expert, counts)
    n, E = len(acc), acc.n_expert
    hit, adm, ev = (np.zeros(n, bool) for _ in range(3))
    pending = sorted(prefetch or ())
    early: dict[tuple, tuple] = {}
    t, j = 0, 0

    def insert(c: int, il: int, es) -> None:
        nonlocal t
        a = e_ = 0
        new: set[int] = set()                  # admitted by this prefetch: an eviction of one saves its copy
        for e in es:
            admitted, evicted = pols[il if cache.per_layer else 0].insert(il * E + e, t, c)
            t += 1
            a, e_ = a + admitted, e_ + (evicted >= 0)
            new.discard(evicted)
            if admitted:
                new.add(il * E + e)
        early[c, il] = (a, e_, len(new))
    for i, (k, s, nx, p) in enumerate(zip(acc.keys.tolist(), acc.step.tolist(), acc.nxt.tolist(), part.tolist())):
        while j < len(pending) and pending[j][:2] <= (s, k // E):
            insert(*pending[j])
            j += 1
        h, a, evicted = pols[p].access(k, t, s, nx)
        t += 1
        hit[i], adm[i], ev[i] = h, a, evicted >= 0
    for c, il, es in pending[j:]:
        insert(c, il, es)
    return hit, adm, ev, early


__all__ = ["Accesses", "accesses", "cacheable", "chunks", "decisions", "next_use_numpy", "partitions", "prefetches",
           "steps"]
