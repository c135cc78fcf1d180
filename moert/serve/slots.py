"""`moert serve -np N`: N slots generating at once, their tokens decoded together (moert/batch.py).

    batcher = Batcher(model, n_slots)          # its thread runs every forward: one per step, all slots' tokens
    slot    = SlotModel(model, seq, batcher)   # what generate.TextStream sees of slot i: a Model of its own

Each slot is a worker thread running the ordinary generation loop (moert/text/generate.py: sampling, stop strings,
logprobs, a reused prompt prefix) against its SlotModel; SlotModel.forward hands its tokens to the Batcher and
waits. The Batcher waits until every slot inside a generation has handed in its next tokens (a new prompt, or
one sampled token), runs Model.forward_batch over all of them once, and hands each slot its logits. So a step
costs one forward whatever the number of active slots, and an expert that several slots' tokens chose is read
once (the batching llama-server's -np does with one llama_decode per step).
"""

from __future__ import annotations

import threading

import numpy as np


class _Ask:
    """One slot's tokens waiting for the next forward, and what it gave back."""

    def __init__(self, seq, tokens):
        self.seq, self.tokens = seq, tokens
        self.logits = self.error = None
        self.done = False


class Batcher:
    """Runs the forwards of all slots: one Model.forward_batch per step over every active slot's tokens."""

    def __init__(self, model, threads: int):
        self.model, self._threads = model, threads
        self._cond = threading.Condition()
        self._asks: list[_Ask] = []
        self.active = 0                  # slots inside a generation: a step waits for each one's tokens
        self.steps = 0                   # forwards run
        self.busy_slots = 0              # slots in them, summed (llama-server's n_busy_slots_per_decode)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="moert-serve-batcher", daemon=True)
        self._thread.start()

    def enter(self) -> None:
        with self._cond:
            self.active += 1

    def leave(self) -> None:
        with self._cond:
            self.active -= 1
            self._cond.notify_all()

    def forward(self, seq, tokens) -> np.ndarray:
        """From a slot's thread: the logits (1, V) after `tokens`, once the next step has run them."""
        ask = _Ask(seq, tokens)
        with self._cond:
            self._asks.append(ask)
            self._cond.notify_all()
            while not ask.done:
                self._cond.wait()
        if ask.error is not None:
            raise ask.error
        return ask.logits

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        import numba

        numba.set_num_threads(self._threads)      # numba's setting is per thread: this one runs the model
        while True:
            with self._cond:
                while not self._closed and (not self._asks or len(self._asks) < self.active):
                    self._cond.wait()
                if self._closed:
                    for a in self._asks:
                        a.error, a.done = RuntimeError("the server is shutting down"), True
                    self._cond.notify_all()
                    return
                asks, self._asks = self._asks, []
            try:
                logits = self.model.forward_batch([(a.seq, a.tokens) for a in asks])     # (len(asks), V)
                for i, a in enumerate(asks):
                    a.logits = logits[i:i + 1]
            except BaseException as e:            # a slot's error is its own request's: hand it back
                for a in asks:
                    a.error = e
            self.steps += 1
            self.busy_slots += len(asks)
            with self._cond:
                for a in asks:
                    a.done = True
                self._cond.notify_all()


class SlotModel:
    """One slot as generate() sees a model: the model's vocabulary and text API, its own context (a
    batch.Sequence), forwards through the Batcher in chunks of at most n_batch tokens."""

    clock = None                          # wall-clock timings (a virtual clock times one whole forward)

    def __init__(self, model, seq, batcher: Batcher):
        self.model, self.seq, self.batcher = model, seq, batcher

    def __getattr__(self, name):          # tokenize, detokenize, tokenizer, eos_ids, n_vocab, stats, ...
        return getattr(self.model, name)

    @property
    def context_size(self) -> int:
        return self.seq.n_ctx

    @property
    def position(self) -> int:
        return self.seq.position

    @position.setter
    def position(self, value: int) -> None:
        if not 0 <= value <= self.seq.position:
            raise ValueError(f"position {value} is outside [0, {self.seq.position}]")
        self.seq.position = value

    @property
    def context_tokens(self) -> list[int]:
        return self.seq.context_tokens

    def reset(self) -> None:
        self.seq.reset()

    def forward(self, tokens, last_only: bool = False) -> np.ndarray:
        """The logits (1, V) after tokens (generation only asks for the last position's)."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = self.model.n_batch
        logits = None
        for s in range(0, len(tokens), n):
            logits = self.batcher.forward(self.seq, tokens[s:s + n])
        return logits


__all__ = ["Batcher", "SlotModel"]
