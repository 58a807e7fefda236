"""The device decision: the role's resources, what the process sees, its local rank and the override."""

from __future__ import annotations

import pytest
import torch

from decentralized_verl.runtime import device
from decentralized_verl.runtime.device_choice import (
    CPU_BACKEND,
    GPU_BACKEND,
    DeviceError,
    gpu_env,
    planned_device,
    resolve_device,
    visible_gpus,
)


def test_a_worker_without_gpus_computes_on_the_cpu_even_on_a_gpu_machine() -> None:
    choice = resolve_device(gpus=0, counted=8)
    assert (choice.name, choice.backend) == ("cpu", CPU_BACKEND)


def test_a_pod_with_one_gpu_uses_the_one_it_sees() -> None:
    choice = resolve_device(gpus=1, visible="3", counted=1)
    assert (choice.name, choice.backend, choice.is_gpu) == ("cuda:0", GPU_BACKEND, True)


def test_local_rank_picks_the_gpu_among_several_visible() -> None:
    assert resolve_device(gpus=1, visible="0,1,2,3", counted=4, local_rank=2).name == "cuda:2"
    # one visible GPU per rank (the operator's pods): rank 5 uses the one it sees
    assert resolve_device(gpus=1, visible="5", counted=1, local_rank=5).name == "cuda:0"


@pytest.mark.parametrize("visible", ["", "-1", " "])
def test_hidden_gpus_are_not_seen(visible: str) -> None:
    assert visible_gpus(visible, 8) == 0
    assert resolve_device(gpus=1, visible=visible, counted=8).name == "cpu"


def test_visible_devices_cap_what_torch_counts() -> None:
    assert visible_gpus("0,1", 8) == 2
    assert visible_gpus(None, 4) == 4
    assert visible_gpus("0,1", 0) == 0


def test_auto_falls_back_to_the_cpu_and_says_why() -> None:
    choice = resolve_device(gpus=2, counted=0)
    assert choice.name == "cpu" and "sees none" in choice.reason


def test_the_override_wins_both_ways() -> None:
    assert resolve_device(override="cpu", gpus=1, counted=1).name == "cpu"
    assert resolve_device(override="cuda", gpus=0, counted=2, local_rank=1).name == "cuda:1"
    assert resolve_device(override="cuda:1", gpus=0, counted=2).name == "cuda:1"


def test_cuda_asked_for_without_a_gpu_is_a_loud_error_naming_the_field() -> None:
    with pytest.raises(
        DeviceError, match=r"spec.roles.learner.device: cuda asked for, but this process sees no GPU"
    ):
        resolve_device(override="cuda", counted=0, field="spec.roles.learner.device")
    with pytest.raises(DeviceError, match=r"--device: cuda:3 asked for, but this process sees 2 GPU"):
        resolve_device(override="cuda:3", counted=2, field="--device")


def test_an_unknown_override_names_the_choices() -> None:
    with pytest.raises(DeviceError, match=r"--device: must be one of auto, cpu, cuda \(got 'tpu'\)"):
        resolve_device(override="tpu", field="--device")


def test_the_plan_shows_a_placed_worker_its_gpu_and_a_pod_its_kind() -> None:
    assert planned_device(1, "auto", 3) == "cuda:3"
    assert planned_device(1, "auto", None) == "cuda"
    assert planned_device(0, "auto", None) == "cpu"
    assert planned_device(1, "cpu", 0) == "cpu"
    assert planned_device(0, "cuda", None) == "cuda"


def test_a_placed_process_sees_only_its_slots() -> None:
    assert gpu_env((2, 3)) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert gpu_env(()) == {"CUDA_VISIBLE_DEVICES": ""}


def test_entering_on_this_machine_gives_the_process_its_device() -> None:
    """The torch half applies the decision: here (no GPU in this torch build) a CPU worker gets the CPU,
    its collectives run there, and it reports no GPU memory."""
    got = device.enter(gpus=0)
    assert got == torch.device("cpu") == device.process_device() == device.collective_device()
    assert device.memory_allocated() == 0 and not device.pins_memory()
    layer = device.to_device(torch.nn.Linear(2, 2))
    assert next(layer.parameters()).device == got
