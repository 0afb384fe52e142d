"""The checks of a configuration that need the daemon's own modules: the stop's plan, the disk tier's format, the
GPU tier and CURVE. ``kvstore serve`` runs them through ``build_config(checks=SERVING_CHECKS)``, so that
``config.py`` imports nothing above it; each raises ``ConfigError`` naming the flag."""

from __future__ import annotations

import shutil

from ...config import ServerConfig
from ...errors import ConfigError
from ...security.curve import check_tcp_exposure
from ...tiers.disk.tier import BLOCK, HEADER_BYTES, existing_parent
from ...units import format_size
from .stopping import StopPlan


def check_disk_size(config: ServerConfig) -> None:
    """A set ``--disk-size`` holds at least one chunk and fits the filesystem that holds ``--disk-dir``."""
    if config.disk_size <= 0:
        return   # off, or auto (sized from the free space at start)
    smallest = HEADER_BYTES + BLOCK
    if config.disk_size < smallest:
        raise ConfigError(f"--disk-size: {format_size(config.disk_size)} is below the smallest disk tier, "
                          f"{format_size(smallest)} (a {format_size(HEADER_BYTES)} header and one "
                          f"{format_size(BLOCK)} block); give at least {smallest // 1024}KiB, or 0 to turn it off")
    where = existing_parent(config.disk_dir)
    try:
        usage = shutil.disk_usage(where)
    except OSError as exc:
        raise ConfigError(f"--disk-dir: cannot read the filesystem of {where}: {exc.strerror}") from None
    if config.disk_size > usage.total:
        raise ConfigError(f"--disk-size: {format_size(config.disk_size)} is larger than the filesystem that holds "
                          f"{config.disk_dir} ({format_size(usage.total)} in all, {format_size(usage.free)} free); "
                          f"lower it, or use auto")


def check_stop_budget(config: ServerConfig) -> None:
    """The stop's deadlines (``stopping.py``) fit ``--shutdown-timeout``, in order."""
    StopPlan.from_budget(config.shutdown_timeout)


def check_gpu(config: ServerConfig) -> None:
    """A GPU tier, when asked for, fits the device it names."""
    if config.gpu_mem:
        from ...tiers.gpu.settings import check_gpu_settings  # imports torch: only when a GPU tier is asked for

        check_gpu_settings(config.gpu_mem, config.gpu_device)


def check_tcp(config: ServerConfig) -> None:
    """A TCP endpoint is not exposed beyond the host without CURVE (``security/curve.py``)."""
    check_tcp_exposure(config.tcp, config.curve_server_key, config.curve_client_keys)


SERVING_CHECKS = (check_disk_size, check_stop_budget, check_gpu, check_tcp)
