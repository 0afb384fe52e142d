"""Checks of ``--gpu-mem`` and ``--gpu-device``: refuse clearly, at start, what cannot work."""

from __future__ import annotations

from ..errors import ConfigError
from ..units import format_size

NO_CUDA = "--gpu-mem needs a CUDA GPU; none is visible (torch.cuda.is_available() is False)"


def check_gpu_settings(gpu_mem: int, gpu_device: int) -> None:
    """Raise ConfigError unless ``gpu_mem`` bytes can be had on ``cuda:gpu_device`` (no-op when 0)."""
    if gpu_mem == 0:
        return
    if gpu_mem < 1 << 20:
        raise ConfigError(f"--gpu-mem: {gpu_mem} bytes is too small; give at least 1MiB, or 0 for no GPU tier")
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        raise ConfigError(NO_CUDA) from None
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
