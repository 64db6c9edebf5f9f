"""``--device``/``--dtype``: ``auto`` resolves by what torch sees; a choice this machine cannot run
is refused before any weight loads, saying what to use instead. A stand-in for torch plays the
machines we do not have (a GPU without fp8, one without bfloat16, several GPUs)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spinf_stream.device import Placement, choose
from spinf_stream.errors import UsageError


def fake_torch(gpus: list[tuple[str, tuple[int, int]]]) -> SimpleNamespace:
    """torch as seen on a machine with ``gpus`` (name, compute capability) visible."""

    def index(device: object) -> int:
        text = str(device)
        return int(text.split(":")[1]) if ":" in text else 0

    cuda = SimpleNamespace(
        is_available=lambda: bool(gpus),
        device_count=lambda: len(gpus),
        get_device_capability=lambda d=0: gpus[index(d)][1],
        get_device_name=lambda d=0: gpus[index(d)][0],
        is_bf16_supported=lambda: gpus[0][1] >= (8, 0),
    )
    return SimpleNamespace(__version__="2.13.0+fake", version=SimpleNamespace(cuda="12.8" if gpus else None), cuda=cuda)


CPU_ONLY = fake_torch([])
H200 = fake_torch([("NVIDIA H200", (9, 0))])
A100 = fake_torch([("NVIDIA A100-SXM4-80GB", (8, 0))])
V100 = fake_torch([("Tesla V100-SXM2-16GB", (7, 0))])
TWO_L4 = fake_torch([("NVIDIA L4", (8, 9)), ("NVIDIA L4", (8, 9))])


def test_auto_takes_the_gpu_in_bfloat16_when_torch_sees_one():
    assert choose("auto", "auto", torch_module=H200) == Placement("cuda", "bfloat16")


def test_auto_takes_the_cpu_in_float32_without_a_gpu():
    assert choose("auto", "auto", torch_module=CPU_ONLY) == Placement("cpu", "float32")


def test_auto_dtype_follows_an_explicit_device():
    assert choose("cpu", "auto", torch_module=H200) == Placement("cpu", "float32")
    assert choose("cuda:1", "auto", torch_module=TWO_L4) == Placement("cuda:1", "bfloat16")


def test_cuda_without_a_gpu_says_to_use_the_cpu():
    with pytest.raises(UsageError, match=r"--device cuda \(SPINF_DEVICE\): no CUDA GPU is visible .*use --device cpu"):
        choose("cuda", "auto", torch_module=CPU_ONLY)


def test_a_gpu_index_past_the_visible_ones_names_the_valid_range():
    with pytest.raises(UsageError, match=r"only 2 GPU\(s\) visible; use cuda:0 to cuda:1"):
        choose("cuda:2", "auto", torch_module=TWO_L4)


def test_fp8_on_the_cpu_says_to_use_float32():
    with pytest.raises(UsageError, match=r"--dtype fp8 .*\(compute capability 8\.9 .*use --dtype float32"):
        choose("cpu", "fp8", torch_module=CPU_ONLY)


def test_fp8_on_a_gpu_without_fp8_tensor_cores_says_to_use_int8_or_bfloat16():
    with pytest.raises(UsageError, match=r"A100.* compute capability 8\.0, fp8 tensor cores need 8\.9 .*use --dtype int8 .*bfloat16"):
        choose("cuda", "fp8", torch_module=A100)


@pytest.mark.parametrize("machine", [H200, TWO_L4], ids=["hopper", "ada"])
def test_fp8_is_accepted_on_gpus_with_fp8_tensor_cores(machine):
    assert choose("auto", "fp8", torch_module=machine) == Placement("cuda", "fp8")


def test_int8_runs_on_ampere_and_newer_and_on_the_cpu():
    assert choose("cuda", "int8", torch_module=A100) == Placement("cuda", "int8")
    assert choose("auto", "int8", torch_module=H200) == Placement("cuda", "int8")
    assert choose("auto", "int8", torch_module=CPU_ONLY) == Placement("cpu", "int8")


def test_int8_on_a_gpu_older_than_ampere_says_to_use_float32():
    with pytest.raises(UsageError, match=r"--dtype int8 .*V100.* compute capability 7\.0.*8\.0 \(Ampere\).*use --dtype float32"):
        choose("cuda", "int8", torch_module=V100)


def test_bfloat16_on_a_gpu_without_it_says_to_use_float32():
    with pytest.raises(UsageError, match="use --dtype float32"):
        choose("cuda", "bfloat16", torch_module=V100)


@pytest.mark.parametrize(("device", "dtype"), [("gpu", "auto"), ("cuda:x", "auto"), ("auto", "fp16")])
def test_unknown_values_are_refused_naming_the_allowed_ones(device, dtype):
    with pytest.raises(UsageError, match="use "):
        choose(device, dtype, torch_module=H200)


def test_auto_on_this_machine_matches_what_torch_sees():
    import torch

    got = choose("auto", "auto")
    assert got.device_type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert got.dtype == ("bfloat16" if torch.cuda.is_available() else "float32")
