"""Per-question plots of ``evaluate`` and ``calibrate`` (matplotlib, Agg backend, PNG).

- ``<question>.reliability.png``: reliability diagram (Guo et al. 2017, fig. 1): accuracy of the
  top label against its confidence in 15 equal-width bins, raw and calibrated side by side, with
  the ECE and the rows per bin.
- ``<question>.histogram.png``: how the probabilities spread: for two choices, the first choice's
  probability split by the right choice; for more, the top label's confidence split by right and
  wrong answers.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from spinf_stream.quality import ECE_BINS, expected_calibration_error

if not sys.stderr.isatty():  # "building the font cache" once per machine: chatter in a pipe or a log
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _reliability(ax, y: np.ndarray, probabilities: np.ndarray, title: str) -> None:
    conf = probabilities.max(axis=1)
    right = probabilities.argmax(axis=1) == y
    edges = np.linspace(0.0, 1.0, ECE_BINS + 1)
    bins = np.clip(np.ceil(conf * ECE_BINS).astype(int) - 1, 0, ECE_BINS - 1)
    centers = (edges[:-1] + edges[1:]) / 2
    acc = np.full(ECE_BINS, np.nan)
    mean_conf = np.full(ECE_BINS, np.nan)
    count = np.bincount(bins, minlength=ECE_BINS)
    for m in range(ECE_BINS):
        if count[m]:
            acc[m] = right[bins == m].mean()
            mean_conf[m] = conf[bins == m].mean()
    width = 1.0 / ECE_BINS
    ax.bar(centers, np.nan_to_num(acc), width=width, edgecolor="black", color="#4c72b0", label="accuracy")
    gap_lo = np.minimum(np.nan_to_num(acc), np.nan_to_num(mean_conf))
    gap = np.abs(np.nan_to_num(acc) - np.nan_to_num(mean_conf))
    ax.bar(centers, gap, bottom=gap_lo, width=width, color="#dd8452", alpha=0.5, edgecolor="#dd8452", label="gap")
    ax.plot([0, 1], [0, 1], "k--", linewidth=1)
    for c, n in zip(centers, count):
        if n:
            ax.text(c, 0.02, str(n), ha="center", va="bottom", fontsize=6, rotation=90, color="white")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence (top label)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{title}: ECE {expected_calibration_error(y, probabilities):.3f}")
    ax.legend(loc="upper left", fontsize=8)


def reliability_diagram(path: Path, question: str, y: np.ndarray, raw: np.ndarray, calibrated: np.ndarray | None,
                        subtitle: str = "") -> Path:
    """Write the reliability diagram of one question (raw, and calibrated when given) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("raw", raw)] + ([("calibrated", calibrated)] if calibrated is not None else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    for ax, (title, p) in zip(axes[0], panels):
        _reliability(ax, y, p, title)
    fig.suptitle(f"{question} (n={len(y)}){' — ' + subtitle if subtitle else ''}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def score_histogram(path: Path, question: str, choices: Sequence[str], y: np.ndarray, raw: np.ndarray,
                    calibrated: np.ndarray | None) -> Path:
    """Write the histogram of one question's probabilities (raw, and calibrated when given)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("raw", raw)] + ([("calibrated", calibrated)] if calibrated is not None else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    edges = np.linspace(0, 1, 21)
    for ax, (title, p) in zip(axes[0], panels):
        if p.shape[1] == 2:
            first = y == 0
            ax.hist([p[first, 0], p[~first, 0]], bins=edges, stacked=True,
                    label=[f"right: {choices[0]}", f"right: {choices[1]}"], color=["#c44e52", "#4c72b0"])
            ax.set_xlabel(f"P({choices[0]})")
        else:
            right = p.argmax(axis=1) == y
            conf = p.max(axis=1)
            ax.hist([conf[right], conf[~right]], bins=edges, stacked=True, label=["answer right", "answer wrong"],
                    color=["#55a868", "#c44e52"])
            ax.set_xlabel("confidence (top label)")
        ax.set_ylabel("rows")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(f"{question} (n={len(y)})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def question_plots(directory: str | Path, question: str, choices: Sequence[str], y: np.ndarray, raw: np.ndarray,
                   calibrated: np.ndarray | None, subtitle: str = "") -> list[Path]:
    """Both plots of one question into ``directory`` (created); returns their paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    name = _safe(question)
    return [
        reliability_diagram(d / f"{name}.reliability.png", question, y, raw, calibrated, subtitle),
        score_histogram(d / f"{name}.histogram.png", question, choices, y, raw, calibrated),
    ]
