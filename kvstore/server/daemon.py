"""The daemon process: sockets, sessions, the request loop and the lifecycle.

Start: take an exclusive lock next to the socket (a second daemon on the same socket refuses to start; a
crashed daemon's lock dies with it, so its stale socket and arena are removed), create the shared arena, bind a
ZeroMQ ROUTER on ipc:// (and optionally tcp://), then serve. Requests are handled one at a time on the event
loop: every operation is an in-memory index update of a few microseconds, and bytes never pass through the
daemon on the ipc:// path (clients copy them straight into or out of the arena). A sweeper expires leases and
reservations and reclaims the pins of local clients whose process died.

Stop (SIGTERM or SIGINT), bounded by ``shutdown_timeout``: tell the service manager (``STOPPING=1``), remove
the socket file so that no new local client can connect, and refuse requests that start new work (hello,
lookup, reserve, put, get) with ``UnavailableError`` while still answering those that finish work (commit,
abort, release, ...), until no reservation is outstanding: a put that was being written completes. Then stop
taking messages without losing a received one, answer what is still queued, flush the store where it has
something to persist, close the sockets, remove the arena and exit 0. Should any step hang, a timer ends the
process (exit 1) at twice the timeout.

GPU tier (``--gpu-mem``): created in ``open`` on the host arena (which it page-locks), exported once (its HELLO
field is computed at start and handed to every client that asks), moved by the GPU mover's task, drained before
the disk flush at stop and closed before the arena (unpin before unmap).

Remote tier (``--remote URL``): the backend is opened in ``open`` (which never blocks: a store that is down at
start is an outage, not an error), offered the host arena for zero-copy transfers, and driven by the remote mover
(``store/remote_mover.py``); its puts in flight are awaited at stop and it is closed before the arena.

Metrics: every request's time is observed per operation in ``handle_message``; the store's gauges and counters
are read from a ``stats()`` snapshot taken on the event loop when Prometheus scrapes (``kvstore/metrics/``).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import threading
import time
from typing import Any

import zmq
from prometheus_client import CollectorRegistry

from .. import logs
from .._version import __version__
from ..config import ServerConfig, redact_url
from ..errors import ConfigError, InternalError, RequestError, UnavailableError, VersionError
from ..metrics.collector import StatsCollector
from ..metrics.exporter import MetricsExporter
from ..metrics.latency import RequestLatency
from ..protocol.wire import Op, decode_header, error_reply, op_of, request_id_of
from ..protocol.index_layout import REMOTE, supported as shared_index_supported
from ..store.gpu_mover import GpuMover
from ..store.published_index import PublishedIndex, index_path_for
from ..store.manager import TierManager
from ..store.remote_mover import RemoteMover
from ..security.curve import ServerCurve
from ..store.store import Store
from ..tiers.disk import DiskTier, auto_disk_size
from ..tiers.arena import SharedArena, arena_path_for
from ..tiers.host import HostTier
from .handlers import HANDLERS, hello_reply
from .notify import notify, watchdog_interval
from .reactor import SocketReactor
from .session import Session
from .stream import SUFFIX as STREAM_SUFFIX, StreamServer

SWEEP_INTERVAL = 0.25
REMOTE_NAMESPACE = "kvstore"   # store-wide: chunk keys already commit to each client's namespace
REMOTE_TIMEOUT = 1.0           # deadline of a remote metadata call (data calls add bytes / 256 MiB/s)
REMOTE_RETRY = 1.0             # while the remote store is down, probe it at most this often
REMOTE_MAX_PENDING = 1 << 30   # bytes of background puts in flight (and pinned), at most a quarter of DRAM
SNAPSHOT_TIMEOUT = 5.0
# While stopping, requests that would start new work are refused; these finish work already started.
FINISHING_OPS = frozenset({Op.PING, Op.COMMIT, Op.ABORT, Op.RELEASE, Op.EXTEND, Op.DELETE, Op.CLEAR, Op.STATS})


class Daemon:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.sessions: dict[bytes, Session] = {}
        self.started = time.time()
        self.lookup_tokens = 0
        self.hit_tokens = 0
        self.requests = 0
        self.errors = 0
        self._lock_fd: int | None = None
        self._ctx = zmq.Context()
        self._sockets: list[tuple[str, zmq.Socket]] = []
        self._reactors: list[SocketReactor] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False      # refuse new work (see FINISHING_OPS)
        self._curve: ServerCurve | None = None  # CURVE on tcp:// (security/curve.py), when configured
        self.store: Store  # set in open()
        self.registry = CollectorRegistry()
        self.latency = RequestLatency(self.registry)
        self.registry.register(StatsCollector(self.stats_snapshot))
        self._exporter: MetricsExporter | None = None
        self._tasks: set[asyncio.Task] = set()
        self._disk_lock_fd: int | None = None
        self.manager: TierManager | None = None
        self.gpu_mover: GpuMover | None = None
        self.gpu_hello: dict[str, Any] | None = None   # the HELLO reply's "gpu" field (exported once)
        self.remote: RemoteMover | None = None
        self.index: PublishedIndex | None = None       # the lookup index clients read in shared memory
        self.stream: StreamServer | None = None        # the local stream socket (server/stream.py)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Everything that can fail with a clear message before serving: lock, arena, sockets."""
        self._prepare_socket_dir()
        self._take_lock()
        arena = SharedArena.create(arena_path_for(self.config.socket), self.config.host_mem)
        try:
            gpu = self._open_gpu(arena)
        except BaseException:
            arena.close()
            raise
        self.store = Store(HostTier(arena), self.config.lease_ttl, self.config.reserve_ttl, disk=self._open_disk(),
                           gpu=gpu, policy=self.config.eviction_policy)
        self._open_index()
        if gpu is not None:
            self.gpu_mover = GpuMover(self.store, gpu)
            self.gpu_hello = gpu.hello_info()
        if self.store.disk is not None:
            self._rebuild_index(self.store.disk)
            self.manager = TierManager(self.store, self.store.disk, self.config.disk_io_depth,
                                       self.config.disk_queue_limit)
        if self.config.remote:
            self.remote = RemoteMover(self.store, self._open_remote(), self.config.chunk_limit)
        self._bind("ipc", "ipc://" + self.config.socket)
        if self.config.tcp:
            if self.config.curve_server_key:
                self._curve = ServerCurve(self.config.curve_server_key, self.config.curve_client_keys)
                self._curve.start(self._ctx)
            self._bind("tcp", "tcp://" + self.config.tcp)

    def _open_index(self) -> None:
        """Publish the lookup index in shared memory (x86-64 only: see protocol/index_layout.py)."""
        if shared_index_supported():
            self.index = PublishedIndex(index_path_for(self.config.socket), self.config.host_mem >> 16)
            self.index.set_flag(REMOTE, bool(self.config.remote))
            self.store.published = self.index

    @property
    def index_path(self) -> str | None:
        return self.index.path if self.index is not None else None

    def _open_gpu(self, arena: SharedArena) -> Any:
        """The GPU tier on ``cuda:N`` (or on cpu under the testing switch, ``gpu/settings.py``), or None."""
        if not self.config.gpu_mem:
            return None
        from ..gpu.settings import TEST_DEVICE_ENV, tier_device  # imports torch: only with a GPU tier
        from ..gpu.tier import GpuTier

        device = tier_device(self.config.gpu_device)
        shared = arena_path_for(self.config.socket + "#gpu") if device == "cpu" else None
        if shared is not None:
            logs.warning("gpu_tier_on_cpu", reason=f"{TEST_DEVICE_ENV}=cpu: a CPU-backed GPU tier, for tests only")
        gpu = GpuTier(self.config.gpu_mem, device, arena.buf, arena.size, shared_path=shared)
        logs.info("gpu_tier", device=str(gpu.device), capacity_bytes=gpu.capacity_bytes,
                  host_pinned=bool(gpu.pinned and gpu.pinned.pinned))
        return gpu

    def _open_remote(self) -> Any:
        """The remote store's backend (constructing it never waits for the store)."""
        from ..remote import RemoteError, open_backend   # imports the store's client library: only when asked

        try:
            backend = open_backend(self.config.remote, namespace=REMOTE_NAMESPACE, timeout=REMOTE_TIMEOUT,
                                   retry_interval=REMOTE_RETRY,
                                   max_pending_bytes=min(REMOTE_MAX_PENDING, self.config.host_mem // 4))
        except (RemoteError, ValueError) as exc:
            raise ConfigError(f"--remote: {exc}") from None
        zero_copy = backend.register_memory(self.store.host.arena.buf)
        logs.info("remote_tier", url=redact_url(self.config.remote), zero_copy=zero_copy)
        return backend

    def _open_disk(self) -> DiskTier | None:
        if not self.config.disk_enabled:
            return None
        directory = self.config.disk_dir
        size = self.config.disk_size if self.config.disk_size > 0 else auto_disk_size(directory)
        disk = DiskTier(directory, size, compress=self.config.disk_compression == "lz4")
        self._disk_lock_fd = exclusive_lock(
            os.path.join(disk.directory, ".lock"),
            f"--disk-dir: another kvstore daemon uses {disk.directory}; give each daemon its own --disk-dir")
        return disk

    def _rebuild_index(self, disk: DiskTier) -> None:
        """Index every valid chunk file, oldest first (so the disk LRU order survives a restart)."""
        started = time.monotonic()
        found = disk.scan()
        adopted = 0
        for header, _mtime in sorted(found.chunks, key=lambda c: c[1]):
            if self.store.adopt(header.key, header.raw_len, header.namespace, disk.footprint(header.stored_len)):
                adopted += 1
            else:
                disk.remove(header.key)  # over a lowered cap, or a duplicate
        elapsed = time.monotonic() - started
        for name, reason in found.quarantined:
            logs.warning("disk_file_quarantined", file=name, reason=reason)
        if found.foreign:
            logs.warning("disk_foreign_files_ignored", count=len(found.foreign), first=found.foreign[0])
        self.store.tier_counters.quarantined += len(found.quarantined)
        logs.info("disk_index_rebuilt", directory=disk.directory, chunks=adopted, dropped=len(found.chunks) - adopted,
                  quarantined=len(found.quarantined), foreign=len(found.foreign), temps_removed=found.temps_removed,
                  seconds=round(elapsed, 3), chunks_per_s=round(len(found.chunks) / elapsed) if elapsed else 0,
                  direct_io=disk.direct, capacity_bytes=disk.capacity_bytes, used_bytes=disk.used_bytes)

    def _prepare_socket_dir(self) -> None:
        directory = os.path.dirname(os.path.abspath(self.config.socket))
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--socket: cannot create directory {directory}: {exc.strerror}") from None
        if not os.access(directory, os.W_OK | os.X_OK):
            raise ConfigError(f"--socket: directory {directory} is not writable; choose another --socket")

    def _take_lock(self) -> None:
        self._lock_fd = exclusive_lock(
            self.config.socket + ".lock",
            f"another kvstore daemon is already serving on {self.config.socket}; "
            f"stop it first or choose another --socket")
        if os.path.exists(self.config.socket):
            logs.warning("stale_socket_removed", path=self.config.socket)
            os.unlink(self.config.socket)

    def _bind(self, transport: str, address: str) -> None:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, -1)
        if transport == "tcp" and self._curve is not None:
            self._curve.apply(sock)
        old_umask = os.umask(0o077)  # the ipc socket file is owner-only from its first moment
        try:
            sock.bind(address)
        except zmq.ZMQError as exc:
            sock.close()
            flag = "--socket" if transport == "ipc" else "--tcp"
            raise ConfigError(f"{flag}: cannot listen on {address}: {exc}") from None
        finally:
            os.umask(old_umask)
        self._sockets.append((transport, sock))

    def close(self) -> None:
        if self._exporter is not None:
            self._exporter.stop()
            self._exporter = None
        for _, sock in self._sockets:
            sock.close(linger=0)
        self._sockets.clear()
        if self.stream is not None:
            self.stream.remove_file()   # its connections were closed on the loop (shutdown)
        if self._curve is not None:
            self._curve.stop()
        self._ctx.term()
        if self._lock_fd is not None:  # only the lock holder owns the socket file
            self._remove_socket_file()
        if self.manager is not None:
            self.manager.close()
        if self.remote is not None:
            self.remote.close()   # its workers read and write the arena: before the arena is unmapped
        if getattr(self, "store", None) is not None:
            if self.gpu_mover is not None:
                self.gpu_mover.close()
            if self.store.gpu is not None:
                self.store.gpu.close()   # unpins the arena: before the arena is unmapped
            if self.index is not None:
                self.store.published = None
                self.index.close()
            self.store.host.close()
        if self._disk_lock_fd is not None:
            os.close(self._disk_lock_fd)
            self._disk_lock_fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _remove_socket_file(self) -> None:
        try:
            os.unlink(self.config.socket)
        except FileNotFoundError:
            pass

    def _start_metrics(self) -> None:
        if self.config.metrics_port:
            self._exporter = MetricsExporter(self.registry, self.config.metrics_host, self.config.metrics_port)
            self._exporter.start()
            logs.info("metrics_listening", url=self._exporter.url)

    async def serve(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if self.manager is not None:
            self.manager.start(loop)
        if self.remote is not None:
            self.remote.start(loop)
        self._start_metrics()
        self._reactors = [SocketReactor(loop, t, s, self.handle_message, self._tasks) for t, s in self._sockets]
        for reactor in self._reactors:
            reactor.start()
        await self._start_stream(loop)
        background = [asyncio.create_task(self._sweep_loop())]
        if self.gpu_mover is not None:
            background.append(self.gpu_mover.start(loop))
        interval = watchdog_interval()
        if interval is not None:
            background.append(asyncio.create_task(self._watchdog_loop(interval)))
        logs.info("ready", pid=os.getpid(), config=self.config.describe())
        self.on_ready()
        await stop.wait()
        await self.shutdown()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)

    async def _start_stream(self, loop: asyncio.AbstractEventLoop) -> None:
        stream = StreamServer(self, self.config.socket + STREAM_SUFFIX)
        if await stream.start(loop):
            self.stream = stream

    @property
    def stream_path(self) -> str | None:
        return self.stream.path if self.stream is not None and self.stream.listening else None

    def track_task(self, task: asyncio.Task) -> None:
        """A reply that had to wait runs as a task; stopping waits for these."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def on_ready(self) -> None:
        """The sockets accept requests: tell the service manager (a no-op without NOTIFY_SOCKET)."""
        notify("READY=1", f"MAINPID={os.getpid()}", f"STATUS=serving on {self.config.socket}")

    async def _watchdog_loop(self, interval: float) -> None:
        while True:
            notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def shutdown(self) -> None:
        """The bounded stop sequence described in the module docstring."""
        loop = asyncio.get_running_loop()
        timeout = self.config.shutdown_timeout
        deadline = loop.time() + timeout
        _arm_hard_stop(2 * timeout + 1)
        self.stopping = True
        if self.index is not None:
            self.index.close_to_readers()   # lookups go to the socket, which refuses them
        notify("STOPPING=1", "STATUS=stopping")
        self._remove_socket_file()  # no new local client can connect from here on
        if self.stream is not None:
            self.stream.stop_accepting()
        logs.info("stopping", sessions=len(self.sessions), leases=len(self.store.leases),
                  reservations=len(self.store.reservations), timeout=timeout)
        while len(self.store.reservations) and loop.time() < deadline:
            await asyncio.sleep(0.01)  # puts being written get until the deadline to commit or abort
        for reactor in self._reactors:
            reactor.stop()  # what is already queued stays in the socket and is answered next
        if self.stream is not None:
            self.stream.pause()   # the stream has no queue: what it read was answered as it came
        answered = 0
        for reactor in self._reactors:
            answered += await reactor.answer_queued(deadline)
        unfinished = len(self.store.reservations)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=max(0.0, deadline - loop.time()))
        if self.gpu_mover is not None:
            await self.gpu_mover.drain()
        if self.remote is not None:
            sent = await self.remote.drain(max(0.0, deadline - loop.time()))
            logs.info("remote_drained", complete=sent)
        if self.manager is not None:
            started = time.monotonic()
            queued = self.store.dirty_bytes
            flushed = await self.manager.flush()
            logs.info("disk_flushed", complete=flushed, bytes=queued, seconds=round(time.monotonic() - started, 3))
        self._flush_store()
        if self.stream is not None:
            self.stream.close()
        logs.info("drained", answered=answered, unfinished_reservations=unfinished,
                  took_s=round(timeout - (deadline - loop.time()), 3))

    def _flush_store(self) -> None:
        """Persist what the store's guarantee needs before exit, where the store has such a step."""
        flush = getattr(self.store, "flush", None)
        if callable(flush):
            flush()

    def stats_snapshot(self) -> dict[str, Any]:
        """``stats()`` taken on the event loop, callable from any thread (the metrics exporter's)."""
        loop = self._loop
        if loop is None or not loop.is_running() or _on_loop_thread(loop):
            return self.stats()

        async def take() -> dict[str, Any]:
            return self.stats()

        return asyncio.run_coroutine_threadsafe(take(), loop).result(SNAPSHOT_TIMEOUT)

    # -- requests -------------------------------------------------------------------------------------------
    async def _finish(self, rid: int | None, op: Op, started: float, pending: Any) -> list[Any]:
        """Await a handler that had to wait (disk reads, write-back back-pressure)."""
        try:
            reply = await pending
        except Exception as exc:
            reply = self._failure_reply(rid, exc)
        self.latency.observe(op, time.perf_counter() - started)
        return reply

    def _failure_reply(self, rid: int | None, exc: Exception) -> list[Any]:
        """The one place an exception becomes an error reply: request errors as they are, anything else as an
        InternalError (a bug: answered and logged, and the daemon keeps serving)."""
        self.errors += 1
        if isinstance(exc, RequestError):
            logs.debug("request_error", error=type(exc).__name__, msg=exc.message)
            return [error_reply(rid, exc)]
        logs.error("internal_error", error=repr(exc))
        return [error_reply(rid, InternalError(f"internal error: {exc!r}"))]

    def handle_message(self, transport: str, msg: list[Any]) -> Any:
        """Handle one received ZeroMQ multipart message; return the reply frames (routing id first), or a
        coroutine returning them when the handler has to wait (it runs as a task; the loop keeps serving)."""
        if len(msg) < 2:
            return None  # nothing to answer: no routing id and header
        routing_id = msg[0].bytes
        reply = self.handle_request(transport, transport[0].encode() + routing_id, msg[1].buffer, msg[2:])
        if type(reply) is not list:
            return _routed(routing_id, reply)
        return [routing_id] + reply

    def handle_request(self, transport: str, owner: bytes, raw_header: Any, payload: list[Any]) -> Any:
        """Handle one request of ``owner`` (whatever carried it); return the reply frames (header first), or a
        coroutine returning them."""
        rid: int | None = None
        op: Op | None = None
        self.requests += 1
        started = time.perf_counter()
        try:
            header = decode_header(raw_header)
            rid = request_id_of(header)
            op = op_of(header)
            if self.stopping and op not in FINISHING_OPS:
                raise UnavailableError("the daemon is shutting down; retry once it is back")
            if op is Op.HELLO:
                session, reply = hello_reply(self, owner, transport, header)
                self._add_session(session)
            else:
                session = self.sessions.get(owner)
                if session is None:
                    raise VersionError("send HELLO (protocol version and namespace) before any other request")
                reply = HANDLERS[op](self, session, header, payload)
                if type(reply) is not list:   # a coroutine: the handler has to wait
                    return self._finish(rid, op, started, reply)
        except Exception as exc:
            reply = self._failure_reply(rid, exc)
        if op is not None:
            self.latency.observe(op, time.perf_counter() - started)
        return reply

    def _add_session(self, session: Session) -> None:
        old = self.sessions.get(session.owner)
        if old is not None:
            self.store.drop_owner(old.owner)
        self.sessions[session.owner] = session
        logs.debug("hello", client_id=session.client_id, namespace=session.namespace, transport=session.transport)

    def count_lookup_tokens(self, session: Session, asked: int, found: int) -> None:
        self.lookup_tokens += asked * session.chunk_tokens
        self.hit_tokens += found * session.chunk_tokens

    # -- background -----------------------------------------------------------------------------------------
    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            self.sweep()

    def sweep(self) -> None:
        if self.index is not None:
            self.index.beat()
        if self.manager is not None:
            self.store.rebalance()
            self.manager.check_space()
        leases, reservations = self.store.expire()
        if leases or reservations:
            logs.info("expired", leases=leases, reservations=reservations)
        for owner, session in list(self.sessions.items()):
            if session.process_gone():
                self.drop_session(owner, "process_gone")

    def drop_session(self, owner: bytes, reason: str) -> None:
        """A client is gone (its process died, or its stream closed): drop its pins now."""
        session = self.sessions.pop(owner, None)
        if session is None:
            return
        leases, reservations = self.store.drop_owner(owner)
        if leases or reservations or reason != "connection_closed":
            logs.info("client_gone", client_id=session.client_id, pid=session.pid, reason=reason,
                      leases=leases, reservations=reservations)

    def stats(self) -> dict[str, Any]:
        usage = self.store.host.usage()
        counters = self.store.counters
        return {
            "version": __version__,
            "uptime_s": round(time.time() - self.started, 3),
            "tiers": self._tier_stats(usage),
            "chunks": self.store.committed_chunks(),
            "lookup_tokens": self.lookup_tokens,
            "hit_tokens": self.hit_tokens,
            "counters": {**counters.__dict__, **self.store.tier_counters.__dict__},
            "disk": self.manager.stats() if self.manager is not None else None,
            "gpu": self.gpu_mover.stats() if self.gpu_mover is not None else None,
            "remote": self.remote.stats() if self.remote is not None else None,
            "leases": len(self.store.leases),
            "reservations": len(self.store.reservations),
            "sessions": len(self.sessions),
            "requests": self.requests,
            "errors": self.errors,
            "auth_rejected": self._curve.allow.rejected if self._curve is not None else 0,
        }


    def _tier_stats(self, usage: Any) -> dict[str, dict[str, int]]:
        tiers = {"host": {"capacity_bytes": usage.capacity_bytes, "used_bytes": usage.used_bytes,
                          "chunks": usage.chunks}}
        disk = self.store.disk
        if disk is not None:
            tiers["disk"] = {"capacity_bytes": disk.capacity_bytes, "used_bytes": disk.used_bytes,
                             "chunks": disk.chunks}
        gpu = self.store.gpu
        if gpu is not None:
            used = gpu.usage()
            tiers = {"gpu": {"capacity_bytes": used.capacity_bytes, "used_bytes": used.used_bytes,
                             "chunks": used.chunks, "device": str(gpu.device)}, **tiers}
        return tiers


async def _routed(routing_id: bytes, pending: Any) -> list[Any]:
    return [routing_id] + await pending


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _arm_hard_stop(seconds: float) -> None:
    """End the process if the graceful stop has not finished after ``seconds`` (a hung step must not pin it)."""
    def overrun() -> None:
        logs.error("shutdown_overrun", after_s=seconds)
        os._exit(1)

    timer = threading.Timer(seconds, overrun)
    timer.daemon = True
    timer.start()


def exclusive_lock(path: str, held_message: str) -> int:
    """Hold an exclusive flock on ``path`` for the process's life (the kernel drops it if we crash)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(held_message) from None
    return fd


def run_daemon(config: ServerConfig) -> int:
    """Run until SIGTERM/SIGINT. Returns the process exit code."""
    try:
        import uvloop
        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        pass
    daemon = Daemon(config)
    try:
        daemon.open()
        asyncio.run(daemon.serve())
    finally:
        daemon.close()
    logs.info("stopped")
    return 0
