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


def prefetches(trace, cache, n_batch: int | None = None, cacheable: np.ndarray | None = None) -> np.ndarray | None:
    """What a prefetching cache (prefetch="next-router") inserts before each chunk's requests of a layer: (M, 3)
    int64 rows (chunk, layer, expert), sorted, from the predictions the trace recorded (Trace.prefetch: a run
    with such a cache attached records them; they depend on the router and hidden states only, not on the
    cache's size or policy). None for a cache without prefetch."""
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
    return as_rows(np.stack([chunks(trace, n_batch)[rows[:, 0]], rows[:, 1], rows[:, 2]], axis=1))


def as_rows(prefetch) -> np.ndarray:
    """Inserts as (M, 3) int64 rows (chunk, layer, expert), sorted and unique: from rows, or from a runtime
    cache's prefetch_log [(chunk, layer, experts), ...]."""
    if isinstance(prefetch, np.ndarray):
        rows = prefetch.astype(np.int64).reshape(-1, 3)
    else:
        rows = np.array([(c, il, e) for c, il, es in prefetch for e in es], dtype=np.int64).reshape(-1, 3)
    if not len(rows):
        return rows
    m1, m2 = int(rows[:, 1].max()) + 1, int(rows[:, 2].max()) + 1           # np.unique(axis=0), 1-D (fast)
    code = np.sort((rows[:, 0] * m1 + rows[:, 1]) * m2 + rows[:, 2])
    code = code[np.r_[True, code[1:] != code[:-1]]]
    return np.stack([code // (m1 * m2), code // m2 % m1, code % m2], axis=1)


def merge(acc: Accesses, rows: np.ndarray) -> tuple:
    """The requests and the inserts of `rows` in the order a cache sees them (an insert before the first request
    at or after its (chunk, layer)): order (n + M,) (entries: requests, then inserts), and in that order ins, keys,
    step, nxt (an insert's: NEVER, "never asked", as Policy.insert tells Belady), grp (an insert's prefetch)."""
    n, M, L, E = len(acc), len(rows), acc.n_layer, acc.n_expert
    order = np.argsort(np.concatenate([(acc.step * L + acc.layer) * 2 + 1, (rows[:, 0] * L + rows[:, 1]) * 2]),
                       kind="stable")
    new = np.r_[True, (rows[1:, :2] != rows[:-1, :2]).any(axis=1)] if M else np.zeros(0, bool)
    return (order, np.concatenate([np.zeros(n, np.uint8), np.ones(M, np.uint8)])[order],
            np.concatenate([acc.keys, rows[:, 1] * E + rows[:, 2]])[order],
            np.concatenate([acc.step, rows[:, 0]])[order],
            np.concatenate([acc.nxt, np.full(M, NEVER, np.int64)])[order],
            np.concatenate([np.full(n, -1, np.int64), np.cumsum(new) - 1])[order])


def decide(acc: Accesses, cache, counts, rows: np.ndarray | None = None, fast: bool = True,
           merged: tuple | None = None) -> tuple:
    """A cache's answers to the requests (and the inserts of `rows`, as `as_rows` gives them): per request (n,) bool
    hit and admitted; per layer (4, L) int64 hits, admissions, evictions (the inserts' too), prefetch admissions;
    per insert (M,) bool admitted and copied (still resident when its prefetch ends: the runtime copies it).
    fast: the Numba kernel over requests and inserts merged in order (`merge`; merged: its result, when sweeping
    many caches over one trace); else `steps`, policies.py's objects."""
    rows = rows if rows is not None else np.zeros((0, 3), np.int64)
    L, E, n, M = acc.n_layer, acc.n_expert, len(acc), len(rows)
    if not fast:
        hit, adm, ev, ins_adm, ins_ev, copied = steps(acc, cache, counts, rows)
        per = np.zeros((4, L), np.int64)
        for r, x in enumerate((hit, adm, ev)):
            per[r] = np.bincount(acc.layer[x], minlength=L)
        per[2] += np.bincount(rows[ins_ev, 1], minlength=L)
        per[3] = np.bincount(rows[ins_adm, 1], minlength=L)
        return hit, adm, per, ins_adm, copied
    from moert.dynamic import kernels

    order, ins, keys, step, nxt, grp = merged if merged is not None else merge(acc, rows)
    layer = keys // E
    part, n_parts = (layer, L) if cache.per_layer else (np.zeros(n + M, np.int64), 1)
    keep = cache.keep(counts) if counts is not None else np.zeros(L * E, dtype=bool)
    hit, adm, copied, per = kernels.run(kernels.KINDS[cache.policy], keys, step, nxt, part, n_parts, int(cache.slots),
                                        L * E, keep, 1.0 / cache.half_life, layer, L, ins, grp)
    req, back = ins == 0, np.empty(n + M, np.int64)
    back[order] = np.arange(n + M)                                            # merged position of each entry
    at = back[n:]
    return hit[req].astype(bool), adm[req].astype(bool), per, adm[at].astype(bool), copied[at].astype(bool)


def decisions(trace, cache, acc: Accesses | None = None, cacheable: np.ndarray | None = None) -> tuple:
    """The requests of `trace` and, per request, whether it hit and whether it was admitted (n,) bool: what
    predict() costs token by token; and {(chunk, layer): experts a prefetch copied in for it} (with prefetch)."""
    acc = acc if acc is not None else accesses(trace, cacheable=cacheable)
    counts = cache.hot_counts(trace) if cache.policy == "static" else None
    rows = prefetches(trace, cache, cacheable=cacheable)
    hit, admitted, _, _, copied = decide(acc, cache, counts, rows)
    early: dict[tuple, int] = {}
    if rows is not None and copied.any():
        group, n_copied = np.unique(rows[copied, 0] * acc.n_layer + rows[copied, 1], return_counts=True)
        early = {(int(g // acc.n_layer), int(g % acc.n_layer)): int(k) for g, k in zip(group, n_copied)}
    return acc, hit, admitted, early


def steps(acc: Accesses, cache, counts, rows: np.ndarray) -> tuple:
    """`decide`'s plain-Python twin: policies.py's objects stepped one request at a time, each prefetch's inserts
    (rows (chunk, layer, expert), `as_rows`) before the first request at or after its (chunk, layer). Per
    request (n,) bool hit, admitted, evicted; per insert (M,) bool admitted, evicted, copied (admitted and not
    evicted by a later insert of the same prefetch)."""
    part, _ = partitions(acc, cache)
    pols = cache.policies(acc.n_layer, acc.n_expert, counts)
    n, E, M = len(acc), acc.n_expert, len(rows)
    hit, adm, ev = (np.zeros(n, bool) for _ in range(3))
    ins_adm, ins_ev, copied = (np.zeros(M, bool) for _ in range(3))
    t, j = 0, 0

    def prefetch() -> None:                   # the inserts of one (chunk, layer), from row j on
        nonlocal t, j
        c, il = int(rows[j, 0]), int(rows[j, 1])
        new: dict[int, int] = {}              # key -> its row, admitted by this prefetch
        while j < M and rows[j, 0] == c and rows[j, 1] == il:
            key = il * E + int(rows[j, 2])
            ins_adm[j], evicted = pols[il if cache.per_layer else 0].insert(key, t, c)
            ins_ev[j] = evicted >= 0
            if evicted in new:
                copied[new.pop(evicted)] = False
            if ins_adm[j]:
                new[key] = j
                copied[j] = True
            t, j = t + 1, j + 1
    for i, (k, s, nx, p) in enumerate(zip(acc.keys.tolist(), acc.step.tolist(), acc.nxt.tolist(), part.tolist())):
        while j < M and (rows[j, 0], rows[j, 1]) <= (s, k // E):
            prefetch()
        h, a, evicted = pols[p].access(k, t, s, nx)
        t += 1
        hit[i], adm[i], ev[i] = h, a, evicted >= 0
    while j < M:
        prefetch()
    return hit, adm, ev, ins_adm, ins_ev, copied


__all__ = ["Accesses", "accesses", "cacheable", "chunks", "decisions", "next_use_numpy", "partitions", "prefetches",
           "steps", "as_rows", "decide", "merge"]
