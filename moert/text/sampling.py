"""Next-token sampling: llama.cpp's samplers in llama.cpp's order (src/llama-sampler.cpp, common/sampling.cpp).

    logits --repetition, frequency, presence penalties--> --top-k--> --top-p--> --min-p--> --temperature-->
           softmax --> draw (seeded)

Each step narrows a candidate list (ids + logits, best first). top-p measures probability *before*
temperature, as llama.cpp does. Temperature 0 is greedy: the best token after the penalty. The draw
uses a NumPy Generator, so a seed gives the same tokens every run (not the same as llama.cpp's mt19937).
The frequency and presence penalties are OpenAI's: logit[j] -= count[j] * frequency + (count[j] > 0) * presence,
count[j] how often the sampler drew token j so far (the generated tokens, not the prompt's).
A Sampler asked for logprobs keeps, per drawn token, its log-probability and the `n` most likely tokens' under
the penalized logits before top-k, top-p, min-p and temperature (the model's distribution, as OpenAI reports it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moert.errors import MoertError


class SamplingError(MoertError, ValueError):
    """A sampling parameter out of range, or logits that cannot be sampled (NaN, inf, wrong shape)."""


@dataclass(frozen=True)
class SamplingParams:
    """Sampler settings; defaults are llama.cpp's (`llama-cli --help`)."""

    temperature: float = 0.8  # --temp; 0 = greedy
    top_k: int = 40  # --top-k; 0 = off
    top_p: float = 0.95  # --top-p; 1 = off
    min_p: float = 0.05  # --min-p; 0 = off
    repeat_penalty: float = 1.0  # --repeat-penalty; 1 = off
    repeat_last_n: int = 64  # --repeat-last-n; how many recent tokens the penalty looks at
    seed: int | None = None  # --seed; None (or -1, llama.cpp's spelling) = a fresh random seed
    presence_penalty: float = 0.0  # --presence-penalty; OpenAI's, in [-2, 2]; 0 = off
    frequency_penalty: float = 0.0  # --frequency-penalty; OpenAI's, in [-2, 2]; 0 = off

    def __post_init__(self):
        def bad(name: str, value, want: str):
            raise SamplingError(f"{name} = {value!r} is out of range: {want}.")

        def number(name: str, value) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                bad(name, value, "it must be a number")
            if not math.isfinite(value):
                bad(name, value, "it must be finite")
            return float(value)

        def integer(name: str, value) -> int:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                bad(name, value, "it must be an integer")
            return int(value)

        if number("temperature", self.temperature) < 0:
            bad("temperature", self.temperature, "use 0 for greedy decoding or a positive value")
        if integer("top_k", self.top_k) < 0:
            bad("top_k", self.top_k, "use 0 to turn top-k off or a positive count")
        if not 0 <= number("top_p", self.top_p) <= 1:
            bad("top_p", self.top_p, "it is a probability in [0, 1]; 1 turns top-p off")
        if not 0 <= number("min_p", self.min_p) <= 1:
            bad("min_p", self.min_p, "it is a fraction of the best token's probability in [0, 1]; 0 turns it off")
        if number("repeat_penalty", self.repeat_penalty) <= 0:
            bad("repeat_penalty", self.repeat_penalty, "it must be > 0; 1 turns it off, 1.1 is a usual value")
        if integer("repeat_last_n", self.repeat_last_n) < 0:
            bad("repeat_last_n", self.repeat_last_n, "it counts recent tokens, 0 or more")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= number(name, getattr(self, name)) <= 2:
                bad(name, getattr(self, name), "OpenAI's range is [-2, 2]; 0 turns it off")
        if self.seed is not None and integer("seed", self.seed) == -1:     # llama.cpp's LLAMA_DEFAULT_SEED
            object.__setattr__(self, "seed", None)
        elif self.seed is not None and self.seed < 0:
            bad("seed", self.seed, "use a non-negative integer, or -1 / None for a random seed")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_logits(logits: np.ndarray) -> np.ndarray:
    """The last position's logits as float32 (V,); NaN or inf is a SamplingError that says where."""
    x = np.asarray(logits)
    if x.ndim != 1 or x.size == 0:
        raise SamplingError(f"logits must be one row (n_vocab,), got shape {x.shape}; pass logits[-1] of a (T, V) "
                            f"forward output.")
    x = x.astype(np.float32, copy=False)
    bad = ~np.isfinite(x)
    if bad.any():
        where = np.flatnonzero(bad)
        raise SamplingError(f"logits contain {where.size} non-finite values (NaN/inf), first at token ids "
                            f"{where[:5].tolist()}: the forward pass overflowed or read bad weights. Check the "
                            f"model with a greedy run of a short prompt, or re-quantize / re-download it.")
    return x


def penalize(logits: np.ndarray, history: Sequence[int], penalty: float, last_n: int) -> np.ndarray:
    """Repetition penalty on the last `last_n` tokens: positive logits / penalty, others * penalty."""
    if penalty == 1.0 or last_n == 0 or len(history) == 0:
        return logits
    seen = np.unique(np.asarray(history[-last_n:], dtype=np.int64))
    seen = seen[(seen >= 0) & (seen < logits.size)]
    out = logits.copy()
    v = out[seen]
    out[seen] = np.where(v <= 0, v * penalty, v / penalty)
    return out


