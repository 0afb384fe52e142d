"""Checks of ``--gpu-mem`` and ``--gpu-device``: refuse clearly, at start, what cannot work.

Testing switch: with ``KVSTORE_GPU_TIER_DEVICE=cpu`` in its environment the daemon builds the "gpu" tier on a
CPU tensor instead (a shared-memory pool that clients map like the host arena), so that the disk mover's
promotion and demotion, the HELLO export and the client's tensor views run in tests on machines without a GPU,
through the same code. No other value is accepted, and nothing but that variable turns it on.
"""

from __future__ import annotations

import os

from ...errors import ConfigError
from ...units import format_size

NO_CUDA = "--gpu-mem needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)"
TEST_DEVICE_ENV = "KVSTORE_GPU_TIER_DEVICE"


def cpu_test_tier() -> bool:
    """Whether the testing switch asks for a CPU-backed "gpu" tier (ConfigError for any other value)."""
    value = os.environ.get(TEST_DEVICE_ENV, "")
    if value not in ("", "cpu"):
        raise ConfigError(f"{TEST_DEVICE_ENV}={value!r}: the only accepted value is 'cpu' (a CPU-backed GPU tier "
                          f"for tests); unset it to use --gpu-device")
    return value == "cpu"


def tier_device(gpu_device: int) -> str:
    """The torch device of the GPU tier: ``cuda:N``, or ``cpu`` under the testing switch."""
    return "cpu" if cpu_test_tier() else f"cuda:{gpu_device}"


def check_gpu_settings(gpu_mem: int, gpu_device: int) -> None:
    """Raise ConfigError unless ``gpu_mem`` bytes can be had on ``cuda:gpu_device`` (no-op when 0)."""
    if gpu_mem == 0:
        return
    if gpu_mem < 1 << 20:
        raise ConfigError(f"--gpu-mem: {gpu_mem} bytes is too small; give at least 1MiB, or 0 for no GPU tier")
    if cpu_test_tier():
        return
    try:
        import torch
    except ImportError:   # torch is the extra of the engine side, not of the daemon
        raise ConfigError("--gpu-mem needs torch (with CUDA), which is not installed: "
                          "pip install 'kvstore[gpu]'") from None
    if not torch.cuda.is_available():
        raise ConfigError(NO_CUDA)
    count = torch.cuda.device_count()
    if not 0 <= gpu_device < count:
        raise ConfigError(f"--gpu-device: there is no cuda:{gpu_device}; {count} CUDA device(s) are visible "
                          f"(numbered 0..{count - 1})")
    free, _total = torch.cuda.mem_get_info(gpu_device)
    if gpu_mem > free:
        raise ConfigError(f"--gpu-mem: {format_size(gpu_mem)} does not fit on cuda:{gpu_device} "
                          f"({format_size(free)} free); lower it")
