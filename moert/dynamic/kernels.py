"""The replay's fast path: every policy of moert/dynamic/policies.py over a whole access sequence in one Numba
call. policies.py's classes are the twins (same decisions, same ties); tests/test_dynamic.py compares them.

    hit, admitted, copied, per_layer = run(kind, keys, step, nxt, part, n_parts, slots, n_keys, keep, lam,
                                           layer, L, ins, grp)
    nxt = next_use(keys, n_keys)          (twin: replay.next_use_numpy)

n entries: keys (n,) (layer * E + expert), step (n,) trace chunk, nxt (n,) index of the key's next request
(policies.NEVER: none), part (n,) the cache each goes to (its layer with per-layer slots, else 0), layer (n,)
its layer; ins (n,) 1 for a prefetch's insert (Policy.insert: bookkept as a reference, admitted without being
a request), 0 for a request; grp (n,) an insert's prefetch (its chunk and layer), -1 for a request. Returns
per entry hit, admitted and copied (an insert admitted and not evicted by a later insert of its prefetch)
(n,) uint8, and per layer (4, L) int64: hits, admissions of requests, evictions, admissions of inserts (the
aggregation in the loop: a replay's bincounts would cost more than the policy).
(requests.decide merges the requests and inserts; requests.steps, stepping policies.py's objects, is its twin.)
Each cache is a table of `slots` residents with a victim order (pa, pb) per slot, the smallest evicted first:
  lru (last, 0), lfu (count, last), lfru (CRF score, last), belady (-next, -key); static never evicts.
A hit updates its slot's order in O(1) (slot_of); a miss into a full cache scans the table (O(slots),
contiguous).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

KINDS = {"lru": 0, "lfu": 1, "lfru": 2, "static": 3, "belady": 4}


@njit(cache=True)
def _order(kind, key, i, count, score, nxt):
    """The victim order (pa, pb) of `key` just requested at index i (smaller goes first)."""
    if kind == 0:
        return float(i), 0
    if kind == 1:
        return float(count), i
    if kind == 2:
        return score, i
    return -float(nxt), -key


@njit(cache=True)
def run(kind, keys, step, nxt, part, n_parts, slots, n_keys, keep, lam, layer, n_layer, ins, grp):
    n = keys.shape[0]
    hit = np.zeros(n, np.uint8)
    admitted = np.zeros(n, np.uint8)
    copied = np.zeros(n, np.uint8)
    per_layer = np.zeros((4, n_layer), np.int64)                # hits, admissions, evictions, insert admissions
    admitted_at = np.full(n_keys, -1, np.int64)                   # the entry that admitted each resident
    width = max(slots, 1)
    table = np.full((n_parts, width), -1, np.int64)               # the residents of each cache
    pa = np.zeros((n_parts, width), np.float64)                   # their victim order, first part
    pb = np.zeros((n_parts, width), np.int64)                     # and second
    fill = np.zeros(n_parts, np.int64)
    slot_of = np.full(n_keys, -1, np.int64)
    count = np.zeros(n_keys, np.int64)
    score = np.zeros(n_keys, np.float64)
    for i in range(n):
        key, p = keys[i], part[i]
        count[key] += 1
        if kind == 2:                                             # LRFU: s = log2(2^(lam step) + 2^s)
            now = lam * step[i]
            if count[key] == 1:
                score[key] = now
            else:
                hi, lo = (now, score[key]) if now >= score[key] else (score[key], now)
                score[key] = hi + math.log2(1.0 + 2.0 ** (lo - hi))
        a, b = _order(kind, key, i, count[key], score[key], nxt[i])
        s = slot_of[key]
        if s >= 0:
            if ins[i] == 0:
                hit[i] = 1
                per_layer[0, layer[i]] += 1
            pa[p, s], pb[p, s] = a, b
            continue
        if slots == 0 or (kind == 3 and not keep[key]):
            continue
        if fill[p] < slots:
            s = fill[p]
            fill[p] += 1
        else:
            s = 0
            for j in range(1, slots):
                if pa[p, j] < pa[p, s] or (pa[p, j] == pa[p, s] and pb[p, j] < pb[p, s]):
                    s = j
            if kind == 4 and a <= pa[p, s]:                      # belady: the requested key is farthest: bypass
                continue
            v = table[p, s]
            slot_of[v] = -1
            per_layer[2, layer[i]] += 1
            j = admitted_at[v]
            if ins[i] == 1 and j >= 0 and ins[j] == 1 and grp[j] == grp[i]:
                copied[j] = 0                                     # evicted by its own prefetch: never copied
        table[p, s] = key
        pa[p, s], pb[p, s] = a, b
        slot_of[key] = s
        admitted_at[key] = i
        admitted[i] = 1
        if ins[i] == 1:
            copied[i] = 1
            per_layer[3, layer[i]] += 1
        else:
            per_layer[1, layer[i]] += 1
    return hit, admitted, copied, per_layer


@njit(cache=True)
def next_use(keys, n_keys, never):
    """(n,) the index of each request's next request of the same key (never: none)."""
    n = keys.shape[0]
    out = np.empty(n, np.int64)
    seen = np.full(n_keys, never, np.int64)
    for i in range(n - 1, -1, -1):
        out[i] = seen[keys[i]]
        seen[keys[i]] = i
    return out
