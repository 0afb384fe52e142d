"""Every metric the daemon exports, defined once: name, type, help, labels and where its value comes from.

The exporter (``collector.py``, ``latency.py``), the alert rules (``alerts.py``) and the Grafana dashboard
(``dashboard.py``) are all generated from ``METRICS``, so a rule or a panel can never name a metric that does not
exist.

Where values come from. Gauges and counters of the store are not kept twice: the collector reads the daemon's
``stats()`` dict at scrape time, flattens it to dotted paths (``tiers.host.used_bytes``,
``counters.promotions_disk_host``) and matches each path against the metric's ``sources``, templates whose
``{label}`` fields capture one tier name each (``[a-z0-9]+``, so tier names never contain ``_``). The first
source that yields a label set wins, which lets a per-tier counter (``counters.evictions_host``) take precedence
over an older unlabelled one (``counters.evictions``, which counts host evictions). Histograms are observed in
the request dispatcher and have no source.

Counters are named here without ``_total``; exposition adds it (see ``sample_name``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator

PREFIX = "kvstore_"
TIER_LABEL = r"[a-z0-9]+"
# The tenant label's values are the names of the config file's tenants (tenants/table.py), never the wire's.
LABEL_PATTERNS = {"tenant": r"[A-Za-z0-9][A-Za-z0-9_-]*",
                  "medium": r"CPU|GPU|STORAGE",   # the KV cache events' media
                  "generation": r"[0-2]"}         # the garbage collector's generations (server/lifecycle/heap.py)

# Request latency buckets (seconds): a request is an index update of microseconds, a disk read can take
# milliseconds, a stalled tier seconds.
LATENCY_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                   0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class Source:
    """A dotted path in ``Daemon.stats()`` with ``{label}`` fields, plus labels fixed for this source."""

    template: str
    fixed: tuple[tuple[str, str], ...] = ()

    @property
    def pattern(self) -> re.Pattern[str]:
        parts = re.split(r"\{(\w+)\}", self.template)
        regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>{LABEL_PATTERNS.get(p, TIER_LABEL)})"
                        for i, p in enumerate(parts))
        return re.compile(regex)

    def labels(self) -> tuple[str, ...]:
        return tuple(re.findall(r"\{(\w+)\}", self.template)) + tuple(k for k, _ in self.fixed)

    def match(self, path: str) -> dict[str, str] | None:
        m = self.pattern.fullmatch(path)
        return None if m is None else {**m.groupdict(), **dict(self.fixed)}


@dataclass(frozen=True)
class MetricDef:
    name: str                      # full name, with the kvstore_ prefix, counters without _total
    kind: str                      # "counter", "gauge" or "histogram"
    help: str
    labels: tuple[str, ...] = ()
    sources: tuple[Source, ...] = ()
    buckets: tuple[float, ...] = field(default=())

    @property
    def sample_name(self) -> str:
        """The name PromQL uses: counters end in ``_total``; histograms are queried through ``_bucket`` etc."""
        return self.name + "_total" if self.kind == "counter" else self.name

    def series_names(self) -> tuple[str, ...]:
        if self.kind == "counter":
            return (self.name + "_total",)
        if self.kind == "histogram":
            return tuple(self.name + s for s in ("_bucket", "_count", "_sum"))
        return (self.name,)


def _m(name: str, kind: str, help: str, *sources: str | Source, labels: tuple[str, ...] | None = None,
       buckets: tuple[float, ...] = ()) -> MetricDef:
    srcs = tuple(s if isinstance(s, Source) else Source(s) for s in sources)
    if labels is None:
        labels = srcs[0].labels() if srcs else ()
    for s in srcs:
        assert set(s.labels()) == set(labels), f"{name}: source {s.template} has labels {s.labels()}"
    return MetricDef(PREFIX + name, kind, help, labels, srcs, buckets)


HOST = (("tier", "host"),)

METRICS: tuple[MetricDef, ...] = (
    # lookups: hit rate = hit_tokens / lookup_tokens
    _m("lookups", "counter", "Lookup requests answered.", "counters.lookups"),
    _m("lookup_tokens", "counter", "Tokens that lookups asked for (full chunks times chunk size).", "lookup_tokens"),
    _m("hit_tokens", "counter", "Tokens that lookups found stored (the leading stored chunks).", "hit_tokens"),
    _m("lookup_chunks", "counter", "Chunks that lookups asked for.", "counters.lookup_keys"),
    _m("hit_chunks", "counter", "Chunks that lookups found stored.", "counters.hit_keys"),
    # puts and gets
    _m("puts", "counter", "Committed puts.", "counters.puts"),
    _m("put_chunks", "counter", "Chunks stored by committed puts.", "counters.put_chunks"),
    _m("put_bytes", "counter", "Bytes stored by committed puts.", "counters.put_bytes"),
    _m("gets", "counter", "Gets that found at least one chunk.", "counters.gets"),
    _m("get_chunks", "counter", "Chunks handed out by gets.", "counters.get_chunks"),
    _m("get_bytes", "counter", "Bytes handed out by gets.", "counters.get_bytes"),
    # tiers
    _m("tier_capacity_bytes", "gauge", "Capacity of each tier.", "tiers.{tier}.capacity_bytes"),
    _m("tier_used_bytes", "gauge", "Bytes in use in each tier (committed and reserved).", "tiers.{tier}.used_bytes"),
    _m("tier_chunks", "gauge", "Chunks held by each tier.", "tiers.{tier}.chunks"),
    _m("host_reserved_bytes", "gauge", "Bytes of the host arena backed by pages so far (it grows as chunks arrive, "
       "up to the tier's capacity).", "tiers.host.reserved_bytes"),
    _m("host_backing_refused", "counter", "Host tier allocations refused because /dev/shm could not back their "
       "pages (the put got StoreFullError).", "tiers.host.backing_refused"),
    _m("chunks", "gauge", "Committed chunks in the index (any tier).", "chunks"),
    # movement between tiers
    _m("promotions", "counter", "Chunks copied up from tier src to tier dst.", "counters.promotions_{src}_{dst}"),
    _m("promoted_bytes", "counter", "Bytes copied up from tier src to tier dst.",
       "counters.promoted_bytes_{src}_{dst}"),
    _m("demotions", "counter", "Chunks moved down from tier src to tier dst.", "counters.demotions_{src}_{dst}"),
    _m("demoted_bytes", "counter", "Bytes moved down from tier src to tier dst.",
       "counters.demoted_bytes_{src}_{dst}"),
    _m("evictions", "counter", "Chunks dropped from a tier to make room.",
       "counters.evictions_{tier}", Source("counters.evictions", HOST)),
    _m("evicted_bytes", "counter", "Bytes dropped from a tier to make room.",
       "counters.evicted_bytes_{tier}", Source("counters.evicted_bytes", HOST)),
    # handles and clients
    _m("leases_active", "gauge", "Leases held by readers now.", "leases"),
    _m("reservations_active", "gauge", "Reservations waiting for their commit now.", "reservations"),
    _m("expired_leases", "counter", "Leases that ran past their TTL.", "counters.expired_leases"),
    _m("overdue_leases", "counter", "Leases of live local clients held past their TTL (kept until released).",
       "leases_overdue"),
    _m("expired_reservations", "counter", "Reservations that ran past their TTL.", "counters.expired_reservations"),
    _m("clients_connected", "gauge", "Clients that said hello and have not gone.", "sessions"),
    _m("connectors", "gauge", "Engine connectors connected, by engine and state (off: the model family has no "
       "chunk layout; `kvstore stats` says why).", "connectors.{engine}.{state}"),
    # errors
    _m("requests", "counter", "Requests received.", "requests"),
    _m("request_errors", "counter", "Requests answered with an error.", "errors"),
    _m("auth_rejected", "counter", "tcp:// connections refused by CURVE authentication.", "auth_rejected"),
    _m("store_full_errors", "counter", "Puts refused because nothing more could be evicted.",
       "counters.full_errors"),
    _m("checksum_failures", "counter", "Chunks read from disk whose checksum failed (served as misses).",
       "counters.checksum_failures"),
    _m("io_errors", "counter", "Disk I/O errors.", "counters.io_errors"),
    # disk tier write-back and reads
    _m("disk_writes", "counter", "Chunks written to the disk tier.", "counters.disk_writes"),
    _m("disk_write_bytes", "counter", "Bytes written to the disk tier (after compression).",
       "counters.disk_write_bytes"),
    _m("disk_write_skipped", "counter", "Chunks not written to disk (no room, or the write failed).",
       "counters.disk_write_skipped"),
    _m("disk_full_writes", "counter", "Disk writes the filesystem refused for want of space (the chunk stayed in "
       "DRAM only).", "counters.disk_full_writes"),
    _m("disk_reads", "counter", "Chunks read from the disk tier.", "counters.disk_reads"),
    _m("disk_read_bytes", "counter", "Bytes read from the disk tier.", "counters.disk_read_bytes"),
    _m("disk_quarantined", "counter", "Chunk files moved to quarantine (bad header, length or checksum).",
       "counters.quarantined"),
    _m("unwritten_evictions", "counter", "Chunks evicted from DRAM before their disk write.",
       "counters.unwritten_evictions"),
    _m("disk_write_queue_chunks", "gauge", "Chunks waiting for write-back.", "disk.write_queue_chunks"),
    _m("disk_write_queue_bytes", "gauge", "Bytes waiting for or in write-back.", "disk.write_queue_bytes"),
    _m("disk_writes_in_flight", "gauge", "Disk writes in flight.", "disk.writes_in_flight"),
    _m("disk_reads_in_flight", "gauge", "Disk reads (promotions) in flight.", "disk.reads_in_flight"),
    _m("disk_fetch_ns_per_kib", "gauge", "Measured cost of a disk hit: read time per KiB promoted, since start.",
       "disk.read_ns_per_kib"),
    _m("load_ns_per_kib", "gauge", "What loading a KiB costs per KV cache event medium, since start: STORAGE as the "
       "daemon reads the disk tier, CPU and GPU as the engines' connectors time their own loads.",
       "load_ns_per_kib.{medium}"),
    _m("gpu_copies_down", "counter", "GPU-tier chunks copied back into DRAM before leaving the GPU tier.",
       "counters.gpu_copies_down"),
    _m("gpu_copies_in_flight", "gauge", "Copies between the GPU tier and DRAM in flight.", "gpu.copies_in_flight"),
    _m("gpu_promotions_wanted", "gauge", "Chunks waiting for promotion to the GPU tier.", "gpu.promotions_wanted"),
    _m("gpu_bytes_leaving", "gauge", "Bytes of GPU slots being copied down.", "gpu.bytes_leaving"),
    # remote tier (--remote): the backend's calls and the mover's traffic
    _m("remote_up", "gauge", "1 while the remote store answers, 0 during an outage.", "remote.up"),
    _m("remote_calls", "counter", "Calls sent to the remote store.", "remote.calls"),
    _m("remote_errors", "counter", "Remote store calls that failed (errors and deadlines).", "remote.errors"),
    _m("remote_timeouts", "counter", "Remote store calls that ran past their deadline.", "remote.timeouts"),
    _m("remote_skipped", "counter", "Remote store calls not sent because the store was down (answered as misses).",
       "remote.skipped"),
    _m("remote_outages", "counter", "Times the remote store became unavailable.", "remote.outages"),
    _m("remote_hits", "counter", "Values read back from the remote store whole and intact.", "remote.hits"),
    _m("remote_misses", "counter", "Values asked of the remote store and not served (absent or bad).",
       "remote.misses"),
    _m("remote_corrupt", "counter", "Remote values that failed validation (served as misses).", "remote.corrupt"),
    _m("remote_puts", "counter", "Chunks stored in the remote store.", "remote.puts"),
    _m("remote_put_bytes", "counter", "Payload bytes stored in the remote store.", "remote.put_bytes"),
    _m("remote_get_bytes", "counter", "Payload bytes read from the remote store.", "remote.get_bytes"),
    _m("remote_put_dropped", "counter", "Chunks not sent to the remote store (store down or put queue full).",
       "remote.put_dropped"),
    _m("remote_pending_put_bytes", "gauge", "Bytes of background puts to the remote store not finished yet.",
       "remote.pending_put_bytes"),
    _m("remote_lookups", "counter", "Lookups that missed locally and asked the remote store.", "remote.lookups"),
    _m("remote_lookup_chunks", "counter", "Chunks lookups found in (or being fetched from) the remote store.",
       "remote.lookup_chunks"),
    _m("remote_lookup_late", "counter", "Remote answers that came after the lookup had replied (--remote-wait).",
       "remote.lookup_late"),
    _m("remote_fetching_chunks", "gauge", "Chunks being fetched from the remote store into DRAM.",
       "remote.fetching_chunks"),
    _m("remote_puts_in_flight", "gauge", "Background puts to the remote store in flight.", "remote.puts_in_flight"),
    _m("remote_pinned_bytes", "gauge", "DRAM bytes pinned while puts to the remote store read them.",
       "remote.pinned_bytes"),
    _m("remote_unreadable_keys", "gauge", "Remote values recently found unreadable, not offered to lookups.",
       "remote.unreadable_keys"),
    _m("remote_ceiling_deletes_failed", "counter", "Deletes from the remote store to hold a tenant's remote ceiling "
       "that failed (the put they made room for was dropped).", "remote.ceiling_deletes_failed"),
    # integrity: checksums from commit on, damage found in any tier, scrubs, engines' verification
    _m("corrupt_chunks", "counter", "Chunk copies found damaged (failed their checksum), by tier and any check.",
       "integrity.corrupt_{tier}"),
    _m("repaired_chunks", "counter", "Damaged copies replaced by an intact copy in another tier.",
       "integrity.repaired"),
    _m("corrupt_dropped_chunks", "counter", "Chunks dropped because of damage (their continuations included).",
       "integrity.dropped"),
    _m("checksums", "counter", "Checksums taken at commit.", "integrity.sums"),
    _m("checksummed_bytes", "counter", "Bytes hashed for checksums at commit.", "integrity.sum_bytes"),
    _m("checksums_pending", "gauge", "Committed chunks whose checksum is being taken.", "integrity.sums_pending"),
    _m("corrupt_reports", "counter", "Chunks clients reported as failing their checksum in a get (re-checked).",
       "integrity.reported"),
    _m("scrub_passes", "counter", "Scrub passes completed (kvstore scrub and the background scrub).",
       "scrub.passes"),
    _m("scrub_running", "gauge", "Scrub passes running now.", "scrub.running"),
    _m("scrub_checked", "counter", "Chunk copies a scrub checked, by tier.", "scrub.tiers.{tier}.checked"),
    _m("scrub_corrupt", "counter", "Chunk copies a scrub found damaged, by tier.", "scrub.tiers.{tier}.corrupt"),
    _m("scrub_dropped", "counter", "Chunks dropped because a scrub found a copy damaged, by tier.",
       "scrub.tiers.{tier}.dropped"),
    _m("scrub_bytes", "counter", "Bytes a scrub checked, by tier.", "scrub.tiers.{tier}.bytes"),
    _m("verify_reports", "counter", "Verification reports from engines (computed KV compared with stored).",
       "verify.reports"),
    _m("verify_checks", "counter", "Stored chunks engines compared with the KV they computed.", "verify.checks"),
    _m("verify_mismatches", "counter", "Compared chunks that differed beyond the engine's tolerance.",
       "verify.mismatches"),
    _m("verify_max_difference", "gauge", "Largest absolute difference an engine's comparison reported.",
       "verify.max_difference"),
    _m("verify_dropped_chunks", "counter", "Chunks dropped because a verification found them wrong.",
       "verify.dropped"),
    _m("credits_active", "gauge", "Arena space lent to writers for one-round-trip puts: credits held now.",
       "credits.active"),
    _m("credits_lent_bytes", "gauge", "Bytes of arena space lent to writers now (not counted as tier use).",
       "credits.lent_bytes"),
    _m("credits_lent", "counter", "Credits lent afresh (an extent allocated for a writer).", "credits.lent"),
    _m("credit_puts", "counter", "Puts committed from a credit in one round trip.", "credits.puts"),
    _m("credits_expired", "counter", "Credits taken back at their deadline.", "credits.expired"),
    _m("credits_refused", "counter", "Writers asking for a credit that got none (space or their share).",
       "credits.refused"),
    # retention classes and soft pins (store/retention.py)
    _m("pinned_bytes", "gauge", "DRAM bytes held by soft pins (retention class pin) whose TTL has not ended.",
       "retention.pinned_bytes"),
    _m("pinned_chunks", "gauge", "Chunks held by soft pins now.", "retention.pinned_chunks"),
    _m("pin_limit_bytes", "gauge", "Most DRAM bytes all soft pins may hold (--max-pin-share; absent with a tenants "
       "table, where each tenant's guarantee and max_pin_bytes bound its own).", "retention.pin_limit_bytes"),
    _m("tenant_pinned_bytes", "gauge", "DRAM bytes each tenant's soft pins hold (tenants from the config file).",
       "retention.tenants_pinned_bytes.{tenant}"),
    _m("pins", "counter", "Chunks soft-pinned by a put.", "retention.pins"),
    _m("pins_over_bound", "counter", "Pins asked past their bound (a tenant's pin limit or --max-pin-share), "
       "kept as high instead.", "retention.pins_over_bound"),
    _m("pins_expired", "counter", "Soft pins whose TTL ended (their chunks became high).", "retention.pins_expired"),
    _m("no_store_puts", "counter", "Puts with retention no-store: acknowledged, nothing stored.",
       "retention.no_store_puts"),
    _m("no_store_chunks", "counter", "Chunks of puts with retention no-store: acknowledged, not stored.",
       "retention.no_store_chunks"),
    # KV cache events (server/events/publisher.py)
    _m("events_published", "counter", "KV cache events sent to subscribers.", "events.events"),
    _m("events_batches", "counter", "KV cache event batches sent (one sequence number each).", "events.batches"),
    _m("events_dropped", "counter", "KV cache events in batches the socket refused (a gap in seq).",
       "events.dropped"),
    _m("events_replays", "counter", "KV cache event replay requests answered.", "events.replays"),
    _m("events_snapshots", "counter", "KV cache event snapshot requests answered.", "events.snapshots"),
    _m("events_buffered", "gauge", "KV cache event batches kept for replay.", "events.buffered"),
    # warm restart (store/adoption.py): what this start adopted from the arena its predecessor kept
    _m("adoption_listed_chunks", "gauge", "Chunks the kept arena's description listed at start.",
       "adoption.listed_chunks"),
    _m("adoption_listed_bytes", "gauge", "Bytes of the chunks the kept arena's description listed at start.",
       "adoption.listed_bytes"),
    _m("adoption_unfit_chunks", "gauge", "Kept chunks left out at start (past --host-mem, over --max-chunk).",
       "adoption.unfit_chunks"),
    _m("adoption_verified_chunks", "gauge", "Kept chunks whose bytes matched their checksum.",
       "adoption.verified_chunks"),
    _m("adoption_verified_bytes", "gauge", "Bytes of kept chunks whose bytes matched their checksum.",
       "adoption.verified_bytes"),
    _m("adopted_chunks", "gauge", "Kept chunks served again after the restart.", "adoption.adopted_chunks"),
    _m("adopted_bytes", "gauge", "Bytes of kept chunks served again after the restart.", "adoption.adopted_bytes"),
    _m("adoption_corrupt_chunks", "gauge", "Kept chunks whose bytes no longer matched their checksum (freed).",
       "adoption.corrupt_chunks"),
    _m("adoption_dropped_chunks", "gauge",
       "Kept chunks dropped for another reason: a continuation of a corrupt one, or put again meanwhile.",
       "adoption.dropped_chunks"),
    _m("adoption_seconds", "gauge", "Seconds the kept arena's verification took (0 until it ends).",
       "adoption.seconds"),
    _m("uptime_seconds", "gauge", "Seconds since the daemon started.", "uptime_s"),
    # the garbage collector's pauses on the event loop (2: full collections)
    _m("gc_collections", "counter", "Collections of the Python garbage collector, per generation.",
       "gc.generations.{generation}.collections"),
    _m("gc_pause_seconds", "counter", "Seconds the event loop stood still in garbage collections, per generation.",
       "gc.generations.{generation}.pause_seconds"),
    _m("gc_longest_pause_seconds", "gauge", "The longest garbage collection since the daemon started, per "
       "generation.", "gc.generations.{generation}.longest_pause_seconds"),
    _m("gc_frozen_objects", "gauge", "Objects frozen out of garbage collections after start-up.",
       "gc.frozen_objects"),
    # tenants (only with a [tenants] table; the label's values come from the config file)
    _m("tenant_dram_bytes", "gauge", "DRAM bytes each tenant's chunks hold.", "tenants.{tenant}.dram_bytes"),
    _m("tenant_dram_guaranteed_bytes", "gauge", "Each tenant's guaranteed DRAM share.",
       "tenants.{tenant}.dram_guaranteed"),
    _m("tenant_dram_ceiling_bytes", "gauge", "Each tenant's DRAM ceiling (absent: none).",
       "tenants.{tenant}.dram_ceiling"),
    _m("tenant_bytes", "gauge", "Bytes each tenant's chunks hold in each tier that holds budgets (dram, disk, gpu; "
       "remote: the bytes this daemon wrote there for it and has not deleted or seen missing).",
       "tenants.{tenant}.tiers.{tier}.bytes"),
    _m("tenant_guaranteed_bytes", "gauge", "Each tenant's guaranteed share of each tier.",
       "tenants.{tenant}.tiers.{tier}.guaranteed"),
    _m("tenant_ceiling_bytes", "gauge", "Each tenant's ceiling in each tier (absent: none).",
       "tenants.{tenant}.tiers.{tier}.ceiling"),
    _m("tenant_evicted_by_others", "counter",
       "Chunks of each tenant evicted from a tier to make room for another tenant (a put, a write, a promotion).",
       "tenants.{tenant}.tiers.{tier}.evicted_by_others"),
    _m("tenant_ceiling_refusals", "counter",
       "Room refused because the tenant was at its ceiling in the tier: DRAM puts and promotions refused, disk "
       "writes, GPU promotions and remote puts not made.", "tenants.{tenant}.tiers.{tier}.ceiling_refusals"),
    _m("tenant_remote_deleted_for_ceiling", "counter", "Values of each tenant this daemon deleted from the remote "
       "store to hold its remote ceiling.", "tenants.{tenant}.tiers.remote.deleted_for_ceiling"),
    _m("tenant_remote_seen_missing", "counter", "Values this daemon wrote to the remote store for each tenant that "
       "a lookup found gone (the store evicted them): they no longer count against its remote ceiling.",
       "tenants.{tenant}.tiers.remote.seen_missing"),
    _m("tenant_lookup_tokens", "counter", "Tokens each tenant's clients looked up (hits and misses).",
       "tenants.{tenant}.lookup_tokens"),
    _m("tenant_hit_tokens", "counter", "Tokens each tenant's lookups found stored.", "tenants.{tenant}.hit_tokens"),
    # latency, observed by the dispatcher
    _m("request_duration_seconds", "histogram",
       "Time the daemon spent on a request, by operation (lookup, reserve, commit, put_inline, get, ...).",
       labels=("op",), buckets=LATENCY_BUCKETS),
)

BY_NAME: dict[str, MetricDef] = {m.name: m for m in METRICS}
assert len(BY_NAME) == len(METRICS), "metric names must be unique"


def metric(name: str) -> MetricDef:
    """The definition named ``name`` (with or without the prefix); KeyError names what is missing."""
    full = name if name.startswith(PREFIX) else PREFIX + name
    try:
        return BY_NAME[full]
    except KeyError:
        raise KeyError(f"no metric {full} in kvstore.metrics.definitions") from None


def exported_series() -> set[str]:
    """Every series name a scrape can contain (``kvstore_x_total``, ``kvstore_y_bucket``, ...)."""
    return {s for m in METRICS for s in m.series_names()}


def flatten(stats: dict, prefix: str = "") -> Iterator[tuple[str, float]]:
    """``{"tiers": {"host": {"chunks": 3}}}`` -> ``("tiers.host.chunks", 3)``; only numbers are kept."""
    for key, value in stats.items():
        path = prefix + str(key)
        if isinstance(value, dict):
            yield from flatten(value, path + ".")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield path, value
