"""Softmax over a question's choices: the one implementation records, calibration and metrics share.

Row by row in plain Python floats, ``math.exp`` and a correctly rounded sum (``math.fsum``): a
row's bits depend on its own numbers only (not on the other rows, the array's layout or numpy's
SIMD code path), so the records' ``probability`` and ``calibrated`` are the same bits wherever
they are computed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def softmax_row(z: Sequence[float]) -> list[float]:
    """``exp(z_j - max z) / fsum_i exp(z_i - max z)`` of one row of floats (float64; ``k >= 1``)."""
    top = max(z)
    e = [math.exp(x - top) for x in z]
    total = math.fsum(e)
    return [x / total for x in e]


def softmax(z: np.ndarray) -> np.ndarray:
    """:func:`softmax_row` of each row: float64 ``[n, k]`` → float64 ``[n, k]`` (rows sum to 1)."""
    rows = np.asarray(z, dtype=np.float64)
    return np.array([softmax_row(r) for r in rows.tolist()], dtype=np.float64).reshape(rows.shape)
