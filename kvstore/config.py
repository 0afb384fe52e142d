"""The daemon's configuration: one typed tree, one default per setting.

Every setting is declared once in ``SETTINGS`` (name, type reader, default, help; the readers, which check one
value alone, are ``config_readers.py``). The TOML file and the command-line flags are both generated from and
checked against that table, so a default is never written twice and an unknown key is an error that names it.
Precedence: flag > config file > default.

An error names where the value came from: the flag, or the config file and its key (``config_file.py``, which
also reads a file's relative paths against the file's directory; docs/reference/config-notes.md).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

from .config_file import Origins, flag_of, read_config_file
from .config_readers import (read_bool, read_compression, read_count, read_dir, read_disk_size, read_events_endpoint,
                             read_events_format, read_events_topic, read_gpu_device, read_group, read_host,
                             read_io_depth, read_log_level, read_optional_file, read_policy, read_port, read_remote,
                             read_remote_wait, read_share, read_socket, read_str, read_tcp)
from .defaults import (DEFAULT_POLICY, EVENTS_BUFFER, EVENTS_FORMAT, EVENTS_HWM, IPC_PATH_MAX, MAX_PIN_SHARE,
                       MAX_PIN_TTL, PIN_TTL, available_memory, default_disk_dir, default_host_mem, default_socket)
from .errors import ConfigError
from .security.redact import redact_url
from .units import format_size, parse_seconds, parse_size


def _default_events_topic() -> str:
    from .protocol.event_topics import DEFAULT_TOPIC

    return DEFAULT_TOPIC


@dataclass(frozen=True)
class Setting:
    name: str
    read: Callable[[Any, str], Any]
    default: Callable[[], Any]
    help: str
    metavar: str = "VALUE"
    path: bool = False   # a file or directory: relative in a config file means relative to the file
    switch: bool = False  # true/false: a flag pair (--NAME / --no-NAME) on the command line

    @property
    def flag(self) -> str:
        return flag_of(self.name)


SETTINGS: tuple[Setting, ...] = (
    Setting("socket", read_socket, default_socket, "path of the ipc:// socket", "PATH", path=True),
    Setting("socket_group", read_group, lambda: None,
            "let this local group (name or gid) reach the daemon: its members connect to the stream socket "
            "(0660) and move bytes in the messages; the arena and index stay the daemon user's alone (default: "
            "the daemon's user only)", "GROUP"),
    Setting("tcp", read_tcp, lambda: None, "also listen on tcp://HOST:PORT (loopback unless you mean it)",
            "HOST:PORT"),
    Setting("tcp_heartbeat", lambda v, n: parse_seconds(v, n), lambda: 10.0,
            "how often the daemon pings each tcp:// client; a connection silent for three pings is closed and its "
            "session ends (its leases and reservations freed, its engine no longer published for)", "SECONDS"),
    Setting("host_mem", lambda v, n: parse_size(v, n), default_host_mem,
            "most memory the host DRAM tier takes in /dev/shm, as chunks arrive (default: a quarter of "
            "available memory)", "SIZE"),
    Setting("adopt", read_bool, lambda: True,
            "at start, adopt the DRAM tier a cleanly stopped daemon on this socket kept in /dev/shm (each chunk "
            "verified against its checksum before it is served); --no-adopt starts empty and frees it",
            "", switch=True),
    Setting("max_chunk", lambda v, n: parse_size(v, n), lambda: 0,
            "largest chunk accepted (0: as large as the host tier)", "SIZE"),
    Setting("lease_ttl", lambda v, n: parse_seconds(v, n), lambda: 30.0,
            "how long a get's lease lasts for a client the daemon cannot follow (another pid namespace); a live "
            "local client keeps its leases until it releases them (past the TTL they count as overdue), a dead "
            "one loses them at once", "SECONDS"),
    Setting("reserve_ttl", lambda v, n: parse_seconds(v, n), lambda: 30.0,
            "how long reserved space waits for its commit", "SECONDS"),
    Setting("disk_dir", read_dir, default_disk_dir, "directory of the disk tier (default: the user's cache dir)",
            "DIR", path=True),
    Setting("disk_size", read_disk_size, lambda: -1,
            "disk tier cap: a size, 0 to turn the tier off, or auto (10 % of its usable space, at most 64GiB)", "SIZE"),
    Setting("disk_compression", read_compression, lambda: "none", "none or lz4 for chunks on disk", "ALGO"),
    Setting("disk_queue", lambda v, n: parse_size(v, n), lambda: 0,
            "bytes waiting for write-back before puts wait (0: a quarter of the host tier)", "SIZE"),
    Setting("disk_io_depth", read_io_depth, lambda: 4, "disk writes in flight (reads get as many again)", "N"),
    Setting("remote", read_remote, lambda: "",
            "remote store below the disk tier: redis://HOST:PORT (rediss://, ?cluster=1 for Redis Cluster) or "
            "mooncake://MASTER:PORT?metadata=URL (default: none)", "URL"),
    Setting("remote_wait", read_remote_wait, lambda: 0.1,
            "how long a lookup that misses locally waits for the remote store's answer", "SECONDS"),
    Setting("eviction_policy", read_policy, lambda: DEFAULT_POLICY,
            "eviction order of the tiers: chain-lru, lru or s3-fifo (see kvstore simulate)", "POLICY"),
    Setting("log_level", read_log_level, lambda: "info", "debug, info, warning or error", "LEVEL"),
    Setting("metrics_port", read_port, lambda: 0, "serve Prometheus /metrics on this port (0: off)", "PORT"),
    Setting("metrics_host", read_host, lambda: "127.0.0.1",
            "address /metrics listens on (loopback unless you mean it)", "HOST"),
    Setting("shutdown_timeout", lambda v, n: parse_seconds(v, n), lambda: 10.0,
            "the whole stop's budget on SIGTERM (0.5s..3600s): each step's deadline is a share of it (puts "
            "being written 50 %, remote puts 60 %, the disk flush 80 %, closing 90 %), and at 100 % the "
            "process exits 1", "SECONDS"),
    Setting("gpu_mem", lambda v, n: parse_size(v, n), lambda: 0,
            "size of the GPU HBM tier (0: none); needs a CUDA GPU", "SIZE"),
    Setting("gpu_device", read_gpu_device, lambda: 0, "CUDA device index of the GPU tier", "N"),
    Setting("scrub_rate", lambda v, n: parse_size(v, n), lambda: 0,
            "background scrub: check every chunk's copies at this many bytes per second (0: off)", "BYTES"),
    Setting("curve_server_key", read_str, lambda: "",
            "the daemon's CURVE .key_secret file (from `kvstore keygen`): encrypt and authenticate --tcp", "FILE",
            path=True),
    Setting("curve_client_keys", read_str, lambda: "",
            "directory of allowed clients' CURVE .key files (or one file of keys); needed with --curve-server-key",
            "PATH", path=True),
    Setting("tenant_key_file", read_optional_file, lambda: "",
            "the secret of restricted tenants' key spaces, made (32 random bytes, mode 0600) when absent and read "
            "at every start, only when a tenant lists identities (default: tenant-keys.secret in --disk-dir); "
            "daemons sharing a remote store must use copies of the same file", "FILE", path=True),
)
EVENT_SETTINGS = (
    Setting("events_endpoint", read_events_endpoint, lambda: "",
            "publish KV cache events (vLLM's format) on a ZeroMQ PUB socket bound here, e.g. tcp://127.0.0.1:5557 "
            "(default: off)", "ENDPOINT"),
    Setting("events_replay_endpoint", read_events_endpoint, lambda: "",
            "answer vLLM's replay requests for missed event batches on a ROUTER socket bound here", "ENDPOINT"),
    Setting("events_buffer", read_count, lambda: EVENTS_BUFFER, "event batches kept for replay", "N"),
    Setting("events_hwm", read_count, lambda: EVENTS_HWM,
            "event batches queued for one slow subscriber before it loses newer ones (a gap it can replay)", "N"),
    Setting("events_format", read_events_format, lambda: EVENTS_FORMAT,
            "map (vLLM's tagged maps, current releases) or array (the older positional events)", "FORMAT"),
    Setting("events_topic", read_events_topic, _default_events_topic,
            "topic of each engine's events, a template of {engine_id}, {model}, {dp_rank} and {tenant} (llm-d's "
            "kv@{engine_id}@{model} by default; the daemon-wide stream's topic is then empty), or a plain topic "
            "for every event message", "TOPIC"),
)
RETENTION_SETTINGS = (
    Setting("pin_ttl", lambda v, n: parse_seconds(v, n), lambda: PIN_TTL,
            "how long a put's soft pin (retention class pin) holds its chunks when the put names no TTL", "SECONDS"),
    Setting("max_pin_ttl", lambda v, n: parse_seconds(v, n), lambda: MAX_PIN_TTL,
            "the longest soft pin: a put asking more is cut to it (so no pin blocks puts past it)", "SECONDS"),
    Setting("max_pin_share", read_share, lambda: MAX_PIN_SHARE,
            "most of the host tier all soft pins together may hold without a tenants table (a tenant's own pins "
            "are bounded by its DRAM guarantee and max_pin_bytes); a pin past it is kept as high", "SHARE"),
)
SETTINGS = SETTINGS + EVENT_SETTINGS + RETENTION_SETTINGS
_BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class ServerConfig:
    socket: str
    socket_group: int | None
    tcp: str | None
    tcp_heartbeat: float
    host_mem: int
    adopt: bool
    max_chunk: int
    lease_ttl: float
    reserve_ttl: float
    disk_dir: str
    disk_size: int
    disk_compression: str
    disk_queue: int
    disk_io_depth: int
    remote: str
    remote_wait: float
    eviction_policy: str
    log_level: str
    metrics_port: int
    metrics_host: str
    shutdown_timeout: float
    gpu_mem: int
    gpu_device: int
    scrub_rate: int
    curve_server_key: str
    curve_client_keys: str
    tenant_key_file: str
    events_endpoint: str
    events_replay_endpoint: str
    events_buffer: int
    events_hwm: int
    events_format: str
    events_topic: str
    pin_ttl: float
    max_pin_ttl: float
    max_pin_share: float

    @property
    def chunk_limit(self) -> int:
        return self.max_chunk or self.host_mem

    def describe(self, **in_force: Any) -> str:
        """``name=value`` for every setting; ``in_force`` gives the values derived at start (``auto``, 0)."""
        return " ".join(f"{f.name}={self._show(f.name, in_force.get(f.name, getattr(self, f.name)))}"
                        for f in fields(self))

    def _show(self, name: str, value: Any) -> str:
        if name == "disk_size" and value < 0:
            return "auto"
        if name == "remote":
            return redact_url(value)
        if name == "max_pin_share":
            return f"{value:.0%}"
        sized = ("host_mem", "max_chunk", "gpu_mem", "disk_size", "disk_queue", "scrub_rate")
        return format_size(value).replace(" ", "") if name in sized else str(value)

    @property
    def disk_enabled(self) -> bool:
        return self.disk_size != 0

    @property
    def disk_queue_limit(self) -> int:
        return self.disk_queue or max(self.host_mem // 4, 1 << 20)


assert {f.name for f in fields(ServerConfig)} == set(_BY_NAME), "every setting needs a ServerConfig field"


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML file of settings (flags override it)")
    for s in SETTINGS:
        if s.switch:
            parser.add_argument(s.flag, dest=s.name, default=None, action=argparse.BooleanOptionalAction,
                                help=s.help.replace("%", "%%"))
        else:
            parser.add_argument(s.flag, dest=s.name, default=None, metavar=s.metavar,
                                help=s.help.replace("%", "%%"))


def load_toml(path: str) -> dict[str, Any]:
    """The settings of the config file ``path``, by setting name (relative paths made relative to the file)."""
    return read_config_file(path, Origins(path), _BY_NAME, {s.name for s in SETTINGS if s.path})


def build_config(flags: dict[str, Any] | None = None, config_file: str | None = None,
                 checks: Sequence[Callable[[ServerConfig], None]] = (), origins: Origins | None = None) -> ServerConfig:
    """Merge defaults < config file < flags, reading and checking every value.

    Args:
        flags: setting name -> value given on the command line (None: not given).
        config_file: the TOML file of settings, if any.
        checks: more checks of the whole configuration, after ``check_config``'s: those that need modules above
            this one (``server/lifecycle/config_checks.py`` has the daemon's).
        origins: where the caller keeps where each value came from, to word its own later errors the same way
            (``kvstore serve``: the checks at start, such as the disk tier's room); a fresh one by default.

    Raises:
        ConfigError: naming the flag, or the config file and its key, that holds the bad value.
    """
    origins = origins if origins is not None else Origins(config_file)
    config = ServerConfig(**read_settings(flags, config_file, origins))
    try:
        check_config(config)
        for check in checks:
            check(config)
    except ConfigError as exc:
        raise origins.reword(exc) from None
    return config


def read_settings(flags: dict[str, Any] | None, config_file: str | None,
                  origins: Origins | None = None) -> dict[str, Any]:
    """Every setting's value, defaults < config file < flags, each read and checked on its own (not against the
    others nor the machine: ``build_config`` does that). ``kvstore reload`` compares these with the settings in
    force.

    Raises:
        ConfigError: naming the flag, or the config file and its key, that holds the bad value.
    """
    origins = origins if origins is not None else Origins(config_file)
    raw: dict[str, Any] = {}
    if config_file:
        raw = read_config_file(config_file, origins, _BY_NAME, {s.name for s in SETTINGS if s.path})
    for name, value in (flags or {}).items():
        if value is not None and name in _BY_NAME:
            raw[name] = value
            origins.keys.pop(name, None)
    return {s.name: s.read(raw[s.name], origins.label(s.name)) if s.name in raw else s.default() for s in SETTINGS}


def check_config(config: ServerConfig) -> None:
    """The checks of values against each other and the machine that need no module above this one."""
    if len(config.socket) > IPC_PATH_MAX:
        raise ConfigError(f"--socket: path is {len(config.socket)} characters; ipc sockets allow at most "
                          f"{IPC_PATH_MAX}; choose a shorter path")
    if config.host_mem < 1 << 20:
        raise ConfigError(f"--host-mem: {config.host_mem} bytes is too small; give at least 1MiB")
    from .mapped.arena import held_by_arena_of
    # the arena a stopped or killed daemon left on this socket is adopted or freed by this start: its pages count
    available = available_memory() + held_by_arena_of(config.socket)
    if config.host_mem > available:
        raise ConfigError(f"--host-mem: {format_size(config.host_mem)} does not fit in memory "
                          f"({format_size(available)} available); lower it")
    if config.chunk_limit > config.host_mem:
        raise ConfigError(f"--max-chunk: {format_size(config.max_chunk)} is larger than the host tier "
                          f"({format_size(config.host_mem)}); lower --max-chunk or raise --host-mem")
    check_events(config)
    if config.pin_ttl > config.max_pin_ttl:
        raise ConfigError(f"--pin-ttl: {config.pin_ttl:g}s is longer than --max-pin-ttl ({config.max_pin_ttl:g}s); "
                          f"lower it or raise --max-pin-ttl")


def check_events(config: ServerConfig) -> None:
    """Replay needs the events it replays, on an endpoint of its own."""
    replay = config.events_replay_endpoint
    if replay and (not config.events_endpoint or replay == config.events_endpoint):
        raise ConfigError("--events-replay-endpoint: needs --events-endpoint too, and another endpoint than it")
