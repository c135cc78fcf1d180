"""The CPU's threads: how many the kernels (Numba) and NumPy's BLAS use (-t, threads=)."""

from __future__ import annotations

from moert.errors import check_int


def set_threads(n: int) -> int:
    """-t / threads=: Numba's kernel threads AND the BLAS pool behind NumPy's matmul (both spin-wait, so
    leaving BLAS at every core oversubscribes the CPU). Capped at the cores Numba saw; returns what was set."""
    import numba
    from threadpoolctl import threadpool_limits

    check_int("threads", n, 1)
    n = min(n, numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(n)
    threadpool_limits(limits=n)
    return n


class StallGuard:
    """A model's decode steps on several threads, watched for stalls: a parallel region waiting for a worker the
    OS took off its core (another process busy on it). A stalled step sends the next ones to one thread; several
    threads are tried again after a backoff that doubles while they keep stalling (8 steps, up to 128) and is
    back to 8 after a clean step. A step is stalled when it takes over 3x the fastest step on several threads
    (+0.2 ms) or 1.5x the fastest on one thread; the second step ever runs on one thread to know that. Minima
    fade by 0.2% a step (the context grows, the machine changes). bench/busy.py measures it."""

    STALL, SLACK, SLOWER, FADE = 3.0, 2e-4, 1.5, 1.002
    MIN_BACKOFF, MAX_BACKOFF = 8, 128
    JUMP = 64                 # tokens: a step this far from where the last one left off starts afresh (`at`)

    def __init__(self) -> None:
        self.steps = 0                        # decode steps seen
        self.wait = 0                         # steps left on one thread
        self.backoff = self.MIN_BACKOFF       # steps on one thread after the next stall
        self.fast_n = self.fast_1 = float("inf")
        self.stalls = 0                       # stalled steps seen (for benchmarks and tests)
        self.one_steps = 0                    # steps it ran on one thread (the probe and the backoffs)
        self.next = None                      # the position the next step continues at

    def at(self, position: int) -> None:
        """A decode step at `position`. After a jump of over JUMP tokens (a prompt, a rewind, another conversation)
        the guard starts afresh, the probe too: attention's time grows with the depth, so against a minimum taken
        near the start of the context every step deep in it would read as a stall and stay on one thread."""
        if self.next is not None and abs(position - self.next) > self.JUMP:
            self.steps, self.wait, self.backoff = 0, 0, self.MIN_BACKOFF
            self.fast_n = self.fast_1 = float("inf")
        self.next = position + 1

    def one_thread(self) -> bool:
        """Whether the next decode step runs on one thread."""
        return self.wait > 0 or self.steps == 1

    def step(self, seconds: float, one: bool) -> None:
        """Count a decode step that took `seconds`, on one thread or on several."""
        self.steps += 1
        self.fast_n, self.fast_1 = self.fast_n * self.FADE, self.fast_1 * self.FADE
        if one:
            self.one_steps += 1
            self.fast_1 = min(self.fast_1, seconds)
            self.wait = max(0, self.wait - 1)
            return
        if seconds > self.STALL * self.fast_n + self.SLACK or seconds > self.SLOWER * self.fast_1:
            self.stalls += 1
            self.wait, self.backoff = self.backoff, min(2 * self.backoff, self.MAX_BACKOFF)
        else:
            self.backoff = self.MIN_BACKOFF
        self.fast_n = min(self.fast_n, seconds)


class one_kernel_thread:
    """`with one_kernel_thread(on):` Numba's kernels on one thread inside when `on` (this Python thread's
    setting, put back after), else nothing changes."""

    __slots__ = ("on", "before")

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        if self.on:
            import numba

            self.before = numba.get_num_threads()
            numba.set_num_threads(1)

    def __exit__(self, *exc):
        if self.on:
            import numba

            numba.set_num_threads(self.before)
