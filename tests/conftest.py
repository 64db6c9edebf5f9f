"""Shared fixtures: real models (from their PyPI packages, converted once into the cache),
tiny random-weight models of each family, and real messages from ``../shared/data``
(``$SPINF_DATA_DIR``): tests that need them skip on a bare clone and fail under ``CI``."""

from __future__ import annotations

import os
import sys
from functools import cache
from pathlib import Path

import orjson
import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The Triton kernels run on the CPU in Triton's interpreter (CI has no GPU); the mode is fixed
# when triton is first imported, so it is set before any test module imports it. With a GPU,
# run with TRITON_INTERPRET=0 to test the kernels on it.
os.environ.setdefault("TRITON_INTERPRET", "1")


def data_dir() -> Path:
    """``$SPINF_DATA_DIR`` or ``../shared/data`` beside the repo."""
    return Path(os.environ.get("SPINF_DATA_DIR", REPO.parent / "shared" / "data"))


def in_ci() -> bool:
    """``CI`` is set (and not ``false``/``0``): CI always has the data, so its absence is a failure."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_data(path: Path) -> Path:
    """``path`` under the real data sets, or skip the test saying how to run it (fail under CI)."""
    if path.exists():
        return path
    why = (
        f"{path} not found: this test needs the real labelled data sets (see README, 'Data sets'); "
        "run it with SPINF_DATA_DIR=/path/to/data (the folder holding sms_spam/, ag_news/, ...)"
    )
    if in_ci():
        pytest.fail(f"{why}; CI must have them (CI is set)")
    pytest.skip(why)


@cache
def dataset(name: str, n: int) -> tuple[dict, ...]:
    """The first ``n`` rows of ``<data dir>/<name>/dev.jsonl`` (a fixed pseudo-random order).

    Skips the test when the data is not there (a bare clone), fails instead when ``CI`` is set.
    """
    path = require_data(data_dir() / name / "dev.jsonl")
    rows = []
    with open(path, "rb") as f:
        for line in f:
            rows.append(orjson.loads(line))
            if len(rows) == n:
                break
    return tuple(rows)


#: pack → the data set its messages come from
PACK_DATA = {"spam": "sms_spam", "sentiment": "sentiment_labelled_sentences", "news_topics": "ag_news"}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory):
    """``family -> HF directory`` of a random-weight tiny model, built on first use."""
    from spinf_stream.models.resolve import resolve
    from tiny import TOKENIZER_OF, build_tiny

    root = tmp_path_factory.mktemp("tiny")
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny(family, root / family, resolve(TOKENIZER_OF[family]).path)
        return built[family]

    return get


@pytest.fixture(scope="session")
def tiny_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HF directory of a random-weight multimodal Gemma 3 (:func:`tiny.build_tiny_gemma3_vl`)."""
    from spinf_stream.models.resolve import resolve
    from tiny import TOKENIZER_OF, build_tiny_gemma3_vl

    return build_tiny_gemma3_vl(tmp_path_factory.mktemp("tiny_vl"), resolve(TOKENIZER_OF["gemma3"]).path)


@pytest.fixture(scope="session")
def tiny_idefics3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HF directory of a random-weight Idefics3 / SmolVLM (:func:`tiny.build_tiny_idefics3`)."""
    from spinf_stream.models.resolve import resolve
    from tiny import TOKENIZER_OF, build_tiny_idefics3

    return build_tiny_idefics3(tmp_path_factory.mktemp("tiny_idefics3"), resolve(TOKENIZER_OF["llama"]).path)


@pytest.fixture(scope="session")
def loaded():
    """``(model dir) -> (Decoder, tokenizer)``, each loaded once per session."""
    from transformers import AutoTokenizer

    from spinf_stream.models import load_decoder

    memo: dict[str, tuple] = {}

    def get(path: Path):
        key = str(path)
        if key not in memo:
            memo[key] = (load_decoder(path), AutoTokenizer.from_pretrained(key))
        return memo[key]

    return get


def at_budget(engine, budget: int):
    """``engine`` with another token budget, sharing its loaded pack and preamble KV cache.

    The budget is read at each ``score`` call only; a new ``Engine`` would prefill the same
    preamble again (minutes for the spam pack in Triton's interpreter)."""
    import copy

    other = copy.copy(engine)
    other.token_budget = budget
    return other
