"""Expert-cache policies, one small class each, all with one interface (the plain-Python twins of
moert/dynamic/kernels.py, and what the runtime cache steps through online).

    p = POLICIES["lru"](slots=8)
    hit, admitted, evicted = p.access(key, t, step, nxt)

A policy holds at most `slots` keys (a key is one expert of one layer: layer * E + expert). `access` is one
request: t the request's index in the whole access sequence (unique, increasing), step the trace chunk it
belongs to (a decode token is one), nxt the index of the next request of the same key (`NEVER` if none; only
Belady reads it). It returns whether the key was resident (a hit), whether a miss was admitted (its bytes
copied to the cache), and the key evicted to make room (-1: none). Every policy starts empty.

  lru     evict the least recently requested resident.
  lfu     evict the resident requested least often over the whole history ("perfect" LFU: counts survive
          eviction); ties: the least recently requested.
  lfru    LRFU (D. Lee et al., "LRFU: a spectrum of policies that subsumes the least recently used and least
          frequently used policies", IEEE Trans. Computers 50(12), 2001): each key's combined recency and
          frequency CRF = sum over its past requests of 2^(-lam (now - step_i)); evict the smallest CRF.
          lam = 1 / half_life (in trace steps, i.e. tokens in decode): lam -> 0 is LFU, large lam is LRU.
          Kept in log2 space: s = log2 CRF + lam * step_last, so s_new = log2(2^(lam step) + 2^s_old).
  static  a fixed set (a trace's hottest experts: `strategies.hot_experts`' choice); a member is admitted on
          its first request and never evicted, nothing else is ever admitted (a miss runs where the plan put
          the expert). Starting empty like the others keeps "Belady >= every policy" a theorem.
  belady  the offline optimum (Belady's MIN with bypass): on a miss with the cache full, of the residents and
          the requested key drop the one requested farthest in the future; if that is the requested key it is
          not admitted. Needs the future, so it exists for replays only.
"""

from __future__ import annotations

import math

from moert.errors import MoertError

NEVER = 1 << 62                  # nxt of a request with no later request of the same key


def log2_add(a: float, b: float) -> float:
    """log2(2^a + 2^b) without overflow (the LRFU update; kernels.py uses the same expression)."""
    hi, lo = (a, b) if a >= b else (b, a)
    return hi + math.log2(1.0 + 2.0 ** (lo - hi))


class CacheError(MoertError, ValueError):
    """An expert cache that cannot be built or used as asked."""


class Policy:
    """A cache of `slots` keys; subclasses say which resident to evict (`victim`) and whether to admit."""

    name = ""
    online = True                # False: needs the future (nxt), replays only

    def __init__(self, slots: int):
        self.slots = int(slots)
        self.resident: set[int] = set()

    def access(self, key: int, t: int, step: int, nxt: int) -> tuple[bool, bool, int]:
        """One request: (hit, admitted, evicted key or -1)."""
        self.touch(key, t, step, nxt)
        if key in self.resident:
            return True, False, -1
        if not self.admit(key, nxt):
            return False, False, -1
        evicted = -1
        if len(self.resident) >= self.slots:
            evicted = self.victim()
            if evicted == key:               # belady: the requested key is the one to drop (bypass)
                return False, False, -1
            self.resident.discard(evicted)
        self.resident.add(key)
        return False, True, evicted

    def insert(self, key: int, t: int, step: int) -> tuple[bool, int]:
        """A prefetch: `key` brought in before it is requested. Not a request (no hit or miss in the stats),
        but the policy's bookkeeping takes it as a reference (recency, frequency): a resident key just looks
        used again; otherwise it is admitted as a miss would be, evicting the policy's victim. Returns
        (admitted, evicted key or -1)."""
        self.touch(key, t, step, NEVER)
        if key in self.resident or not self.admit(key, NEVER):
            return False, -1
        evicted = -1
        if len(self.resident) >= self.slots:
            evicted = self.victim()
            if evicted == key:               # belady: the inserted key is the one to drop (bypass)
                return False, -1
            self.resident.discard(evicted)
        self.resident.add(key)
        return True, evicted

    def touch(self, key: int, t: int, step: int, nxt: int) -> None:
        """Bookkeeping of a request (before the hit test)."""

    def state(self) -> dict:
        """A copy of everything the policy keeps (`restore` puts it back: a forward that fails changes nothing)."""
        return {k: v.copy() if isinstance(v, (dict, set)) else v for k, v in vars(self).items()}

    def restore(self, state: dict) -> None:
        vars(self).update(state)

    def admit(self, key: int, nxt: int) -> bool:
        return self.slots > 0

    def victim(self) -> int:
        raise NotImplementedError


class LRU(Policy):
    name = "lru"

    def __init__(self, slots: int):
        super().__init__(slots)
        self.last: dict[int, int] = {}

    def touch(self, key, t, step, nxt):
        self.last[key] = t

    def victim(self):
        return min(self.resident, key=lambda k: self.last[k])


class LFU(Policy):
    name = "lfu"

    def __init__(self, slots: int):
        super().__init__(slots)
        self.count: dict[int, int] = {}
        self.last: dict[int, int] = {}

    def touch(self, key, t, step, nxt):
        self.count[key] = self.count.get(key, 0) + 1
        self.last[key] = t

    def victim(self):
        # the key just requested has count >= 1 and last = now: never below a resident of equal count
        return min(self.resident, key=lambda k: (self.count[k], self.last[k]))


class LFRU(Policy):
    """LRFU (Lee et al. 2001), with half_life in trace steps (default 32)."""

    name = "lfru"

    def __init__(self, slots: int, half_life: float = 32.0):
        super().__init__(slots)
        self.lam = 1.0 / float(half_life)
        self.score: dict[int, float] = {}
        self.last: dict[int, int] = {}

    def touch(self, key, t, step, nxt):
        now = self.lam * step
        self.score[key] = log2_add(now, self.score[key]) if key in self.score else now
        self.last[key] = t

    def victim(self):
        return min(self.resident, key=lambda k: (self.score[k], self.last[k]))


class Static(Policy):
    """A fixed set of keys (at most `slots` of them in this cache)."""

    name = "static"

    def __init__(self, slots: int, keep: frozenset[int] = frozenset()):
        super().__init__(slots)
        self.keep = frozenset(keep)

    def admit(self, key, nxt):
        return key in self.keep


class Belady(Policy):
    name = "belady"
    online = False

    def __init__(self, slots: int):
        super().__init__(slots)
        self.next: dict[int, int] = {}
        self._key = -1

    def touch(self, key, t, step, nxt):
        self.next[key] = nxt
        self._key = key

    def victim(self):
        # farthest next request among the residents and the requested key (ties, i.e. NEVER: the largest key,
        # but the requested key first: not admitting costs nothing)
        cands = [*self.resident, self._key]
        return max(cands, key=lambda k: (self.next[k], k == self._key, k))


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (LRU, LFU, LFRU, Static, Belady)}

__all__ = ["NEVER", "POLICIES", "CacheError", "Belady", "LFRU", "LFU", "LRU", "Policy", "Static", "log2_add"]
