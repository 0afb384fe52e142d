"""ZeroMQ CURVE on the daemon's tcp:// socket: encryption plus an allow-list of client keys.

Who may connect: over ``ipc://`` the socket file's owner-only mode decides (the kernel checks it at connect);
over ``tcp://`` on loopback, anyone on this host can reach the port, and off loopback anyone on the network
can, so a non-loopback bind is refused unless CURVE is configured (``check_tcp_exposure``). With CURVE the
daemon holds a secret key, every client must know the daemon's public key (or it cannot even complete the
handshake) and present a key pair whose public half is in the allow-list.

The allow-list is enforced by a ZAP handler (ZeroMQ's authentication protocol, RFC 27) running on a thread of
the daemon's ZeroMQ context. The handler asks ``AllowList.callback`` for each new connection; the list is a
directory of public key files, re-read when its modification time changes, so a key is added or revoked
without a restart (existing connections stay up until they reconnect). A rejected handshake never reaches the
request loop: the client sees no answer and reports the daemon as unavailable.

Who a connection is: the ZAP handler's reply names the admitted client (its User-Id: the Z85 text of its public
key, pyzmq's ``Authenticator.curve_user_id``), and ZeroMQ attaches that name to every message the connection
sends. ``peer_curve_key`` reads it from a received frame, so the daemon knows a ``tcp://`` session's principal
(its CURVE key) without a table of its own, and the tenants' ``curve_keys`` admit it (``tenants/access.py``).
"""

from __future__ import annotations

import ipaddress
import os
import threading
from dataclasses import dataclass, field

import zmq
from zmq.auth.thread import ThreadAuthenticator

from .. import logs
from ..errors import ConfigError
from .keys import KeyPair, load_allowed_keys, load_public_key, load_secret_keypair

ZAP_DOMAIN = "kvstore"
LOOPBACK_NAMES = ("localhost", "ip6-localhost")


def is_loopback(host: str) -> bool:
    """Whether a ``--tcp`` host only listens on this machine ('*', '0.0.0.0' and names other than localhost don't)."""
    host = host.strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_tcp_exposure(tcp: str | None, server_key: str, client_keys: str) -> None:
    """Refuse to listen off loopback without CURVE; refuse half a CURVE configuration."""
    if client_keys and not server_key:
        raise ConfigError("--curve-client-keys needs --curve-server-key (the daemon's .key_secret file); "
                          "make one with `kvstore keygen --name server`")
    if server_key and not client_keys:
        raise ConfigError("--curve-server-key needs --curve-client-keys (a directory of allowed client .key "
                          "files); make client keys with `kvstore keygen --name CLIENT`")
    if tcp is None:
        return
    host = tcp.rpartition(":")[0]
    if not is_loopback(host) and not server_key:
        raise ConfigError(f"--tcp {tcp} listens beyond this machine; that needs CURVE authentication: pass "
                          f"--curve-server-key and --curve-client-keys (see `kvstore keygen`), or bind 127.0.0.1")


def peer_curve_key(frame: zmq.Frame) -> str | None:
    """The Z85 public key of the CURVE client that sent ``frame`` (a frame received with ``copy=False`` on a CURVE
    server socket), as the ZAP handler named it; None when the message carries no such name."""
    try:
        user = frame.get("User-Id")
    except zmq.ZMQError:
        return None   # not a CURVE connection (ZeroMQ has no User-Id for it)
    return user if isinstance(user, str) and len(user) == 40 else None


@dataclass
class AllowList:
    """The public keys that may connect, re-read when the directory (or file) changes."""

    location: str
    keys: set[bytes] = field(default_factory=set)
    rejected: int = 0
    _stamp: tuple[float, int] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _current_stamp(self) -> tuple[float, int] | None:
        try:
            st = os.stat(self.location)
        except OSError:
            return None
        return (st.st_mtime, st.st_ino)

    def refresh(self) -> None:
        stamp = self._current_stamp()
        if stamp == self._stamp and stamp is not None:
            return
        try:
            keys = load_allowed_keys(self.location)
        except ConfigError as exc:  # keep the last good list; say why the new one was not taken
            logs.error("curve_allow_list_unreadable", error=str(exc))
            return
        with self._lock:
            self.keys, self._stamp = keys, stamp

    def callback(self, domain: str, client_key: bytes) -> bool:
        """Called by the ZAP handler with the client's Z85 public key."""
        self.refresh()
        with self._lock:
            allowed = client_key in self.keys
        if not allowed:
            self.rejected += 1
            logs.warning("curve_client_rejected", client_key=client_key.decode(errors="replace"))
        return allowed


class ServerCurve:
    """The daemon's CURVE identity and the ZAP handler that checks clients; one per daemon."""

    def __init__(self, secret_key_file: str, client_keys: str) -> None:
        self.pair: KeyPair = load_secret_keypair(secret_key_file, "--curve-server-key")
        self.allow = AllowList(client_keys)
        self.allow.refresh()
        if not self.allow.keys:
            raise ConfigError(f"--curve-client-keys: {client_keys} holds no public keys; add the .key file "
                              f"of each client (`kvstore keygen --name CLIENT`)")
        self._auth: ThreadAuthenticator | None = None

    def start(self, ctx: zmq.Context) -> None:
        """Run the ZAP handler on ``ctx`` (a sync shadow is used, so an asyncio context works too)."""
        shadow: zmq.Context = zmq.Context.shadow(ctx.underlying)
        self._auth = ThreadAuthenticator(shadow)
        self._auth.start()
        self._auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=self.allow)

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE server checked by our ZAP handler (call before bind)."""
        assert self.pair.secret is not None   # load_secret_keypair refuses a file without one
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.pair.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.pair.public)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())

    def stop(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


@dataclass(frozen=True)
class ClientCurve:
    """What a client needs to reach a CURVE daemon: the daemon's public key and its own key pair."""

    server_public: bytes
    pair: KeyPair

    @classmethod
    def load(cls, server_key: str | bytes, client_secret_file: str) -> "ClientCurve":
        return cls(load_public_key(server_key, "curve_server_key"),
                   load_secret_keypair(client_secret_file, "curve_client_key"))

    @classmethod
    def from_env(cls) -> "ClientCurve | None":
        """``KVSTORE_CURVE_SERVER_KEY`` (key or file) and ``KVSTORE_CURVE_CLIENT_KEY`` (.key_secret file)."""
        server = os.environ.get("KVSTORE_CURVE_SERVER_KEY")
        client = os.environ.get("KVSTORE_CURVE_CLIENT_KEY")
        if not server and not client:
            return None
        if not (server and client):
            raise ConfigError("set both KVSTORE_CURVE_SERVER_KEY and KVSTORE_CURVE_CLIENT_KEY, or neither")
        return cls.load(server, client)

    def apply(self, sock: zmq.Socket) -> None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_public)
        assert self.pair.secret is not None   # load_secret_keypair refuses a file without one
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.pair.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.pair.secret)
