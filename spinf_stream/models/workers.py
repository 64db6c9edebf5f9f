"""The CPU engine's compute threads.

A fixed set of workers, each running every torch op with one
intra-op thread, over independent units of work (row chunks, messages' attention, LM-head tiles).

Why: a vendor GEMM run with several threads splits its work by the thread count, and its bits
follow the split. One thread per op makes each op's order of operations a function of its shapes
alone; the parallelism is ours, across units whose results do not depend on which worker, or how
many, computed them. ``docs/invariance.md`` gives the rule.

A new thread does not inherit torch's thread setting for MKL, so every worker sets it itself;
:func:`spinf_stream.models.libraries.blas_threads` reads it back, and the bits probe checks it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from .blocks import Scratch

T = TypeVar("T")
R = TypeVar("R")


class ComputePool:
    """``threads`` worker threads, each with one torch intra-op thread and its own
    :class:`~spinf_stream.models.blocks.Scratch` buffers.

    Args:
        threads: workers (>= 1); the units of one :meth:`map` run on up to this many CPUs.
    Raises:
        ValueError: ``threads < 1``.
    """

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"compute threads must be >= 1, got {threads}")
        self.threads = threads
        self._local = threading.local()
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="spinf-compute", initializer=self._start_worker)

    def _start_worker(self) -> None:
        # Measured with MKL: ``[64, 896] @ [896, 896]`` gives other bits with 1 thread than with 2;
        # ``torch.get_num_threads()`` answers 1 in a fresh thread whose MKL still runs 2 threads.
        torch.set_num_threads(1)
        self._local.scratch = Scratch()

    def _call(self, fn: Callable[[T, Scratch], R], item: T) -> R:
        with torch.inference_mode():
            return fn(item, self._local.scratch)

    def map(self, fn: Callable[[T, Scratch], R], items: Sequence[T]) -> list[R]:
        """``[fn(item, scratch) for item in items]``, the items spread over the workers (each
        item on one worker, with that worker's scratch buffers); results in ``items`` order.
        An exception in any item is raised here after the others finish."""
        if not items:
            return []
        futures = [self._executor.submit(self._call, fn, it) for it in items]
        return [f.result() for f in futures]

    def on_each_worker(self, fn: Callable[[], R]) -> list[R]:
        """``fn()`` once on every worker (for checks of per-thread settings), in worker order of
        arrival. Blocks the workers on a barrier so that each runs exactly one call."""
        barrier = threading.Barrier(self.threads)

        def one(_: int, __: Scratch) -> R:
            barrier.wait(timeout=30)
            return fn()

        return self.map(one, range(self.threads))

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> ComputePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