def penalize_counts(logits: np.ndarray, counts: dict[int, int], frequency: float, presence: float) -> np.ndarray:
    """OpenAI's penalties: logit[j] -= counts[j] * frequency + (counts[j] > 0) * presence for the drawn tokens j."""
    if not counts or (frequency == 0.0 and presence == 0.0):
        return logits
    ids = np.fromiter(counts, dtype=np.int64, count=len(counts))
    n = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
    out = logits.copy()
    out[ids] -= n * np.float32(frequency) + (n > 0) * np.float32(presence)
    return out


def sort_desc(ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidates best first; equal logits by lower id."""
    order = np.lexsort((ids, -logits))
    return ids[order], logits[order]


def top_k(ids: np.ndarray, logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best candidates, best first (k = 0: all of them, sorted)."""
    if 0 < k < ids.size:
        part = np.argpartition(-logits, k - 1)[:k]
        threshold = logits[part].min()
        # every candidate tied with the k-th best competes; lexsort then keeps the lowest ids among them
        part = np.flatnonzero(logits >= threshold)
        ids, logits = sort_desc(ids[part], logits[part])
        return ids[:k], logits[:k]
    return sort_desc(ids, logits)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities (float64) of a logits vector."""
    e = np.exp(logits.astype(np.float64) - logits.max())
    return e / e.sum()


def top_p(ids: np.ndarray, logits: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """The fewest best-first candidates whose probability reaches p (at least one). Needs sorted input."""
    if p >= 1.0:
        return ids, logits
    cum = np.cumsum(softmax(logits))
    n = int(np.searchsorted(cum, p, side="left")) + 1  # first i with cum[i] >= p, kept
    return ids[:n], logits[:n]


def min_p(ids: np.ndarray, logits: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """Candidates at least p times as probable as the best one."""
    if p <= 0.0:
        return ids, logits
    keep = logits >= logits.max() + np.float32(math.log(p))
    return ids[keep], logits[keep]


def penalized(logits: np.ndarray, history: Sequence[int], params: SamplingParams,
              counts: dict[int, int] | None = None) -> np.ndarray:
    """The checked logits (V,) after the repetition penalty (over `history`) and OpenAI's (over `counts`)."""
    x = penalize(check_logits(logits), history, params.repeat_penalty, params.repeat_last_n)  # (V,)
    return penalize_counts(x, counts or {}, params.frequency_penalty, params.presence_penalty)


def candidates(logits: np.ndarray, history: Sequence[int], params: SamplingParams,
               counts: dict[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The tokens the draw chooses from and their probabilities, after the whole chain (counts: how often each
    token was drawn so far, for the frequency and presence penalties)."""
    return _chain(penalized(logits, history, params, counts), params)


def _chain(x: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Penalized logits (V,) -> the candidates and their probabilities: greedy, or top-k, top-p, min-p, temperature."""
    if params.greedy:
        best = int(np.argmax(x))
        return np.array([best]), np.array([1.0])
    ids = np.arange(x.size)
    ids, x = top_k(ids, x, params.top_k)  # sorted best first from here on
    ids, x = top_p(ids, x, params.top_p)
    ids, x = min_p(ids, x, params.min_p)
    return ids, softmax(x / np.float32(params.temperature))


def log_softmax(x: np.ndarray) -> np.ndarray:
    """Log-probabilities (float64) of a logits vector."""
    z = x.astype(np.float64) - x.max()
    return z - np.log(np.exp(z).sum())


@dataclass(frozen=True)
class TokenLogprob:
    """A drawn token's log-probability and the `n` most likely tokens' (id, logprob), best first."""

    id: int
    logprob: float
    top: list[tuple[int, float]]


class Sampler:
    """Draws next tokens with fixed parameters and its own seeded random generator; counts what it drew (for the
    frequency and presence penalties) and, with logprobs=n (0 or more), keeps each draw's TokenLogprob."""

    def __init__(self, params: SamplingParams | None = None, logprobs: int | None = None):
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)
        self.counts: dict[int, int] = {}           # token id -> times drawn
        self.n_logprobs = logprobs
        self.logprobs: list[TokenLogprob] = []     # one per draw when n_logprobs is not None

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """One token id from the last position's logits (V,), given the tokens so far."""
        x = penalized(logits, history, self.params, self.counts)                     # (V,)
        ids, probs = _chain(x, self.params)
        if ids.size == 1:
            tok = int(ids[0])
        else:
            u = self.rng.random()
            i = int(np.searchsorted(np.cumsum(probs), u * probs.sum(), side="right"))
            tok = int(ids[min(i, ids.size - 1)])
        self.counts[tok] = self.counts.get(tok, 0) + 1
        if self.n_logprobs is not None:
            lp = log_softmax(x)                                                       # (V,)
            n = min(self.n_logprobs, lp.size)
            top = np.argpartition(-lp, n - 1)[:n] if n else np.zeros(0, np.int64)
            top = top[np.lexsort((top, -lp[top]))]                                    # best first, ties by id
            self.logprobs.append(TokenLogprob(tok, float(lp[tok]), [(int(j), float(lp[j])) for j in top]))
        return tok
