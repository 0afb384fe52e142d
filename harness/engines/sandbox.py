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
