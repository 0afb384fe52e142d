"""Where an engine process may write: every directory vLLM, torch or a tokenizer picks from the environment."""

from __future__ import annotations

import os


def engine_home_env(workdir: str) -> dict[str, str]:
    """HOME, the XDG cache and config dirs and TMPDIR inside ``workdir`` (made here), for an engine's environment.

    Whatever the engine caches or leaves behind (vLLM's ``vllm_dist_*`` rendezvous files in the temp dir among
    them) goes with ``workdir`` instead of the user's home or the shared /tmp.
    """
    home = os.path.join(workdir, "home")
    dirs = {"HOME": home, "XDG_CACHE_HOME": os.path.join(home, ".cache"),
            "XDG_CONFIG_HOME": os.path.join(home, ".config"), "TMPDIR": os.path.join(workdir, "tmp")}
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
    own segments and semaphores: never the daemon's arena, whose names no prefix here matches)."""
    paths: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    path = line.split(None, 5)[-1].strip() if line.count(" ") >= 5 else ""
                    name = path[len("/dev/shm/"):] if path.startswith("/dev/shm/") else ""
                    if name.startswith(prefixes) and not path.endswith("(deleted)"):
                        paths.add(path)
        except OSError:
            continue
    return paths


def remove_files(paths: set[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
