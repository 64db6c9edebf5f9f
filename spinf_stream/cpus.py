"""How many CPUs this process may use, and so how many compute workers the CPU engine runs.
Standard library only: imported by the command line before torch."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path


def _cgroup_cpu_quota(root: Path) -> float | None:
    """CPUs the cgroup may use per period (``quota / period``), or ``None`` when unlimited or unknown.
    cgroup v2 ``cpu.max`` (``"max 100000"`` or ``"150000 100000"``), else v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` (quota ``-1`` = unlimited). Read where a container sees its own group."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def usable_cpus(cgroup_root: str | Path = "/sys/fs/cgroup") -> int:
    """CPUs this process may use: its affinity mask (``os.sched_getaffinity``; ``os.cpu_count``
    where that does not exist), capped by its cgroup's CPU quota rounded down, at least 1.

    The quota matters in containers: a pod limited to 2 CPUs on a 64-core node still sees 64 CPUs
    in its affinity mask, and 64 compute threads throttled to 2 CPUs' worth of time would stall
    each other at every barrier.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_quota(Path(cgroup_root))
    if quota is not None:
        cpus = min(cpus, math.floor(quota))
    return max(1, cpus)


def compute_threads(*, environ: Mapping[str, str] | None = None, cgroup_root: str | Path = "/sys/fs/cgroup") -> int:
    """The CPU engine's compute workers: ``OMP_NUM_THREADS`` when it is set to a positive integer
    (the standard knob), else :func:`usable_cpus`. Each worker runs torch with one intra-op
    thread, so scores do not depend on this number (``docs/invariance.md``).

    Raises:
        ValueError: ``OMP_NUM_THREADS`` set to something other than a positive integer.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get("OMP_NUM_THREADS", "").strip()
    if raw:
        try:
            n = int(raw.split(",")[0])
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"OMP_NUM_THREADS={raw!r}: use a positive number of threads")
        return n
    return usable_cpus(cgroup_root)
