"""Threads of the service, sized to the machine: the CPU engine's compute workers take the CPUs the
process may use (affinity capped by the cgroup quota; ``OMP_NUM_THREADS`` overrides), and every
engine call that computes runs on one engine thread, in order."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from spinf_stream.device import size_cpu_threads, usable_cpus
from spinf_stream.stream.engine_thread import EngineThread
from spinf_stream.stream.service import ScoringService
from broker import FakeScorer, RunningService, fake_message, json_line, produce, run_settings, tansu, topics, wait_for  # noqa: F401

AFFINITY = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cgroup_v2(tmp_path: Path, cpu_max: str) -> Path:
    (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    return tmp_path


def cgroup_v1(tmp_path: Path, quota_us: int, period_us: int) -> Path:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(f"{period_us}\n")
    return tmp_path


def test_without_a_cpu_quota_the_usable_cpus_are_the_affinity_mask(tmp_path):
    assert usable_cpus(cgroup_v2(tmp_path, "max 100000")) == AFFINITY
    assert usable_cpus(tmp_path / "no-cgroup-here") == AFFINITY


def test_a_cgroup_v2_quota_caps_the_usable_cpus_rounded_down(tmp_path):
    assert usable_cpus(cgroup_v2(tmp_path, "150000 100000")) == min(AFFINITY, 1)  # 1.5 CPUs -> 1


def test_a_cgroup_v1_quota_caps_the_usable_cpus(tmp_path):
    assert usable_cpus(cgroup_v1(tmp_path, 100000, 100000)) == 1


def test_a_cgroup_v1_quota_of_minus_one_is_no_limit(tmp_path):
    assert usable_cpus(cgroup_v1(tmp_path, -1, 100000)) == AFFINITY


def test_a_quota_below_one_cpu_still_leaves_one_thread(tmp_path):
    assert usable_cpus(cgroup_v2(tmp_path, "20000 100000")) == 1


def test_the_compute_workers_are_the_usable_cpus(tmp_path):
    """What torch picks from a host's 64 cores inside a 1-CPU container is not what we take."""
    assert size_cpu_threads(environ={}, cgroup_root=cgroup_v2(tmp_path, "100000 100000")) == 1
    assert size_cpu_threads(environ={}, cgroup_root=cgroup_v2(tmp_path, "max 100000")) == AFFINITY


def test_omp_num_threads_overrides_the_sizing(tmp_path):
    got = size_cpu_threads(environ={"OMP_NUM_THREADS": "3"}, cgroup_root=cgroup_v2(tmp_path, "100000 100000"))
    assert got == 3


@pytest.mark.parametrize("bad", ["0", "-2", "many"])
def test_a_bad_omp_num_threads_is_refused_naming_the_variable(bad):
    with pytest.raises(ValueError, match=f"OMP_NUM_THREADS={bad!r}: use a positive number of threads"):
        size_cpu_threads(environ={"OMP_NUM_THREADS": bad})


def test_the_engine_thread_runs_calls_in_order_on_one_thread():
    seen: list[tuple[int, int | None]] = []
    with EngineThread() as engine:
        for i in range(5):
            engine.call(lambda i=i: seen.append((i, threading.get_native_id())))
        thread = engine.native_id

        async def go() -> list[int]:
            futures = [engine.run(lambda i=i: (seen.append((10 + i, threading.get_native_id())), i)[1]) for i in range(5)]
            return list(await asyncio.gather(*futures))

        assert asyncio.run(go()) == list(range(5))
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]
    assert {tid for _, tid in seen} == {thread} != {threading.get_native_id()}


def test_the_engine_thread_hands_an_exception_to_the_caller():
    with EngineThread() as engine, pytest.raises(ZeroDivisionError):
        engine.call(lambda: 1 / 0)


def test_a_closed_engine_thread_refuses_calls():
    engine = EngineThread()
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.call(lambda: None)


class ThreadRecordingScorer(FakeScorer):
    def __init__(self) -> None:
        super().__init__()
        self.run_threads: list[int] = []

    def run(self, prepared: Any) -> list[Any]:
        self.run_threads.append(threading.get_native_id())
        return super().run(prepared)


@pytest.mark.broker
def test_the_service_runs_forward_passes_on_the_engine_thread_it_is_given(topics):
    t = topics(1)
    produce(t, [json_line({"text": f"m{i}"}) for i in range(20)])
    scorer = ThreadRecordingScorer()

    with EngineThread() as engine:
        loaded_on = engine.call(threading.get_native_id)  # where a model would be loaded

        async def go() -> None:
            svc = ScoringService(run_settings(t, max_batch_messages=5), scorer, make_message=fake_message, engine_thread=engine)
            async with RunningService(svc) as s:
                await wait_for(lambda: s.stats.acked >= 20)

        asyncio.run(go())
        assert engine.call(lambda: "still open") == "still open"  # the service leaves a given thread open
    assert len(scorer.run_threads) >= 4
    assert set(scorer.run_threads) == {loaded_on}
