"""Where an engine process may write: every directory vLLM, torch or a tokenizer picks from the environment."""

from __future__ import annotations

import os


def engine_home_env(workdir: str) -> dict[str, str]:
    """HOME, the XDG cache and config dirs and TMPDIR inside ``workdir`` (made here), for an engine's environment.

    Whatever the engine caches or leaves behind (vLLM's ``vllm_dist_*`` rendezvous files in the temp dir among
    them) goes with ``workdir`` (vLLM's cache with this process's scratch root) instead of the user's home or the
    shared /tmp.
    """
    from ..daemons import scratch_root

    home = os.path.join(workdir, "home")
    dirs = {"HOME": home, "XDG_CACHE_HOME": os.path.join(home, ".cache"),
            "XDG_CONFIG_HOME": os.path.join(home, ".config"), "TMPDIR": os.path.join(workdir, "tmp"),
            # vLLM's cache, one for every engine this process starts (in its scratch root, removed with it): its
            # model-class inspection, a subprocess of seconds, is then made once per architecture, not per engine
            # directory (the entries are keyed by the model module's hash)
            "VLLM_CACHE_ROOT": os.path.join(scratch_root(), "vllm-cache")}
    for path in dirs.values():
        os.makedirs(path, mode=0o700, exist_ok=True)
    return dirs


def descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def shm_files_of(pids: list[int], prefixes: tuple[str, ...]) -> set[str]:
    """The /dev/shm files named with one of ``prefixes`` that the processes ``pids`` have mapped (an engine's
    own segments and semaphores: never the daemon's arena, whose names no prefix here matches).

    Files are matched by inode, not by the name a mapping shows: glibc's ``sem_open`` maps a temporary file,
    links the semaphore's name to it and removes the temporary name, so a process's maps name a deleted file
    where the semaphore (``sem.mp-*``, multiprocessing's) lives on under another name.
    """
    inodes: set[int] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    fields = line.split(None, 5)
                    if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                        inodes.add(int(fields[4]))
        except (OSError, ValueError):
            continue
    if not inodes:
        return set()
    found: set[str] = set()
    with os.scandir("/dev/shm") as entries:
        for entry in entries:
            if entry.name.startswith(prefixes) and entry.inode() in inodes:
                found.add(entry.path)
    return found


def remove_files(paths: set[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
