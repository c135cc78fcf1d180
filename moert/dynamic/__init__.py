"""Dynamic expert placement: caches that move experts while the model runs, replayed over routing traces.

    cache.py      ExpertCache: device, slots (per layer or a pool), policy, prefetch
    policies.py   lru, lfu, lfru (LRFU), static (a trace's hot set), belady (the offline optimum)
    requests.py   the requests a cache sees over a trace (per chunk and layer; only cacheable experts ask), answers
    replay.py     replay(trace, cache) -> Replay: hits / misses per layer without the model; sweep()
    runtime.py    the cache in a running model (moert.load(..., expert_cache=)); m.stats.cache
    predict.py    moert.predict(plan, hw, cache=, trace=): hits on the GPU, misses on the CPU, copies, prefetch
    kernels.py    the replay's Numba fast path (policies.py's classes are its twins)
    formats.py    traces of other tools (llama.cpp's llama-moe-trace CSVs) read as moert.Trace; moert's format

Part of the runtime (runtime.py runs a cache inside a model); predict.py and compare.py price caches with the
cost model (moert/cost/), the only modules here that import it.
"""

from moert.dynamic.cache import CacheError, ExpertCache, expert_bytes
from moert.dynamic.policies import POLICIES
from moert.dynamic.replay import Replay, replay, sweep
from moert.dynamic.requests import Accesses, accesses, cacheable

__all__ = ["POLICIES", "Accesses", "CacheError", "ExpertCache", "Replay", "accesses", "cacheable", "expert_bytes",
           "replay", "sweep"]
