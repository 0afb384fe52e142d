"""The daemon process: its sockets, its event loop and the lifecycle (the requests: ``dispatcher.py``).

Start (``open``): check the socket path (only a stale socket of ours is ever replaced, ``startup.py``), take
an exclusive lock next to the socket (a second daemon on the same socket refuses to start; a crashed daemon's
lock dies with it, so its stale socket and arena are removed) and one in the disk directory, create the shared
arena, bind a ZeroMQ ROUTER on ipc:// (and optionally tcp://), then serve. Every step puts what it took on one
exit stack, so a failure at any step gives back everything taken before it, newest first (the arena in
/dev/shm, the locks, the socket, and the directories start-up created), and a normal stop closes the same stack.
Every request goes to one dispatcher (``dispatcher.py``: handlers, sessions, refusals at stop), whichever socket
carried it. A sweeper expires leases and reservations and reclaims the pins of local clients whose process died.

Stop (SIGTERM or SIGINT), every step bounded by its share of ``shutdown_timeout`` (``stopping.py``): tell the
service manager (``STOPPING=1``), remove the socket file so that no new local client can connect, answer every
request still waiting on the disk or the remote store with ``UnavailableError`` at once, and refuse requests
that start new work (hello, lookup, reserve, put, get) the same way while still answering those that finish
work (commit, abort, release, ...), until no reservation is outstanding: a put that was being written
completes. The sockets keep answering (new work refused) while the remote store and the disk are flushed, so no
client waits out its timeout on a daemon that is going away; then what is queued is answered, the stack is
closed (sockets, arena) and the process exits 0. Should any step hang, a timer removes the socket and arena
files and ends the process (exit 1) when the budget is spent.

Tiers below DRAM (``tier_setup.open_tiers``): each is a ledger inside the Store and a mover owned by the service
(``tiers/mover_life.py``: start, wake, drain(deadline), close, stats). The movers start with the loop and are
drained at stop (``Service.drain_movers``: GPU copies and remote puts by the "remote" deadline, the write-back
queue by the "disk" one), then closed with the claims, before the arena (a GPU tier unpins it; the remote
backend's workers read it). A remote store that is down at start is an outage, not an error.

Local clients (``local_access.py``): the Store publishes its lookup index in shared memory, and requests also
arrive on a Unix stream socket next to the ZeroMQ one (one session per connection, its pins dropped when it
closes); both go through ``RequestDispatcher.handle_request``, and both close with the ZeroMQ socket at stop.

Metrics: every request's time is observed per operation by the dispatcher; the store's gauges and counters are
read from a ``stats()`` snapshot taken on the event loop when Prometheus scrapes (``kvstore/metrics/``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import TYPE_CHECKING, Any, Callable, Coroutine

import zmq
from prometheus_client import CollectorRegistry

from ... import logs, native
from ...config import ServerConfig
from ...errors import ConfigError
from ...metrics.collector import StatsCollector
from ...metrics.exporter import MetricsExporter
from ...metrics.latency import RequestLatency
from ...security.curve import ServerCurve
from ...store.adoption import keep_arena, open_host_arena, open_journal, take_kept_slots
from ...tiers.host.journal import journal_path_for
from ...tiers.host.tier import HostTier
from ...tenants.key_file import open_tenant_keys
from .dispatcher import RequestDispatcher
from .heap import HeapWatch, settle_heap
from .notify import notify, watchdog_interval
from ..transport.reactor import SocketReactor
from ..transport.tcp_peers import TcpPeers, set_heartbeat
from ..requests.reload import ConfigSource, ReloadReport, reload_tenants
from ..requests.service import Service
from ..requests.stats import connector_stats, daemon_stats
from .startup import (Claims, bind_failure, check_socket_dir, check_socket_path, check_writable_dir,
                      exclusive_lock, remove_stale_socket, share_socket_dir)
from .stopping import StopPlan, arm_forced_exit
from .local_access import open_stream
from ..transport.stream import StreamServer

if TYPE_CHECKING:
    from ...tenants.table import TenantTable
from .tier_setup import open_disk, open_tiers

SWEEP_INTERVAL = 0.25
SNAPSHOT_TIMEOUT = 5.0


class Daemon:
    def __init__(self, config: ServerConfig, tenants: "TenantTable | None" = None,
                 source: ConfigSource | None = None) -> None:
        self.config = config
        self.tenants = tenants              # the config file's tenants table at start, or None (one shared tenant)
        self.source = source                # the config file and flags, read again by a reload (reload.py)
        self.svc: Service                   # what handlers may touch: store, tiers, config, counters (``open``)
        self.dispatcher: RequestDispatcher  # every request's way to its handler, and the sessions (``open``)
        self._claims = Claims()             # what start-up took (startup.py), released by close(), newest first
        self.stop_plan = StopPlan.from_budget(config.shutdown_timeout)
        self._remote_close_wait = 1.0       # seconds the remote backend may take to close (set by the stop)
        self._ctx = zmq.Context()
        self._sockets: list[tuple[str, zmq.Socket]] = []
        self._reactors: list[SocketReactor] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.registry = CollectorRegistry()
        self.latency = RequestLatency(self.registry)
        self.registry.register(StatsCollector(self.stats_snapshot))
        self._exporter: MetricsExporter | None = None
        self.heap = HeapWatch()             # the garbage collector's pauses on the loop (heap.py)
        self._tasks: set[asyncio.Task] = set()
        self.stream: StreamServer | None = None        # the local stream socket (server/transport/stream.py)
        self._clean_stop = False   # the stop drained everything: the arena may be kept for the next start

    # -- lifecycle ------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Everything that can fail with a clear message before serving; on failure, give it all back. Then what
        start-up made is frozen out of the garbage collector's walks (``heap.py``)."""
        try:
            self._open_steps()
        except BaseException:
            self._claims.give_back()
            raise
        self._claims.keep_dirs()
        settle_heap()
        self.heap.install()
        self._claims.take(self.heap.uninstall)

    def _open_steps(self) -> None:
        native.enabled()   # a bad KVSTORE_NATIVE fails here, before anything is created
        claims, take = self._claims, self._claims.take
        take(self._ctx.term)   # the very last release: after every socket is closed
        path = self.config.socket
        check_socket_path(path)   # before anything is created: only a socket may be replaced
        created = claims.private_dirs(os.path.dirname(path), "--socket")
        check_writable_dir(os.path.dirname(path), "--socket")
        check_socket_dir(path)
        if self.config.socket_group is not None:   # the stream socket is given to it when bound (stream.py)
            share_socket_dir(path, self.config.socket_group, created)
        claims.hold(exclusive_lock(path + ".lock", f"another kvstore daemon is already serving on {path}; "
                                   f"stop it first or choose another --socket", "--socket"))
        remove_stale_socket(path)
        disk = open_disk(self.config, claims)   # before the arena: a directory in use costs no memory to refuse
        kept = open_host_arena(path, self.config.host_mem, self.config.chunk_limit, self.config.adopt,
                               reserve_all=bool(self.config.gpu_mem))
        arena = kept.arena
        host = HostTier(arena)
        take_kept_slots(host, kept)   # before anything allocates: the kept chunks' slots are theirs
        take(self._close_host, host)
        claims.leftovers.append(arena.path)
        if self.config.adopt:   # what a crash leaves for the next start (tiers/host/journal.py)
            open_journal(host, path)
            claims.leftovers.append(journal_path_for(arena.path))
        tenant_keys = open_tenant_keys(self.config, self.tenants)   # before the tiers: a bad file costs nothing
        tiers = open_tiers(self.config, self.tenants, host, disk, arena, claims, lambda: self._remote_close_wait,
                           kept)
        self.svc = Service(self.config, tiers, self.tenants, stats=self.stats, stream_path=self._stream_path,
                           reload=self.reload if self.source is not None else None, tenant_keys=tenant_keys)
        self.dispatcher = RequestDispatcher(self.svc, self.latency)
        take(self._remove_socket_file)   # after the ipc socket is closed (registered below)
        self._bind("ipc", "ipc://" + path)
        claims.leftovers.append(path)
        if self.config.tcp:
            if self.config.curve_server_key:
                curve = self.dispatcher.curve = ServerCurve(self.config.curve_server_key,
                                                            self.config.curve_client_keys)
                curve.start(self._ctx)
                take(curve.stop)
            self._bind("tcp", "tcp://" + self.config.tcp)
        self._start_metrics()   # a port in use is a start-up failure like any other

    def _close_host(self, host: HostTier) -> None:
        """The last step of a stop: after a clean one (and unless ``--no-adopt``) the arena stays in /dev/shm with
        its description, for the next daemon on this socket to adopt (``store/adoption.py``)."""
        keep = self._clean_stop and self.config.adopt
        if keep:
            try:
                keep_arena(self.svc.store, self.svc.adoption.waiting if self.svc.adoption else [],
                           self.config.socket)
            except OSError as exc:
                logs.error("arena_not_kept", error=exc.strerror or repr(exc))
                keep = False
        host.close(keep=keep)

    def _bind(self, transport: str, address: str) -> None:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, -1)
        if transport == "tcp":
            set_heartbeat(sock, self.config.tcp_heartbeat)
            if self.dispatcher.curve is not None:
                self.dispatcher.curve.apply(sock)
        old_umask = os.umask(0o077)  # the ipc socket file is owner-only from its first moment
        try:
            sock.bind(address)
        except zmq.ZMQError as exc:
            sock.close()
            raise ConfigError(bind_failure(transport, address, exc)) from None
        finally:
            os.umask(old_umask)
        self._sockets.append((transport, sock))
        self._claims.take(sock.close, linger=0)
        if transport == "tcp":
            peers = self.dispatcher.tcp_peers = TcpPeers(sock, self.dispatcher.drop_session)
            self._claims.take(peers.close)

    def close(self) -> None:
        """Release everything ``open`` and ``serve`` took, newest first (safe to call again)."""
        self._claims.release_all()
        self._sockets.clear()

    def _remove_socket_file(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.config.socket)

    def _start_metrics(self) -> None:
        if self.config.metrics_port:
            self._exporter = MetricsExporter(self.registry, self.config.metrics_host, self.config.metrics_port)
            self._exporter.start()
            self._claims.take(self._exporter.stop)
            logs.info("metrics_listening", url=self._exporter.url)

    async def serve(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if self.source is not None:
            loop.add_signal_handler(signal.SIGHUP, self.reload)   # the outcome is logged (reload.py)
        for mover in self.svc.movers():
            mover.start(loop)
        if self.svc.adoption is not None:
            self.svc.adoption.start(loop)   # kept chunks are published as their checksums match
        if self.svc.events is not None:
            self.svc.events.start(loop)   # snapshots are taken on the loop from here on
        requests, peers = self.dispatcher, self.dispatcher.tcp_peers
        if peers is not None:
            peers.start(loop)
        self._reactors = [SocketReactor(loop, t, s, requests.handle_message, self._tasks, requests.after_reply,
                                        peers.poll if t == "tcp" and peers else None)
                          for t, s in self._sockets]
        for reactor in self._reactors:
            reactor.start()
        self.stream = await open_stream(requests, self.config, loop, self._claims, self._tasks)
        background = [asyncio.create_task(self._sweep_loop()),
                      *self.svc.safeguards.start(loop, self.svc.remote, self.svc.gpu_mover)]
        interval = watchdog_interval()
        if interval is not None:
            background.append(asyncio.create_task(self._watchdog_loop(interval)))
        logs.info("ready", pid=os.getpid(), **self.svc.store.host.memory_fields(), native=native.describe(),
                  **self._adoption_fields(),
                  config=self.config.describe(**self._sizes_in_force()))
        self.on_ready()
        await stop.wait()
        await self.shutdown()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)

    def _adoption_fields(self) -> dict[str, Any]:
        """What the ``ready`` line says of the kept arena: what is being verified, or why nothing was adopted."""
        adoption = self.svc.adoption
        if adoption is None:
            return {}
        r = adoption.report
        if r.state in ("verifying", "done"):
            return {"adoption": r.state, "adoption_source": r.source, "kept_chunks": r.listed_chunks - r.unfit_chunks,
                    "kept_bytes": r.listed_bytes, "unfit_chunks": r.unfit_chunks}
        return {"adoption": r.state, "adoption_reason": r.reason}

    def _sizes_in_force(self) -> dict[str, int]:
        """Settings whose configured value means "derive it" (0, auto), as the daemon derived them."""
        disk = self.svc.store.disk
        return {"disk_size": disk.capacity_bytes if disk is not None else 0,
                "disk_queue": self.config.disk_queue_limit if disk is not None else 0,
                "max_chunk": self.config.chunk_limit}

    def on_ready(self) -> None:
        """The sockets accept requests: tell the service manager (a no-op without NOTIFY_SOCKET)."""
        notify("READY=1", f"MAINPID={os.getpid()}", f"STATUS=serving on {self.config.socket}")

    async def _watchdog_loop(self, interval: float) -> None:
        while True:
            notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def shutdown(self) -> None:
        """The bounded stop sequence described in the module docstring (deadlines: ``self.stop_plan``)."""
        loop = asyncio.get_running_loop()
        plan, began = self.stop_plan, loop.time()

        def left(step: str) -> float:
            return plan.remaining(step, loop.time() - began)

        arm_forced_exit(plan.forced, lambda: list(self._claims.leftovers))
        self.dispatcher.stop_new_work()   # requests waiting on the disk or the remote store: UnavailableError now
        if self.svc.index is not None:
            self.svc.index.close_to_readers()   # lookups go to the socket, which refuses them
        notify("STOPPING=1", "STATUS=stopping")
        self._remove_socket_file()  # no new local client can connect from here on
        if self.stream is not None:
            self.stream.stop_accepting()
        logs.info("stopping", sessions=len(self.dispatcher.sessions), leases=len(self.svc.store.leases),
                  reservations=len(self.svc.store.puts.reservations), timeout=self.config.shutdown_timeout)
        while len(self.svc.store.puts.reservations) and left("drain") > 0:
            await asyncio.sleep(0.01)  # puts being written get until the drain deadline to commit or abort
        unfinished = len(self.svc.store.puts.reservations)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=left("drain"))
        self.svc.store.puts.settle_after_reply()
        await self.svc.drain_movers(lambda step: time.monotonic() + left(step))
        for reactor in self._reactors:
            reactor.stop()  # what is already queued stays in the socket and is answered next
        if self.stream is not None:
            self.stream.pause()   # the stream has no queue: what it read was answered as it came
        answered = 0
        for reactor in self._reactors:
            answered += await reactor.answer_queued(began + plan.close)
        if self.stream is not None:
            self.stream.close()
        self._remote_close_wait = left("close")
        self._clean_stop = left("close") > 0
        logs.info("drained", answered=answered, unfinished_reservations=unfinished,
                  took_s=round(loop.time() - began, 3))

    def stats_snapshot(self) -> dict[str, Any]:
        """``stats()`` taken on the event loop, callable from any thread (the metrics exporter's)."""
        loop = self._loop
        if loop is None or not loop.is_running() or _on_loop_thread(loop):
            return self.stats()

        async def take() -> dict[str, Any]:
            return self.stats()

        return asyncio.run_coroutine_threadsafe(take(), loop).result(SNAPSHOT_TIMEOUT)

    # -- background -----------------------------------------------------------------------------------------
    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            self.sweep()

    def sweep(self) -> None:
        self.svc.store.puts.settle_after_reply()
        if self.svc.index is not None:
            self.svc.index.beat()
        if self.svc.disk_mover is not None:
            self.svc.disk_mover.ledger.rebalance()
            self.svc.disk_mover.check_space()
        overdue_before = self.svc.store.leases.overdue
        leases, reservations = self.svc.store.expire(keep_leases_of=self.dispatcher.process_alive)
        if leases or reservations:
            logs.info("expired", leases=leases, reservations=reservations)
        if self.svc.store.leases.overdue > overdue_before:
            logs.warning("leases_overdue", leases=self.svc.store.leases.overdue - overdue_before,
                         reason="held past --lease-ttl by live local clients; kept until released or the "
                                "client's process ends")
        self.dispatcher.drop_gone_sessions()

    def reload(self) -> ReloadReport:
        """Read the config file's tenants table again and apply it, or keep the one in force (``reload.py``)."""
        return reload_tenants(self.svc, self.source or ConfigSource())

    def stats(self) -> dict[str, Any]:
        sessions = self.dispatcher.sessions
        return {**daemon_stats(self.svc, len(sessions), self.auth_rejected(), connector_stats(sessions.values())),
                "gc": self.heap.stats()}

    def _stream_path(self) -> str | None:
        return self.stream.path if self.stream is not None and self.stream.listening else None

    def auth_rejected(self) -> int:
        curve = self.dispatcher.curve
        return curve.allow.rejected if curve is not None else 0


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def run_daemon(config: ServerConfig, tenants: "TenantTable | None" = None, source: ConfigSource | None = None) -> int:
    """Run until SIGTERM/SIGINT (``tenants``: the config file's tenants table; ``source``: that file and the flags,
    read again at SIGHUP and ``kvstore reload``). Returns the process exit code."""
    run_loop: Callable[[Coroutine[Any, Any, Any]], Any]
    try:
        from uvloop import run as uvloop_run
        run_loop = uvloop_run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        run_loop = asyncio.run
    daemon = Daemon(config, tenants, source)
    try:
        daemon.open()
        run_loop(daemon.serve())
    finally:
        daemon.close()
    logs.info("stopped")
    return 0
