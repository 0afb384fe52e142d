"""Sizes of host memory for tests that need a large arena."""

from __future__ import annotations


def large_host_mem() -> str:
    """Half the memory available now, at most 8 GiB: a size whose pages cost time to reserve and free."""
    from kvstore.defaults import available_memory

    return f"{min(8 << 10, available_memory() // 2 >> 20)}MiB"
