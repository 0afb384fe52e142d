"""The GPU side of kvstore: the HBM tier owned by the daemon, CUDA IPC sharing, page-locked host memory, and the
engine-side helpers that map the pool and copy chunks on the engine's own stream.

    pool.py     byte pool on one device, carved by the extent allocator
    tier.py     the HBM tier (tier interface + async copies to and from the host arena)
    copies.py   asynchronous copies on dedicated streams, tracked by events
    ipc.py      CUDA IPC export (daemon) and import (engine) of the pool
    page_lock.py cudaHostRegister of the shared arena, with the memlock check and the pageable fallback
    engine.py   engine side: map the pool once, load/save chunks asynchronously with events
    settings.py checks of --gpu-mem / --gpu-device

Nothing here is imported by the daemon unless ``--gpu-mem`` is set, so CPU-only installs never touch CUDA.
"""
