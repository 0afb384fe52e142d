"""Damage stored chunks from outside the daemon, as a buggy client of the same user could (a test helper).

Run as its own process: ``python tests/support/scribble.py ARENA PATTERN_HEX[:OFFSET] ...`` maps the daemon's shared
arena (``/dev/shm/kvstore.<uid>.*.arena``) read-write, finds each pattern (the first bytes of a chunk's payload,
unique per chunk in the tests) and flips one byte ``OFFSET`` bytes past it (default: 1,000). Prints how many it
damaged. ``python tests/support/scribble.py --file PATH OFFSET`` flips one byte of a file instead (a disk tier file).
The tests use ``damage`` and ``damage_file`` below.
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys

HERE = os.path.abspath(__file__)
DEFAULT_OFFSET = 1000


def damage(arena_path: str, payloads: list[bytes], offset: int = DEFAULT_OFFSET) -> None:
    """Flip one byte of each payload's copy in the arena, from another process; all must be found."""
    specs = [f"{p[:32].hex()}:{offset}" for p in payloads]
    out = subprocess.run([sys.executable, HERE, arena_path, *specs], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) == len(payloads), out.stdout


def damage_file(path: str, offset: int) -> None:
    out = subprocess.run([sys.executable, HERE, "--file", path, str(offset)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr


def _flip_in_arena(arena_path: str, specs: list[str]) -> int:
    fd = os.open(arena_path, os.O_RDWR)
    try:
        buf = mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    flipped = 0
    for spec in specs:
        pattern, _, off = spec.partition(":")
        at = buf.find(bytes.fromhex(pattern))
        if at >= 0:
            where = at + int(off or DEFAULT_OFFSET)
            buf[where] ^= 0x5A
            flipped += 1
    buf.flush()
    buf.close()
    return flipped


def _flip_in_file(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x5A]))


if __name__ == "__main__":
    if sys.argv[1] == "--file":
        _flip_in_file(sys.argv[2], int(sys.argv[3]))
        print(1)
    else:
        print(_flip_in_arena(sys.argv[1], sys.argv[2:]))
