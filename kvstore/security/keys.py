"""CURVE key files: writing them (``kvstore keygen``), reading them back, and checking them.

A keypair is two files in the ZeroMQ certificate format (the one ``zmq.auth.load_certificate`` reads), so keys
made by other ZeroMQ tools work too:

    NAME.key          the public key: give it to the other side
    NAME.key_secret   the public and the secret key: never leaves this machine

Both are written owner-only (0600) from their first moment (created with ``O_EXCL`` under a 077 umask, then
``fchmod``), inside a directory whose every level is made 0700 when we create it (``paths.py``). A secret key file that
other users can read is refused when loading: CURVE is only as strong as the secrecy of that file.

The daemon's allow-list of clients is a directory of public key files (``*.key``) or one file: either one
certificate or one Z85 public key per line (``#`` comments allowed). It is re-read when it changes, so adding
an engine's key needs no restart.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass

import zmq
from zmq.utils import z85

from ..errors import ConfigError
from .paths import make_private_dirs

Z85_KEY_CHARS = 40
_HEADER = "#   ****  Generated on {when} by kvstore keygen  ****\n#   ZeroMQ CURVE {kind} Certificate\n"


@dataclass(frozen=True)
class KeyPair:
    public: bytes                # Z85, 40 characters
    secret: bytes | None         # Z85, or None for a public-key-only file


def _check_z85(key: bytes, what: str) -> bytes:
    if len(key) != Z85_KEY_CHARS:
        raise ConfigError(f"{what}: expected a {Z85_KEY_CHARS}-character Z85 CURVE key, got {len(key)} characters")
    try:
        z85.decode(key)
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{what}: not a valid Z85 CURVE key") from None
    return key


def _write_owner_only(path: str, text: str, force: bool) -> None:
    if force:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    old = os.umask(0o077)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} already exists; pass --force to replace it or choose another --name") from None
    finally:
        os.umask(old)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)


def _certificate(kind: str, public: bytes, secret: bytes | None) -> str:
    text = _HEADER.format(when=time.strftime("%Y-%m-%d %H:%M:%S"), kind=kind)
    text += "\nmetadata\ncurve\n" + f'    public-key = "{public.decode()}"\n'
    if secret is not None:
        text += f'    secret-key = "{secret.decode()}"\n'
    return text


def generate_keypair(directory: str, name: str, force: bool = False) -> tuple[str, str]:
    """Write ``NAME.key`` and ``NAME.key_secret`` into ``directory``; return their paths."""
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"--name: {name!r} is not a plain file name; use letters, digits, '-' or '_'")
    try:
        make_private_dirs(directory)
    except OSError as exc:
        raise ConfigError(f"--dir: cannot create {directory}: {exc.strerror}") from None
    public, secret = zmq.curve_keypair()
    public_path = os.path.join(directory, name + ".key")
    secret_path = os.path.join(directory, name + ".key_secret")
    _write_owner_only(secret_path, _certificate("**Secret**", public, secret), force)
    _write_owner_only(public_path, _certificate("Public", public, None), force)
    return public_path, secret_path


def _read_certificate(path: str) -> KeyPair:
    public = secret = None
    try:
        with open(path, "rb") as f:
            for line in f:
                line = line.strip()
                if line.startswith(b"public-key"):
                    public = line.split(b"=", 1)[1].strip(b" \t'\"")
                elif line.startswith(b"secret-key"):
                    secret = line.split(b"=", 1)[1].strip(b" \t'\"")
    except OSError as exc:
        raise ConfigError(f"cannot read CURVE key file {path}: {exc.strerror}") from None
    if public is None:
        raise ConfigError(f"{path}: no public-key line; make key files with `kvstore keygen`")
    return KeyPair(_check_z85(public, path), None if secret is None else _check_z85(secret, path))


def load_secret_keypair(path: str, what: str) -> KeyPair:
    """Read a ``.key_secret`` file, refusing one that other users may read."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}; make one with `kvstore keygen`") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{what}: {path} is readable by other users (mode {stat.S_IMODE(mode):o}); "
                          f"run `chmod 600 {path}`")
    pair = _read_certificate(path)
    if pair.secret is None:
        raise ConfigError(f"{what}: {path} holds no secret key; pass the .key_secret file")
    return pair


def load_public_key(source: str | bytes, what: str) -> bytes:
    """A public key given as a Z85 string or as the path of a key file (either kind)."""
    if isinstance(source, bytes):
        return _check_z85(source, what)
    if len(source) == Z85_KEY_CHARS and not os.path.exists(source):
        return _check_z85(source.encode(), what)
    return _read_certificate(source).public


def _keys_in_file(path: str) -> set[bytes]:
    with open(path, "rb") as f:
        text = f.read()
    if b"public-key" in text:
        return {_read_certificate(path).public}
    keys = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split(b"#", 1)[0].strip()
        if line:
            keys.add(_check_z85(line, f"{path} line {n}"))
    return keys


def load_allowed_keys(location: str) -> set[bytes]:
    """Every public key a directory of ``*.key`` files (or one key file) allows."""
    try:
        if os.path.isdir(location):
            keys: set[bytes] = set()
            for entry in sorted(os.listdir(location)):
                if entry.endswith(".key"):
                    keys |= _keys_in_file(os.path.join(location, entry))
            return keys
        return _keys_in_file(location)
    except OSError as exc:
        raise ConfigError(f"--curve-client-keys: cannot read {location}: {exc.strerror}") from None
