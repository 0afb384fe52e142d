"""The Store's counters, exported as they are (plain fields)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StoreCounters:
    lookups: int = 0
    lookup_keys: int = 0
    hit_keys: int = 0
    puts: int = 0
    put_chunks: int = 0
    put_bytes: int = 0
    gets: int = 0
    get_chunks: int = 0
    get_bytes: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    expired_leases: int = 0
    expired_reservations: int = 0
    full_errors: int = 0


@dataclass
class TierCounters:
    """Movements between tiers, in chunks and bytes (plain fields: exported as they are)."""

    promotions_disk_host: int = 0
    promoted_bytes_disk_host: int = 0
    demotions_host_disk: int = 0
    demoted_bytes_host_disk: int = 0
    evictions_host: int = 0          # left DRAM with no disk copy: lost
    evictions_disk: int = 0          # left the disk tier (a DRAM copy may remain)
    evicted_bytes_disk: int = 0
    disk_writes: int = 0
    disk_write_bytes: int = 0        # bytes stored on disk (after compression)
    disk_write_skipped: int = 0      # no room on disk even after eviction, or write failed
    disk_full_writes: int = 0        # writes the filesystem refused for want of space (the chunk stays in DRAM)
    disk_reads: int = 0
    disk_read_bytes: int = 0
    checksum_failures: int = 0
    io_errors: int = 0
    quarantined: int = 0
    unwritten_evictions: int = 0     # evicted from DRAM while still waiting for write-back
    promotions_host_gpu: int = 0
    promoted_bytes_host_gpu: int = 0
    demotions_gpu_host: int = 0      # left the GPU tier with a DRAM copy (kept, or copied down)
    demoted_bytes_gpu_host: int = 0
    demotions_gpu_disk: int = 0      # left the GPU tier with only a disk copy below it
    demoted_bytes_gpu_disk: int = 0
    gpu_copies_down: int = 0         # demotions that had to copy the bytes back into DRAM first
    promotions_remote_host: int = 0  # chunks fetched from the remote store into DRAM
    promoted_bytes_remote_host: int = 0
