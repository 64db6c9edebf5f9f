"""The one thread that runs the engine's computing calls.

It runs loading (with its preamble prefill), warm-up and forward passes, so that they never run
on the event loop and never on two threads.

Why one thread, on the CPU: torch's CPU kernels run on OpenMP, which gives every thread that
starts parallel work its own team of worker threads. With more workers than CPUs, libgomp stops
spinning at a barrier, so every barrier of every op becomes a sleep and a wake-up; a model loaded
on one thread and run on another makes two teams. Loading and running on this one thread keeps
one team (bench/README.md, "Why the engine has one thread"). The offline ``score`` command runs
everything on its main thread, which is one team too.

What runs here is given by the caller as a plain function: this module knows nothing of tensors.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

R = TypeVar("R")

_Job = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], "Future[Any]"]


class EngineThread:
    """One long-lived thread for every engine call that computes.

    ``call(fn, ...)`` runs ``fn`` there and waits (from synchronous code: loading); ``run(fn, ...)``
    hands ``fn`` to the thread at once and returns an asyncio future to await from the event loop
    (forward passes). Calls run one at a time, in submission order. ``close()`` (or leaving the
    ``with`` block) ends the thread once the call in progress returns; calls not started are
    cancelled. The thread is a daemon: Ctrl-C during a model load exits without waiting for it.
    """

    def __init__(self, name: str = "spinf-engine") -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, kwargs, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # handed to the caller through the future
                future.set_exception(exc)

    def submit(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> Future[R]:
        """Queue ``fn(*args, **kwargs)``; its ``concurrent.futures.Future``. Raises ``RuntimeError``
        after :meth:`close`."""
        if self._closed:
            raise RuntimeError("the engine thread is closed")
        future: Future[R] = Future()
        self._jobs.put((fn, args, kwargs, future))
        return future

    def call(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``fn(*args, **kwargs)`` on the engine thread; blocks until it returns (or raises)."""
        return self.submit(fn, *args, **kwargs).result()

    def run(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> asyncio.Future[R]:
        """Submit ``fn(*args, **kwargs)`` to the engine thread now (not when the caller next
        awaits) and return its future for the running event loop."""
        return asyncio.wrap_future(self.submit(fn, *args, **kwargs), loop=asyncio.get_running_loop())

    @property
    def native_id(self) -> int | None:
        """The thread's native id (for per-thread CPU accounting)."""
        return self._thread.native_id

    def close(self) -> None:
        """Stop taking calls; cancel those not started; the thread ends after the current one."""
        if self._closed:
            return
        self._closed = True
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[3].cancel()
        self._jobs.put(None)

    def __enter__(self) -> EngineThread:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
