"""The tenants table: who shares the daemon, which namespaces each owns, and its budget in every tier.

A *tenant* is named by the config file's ``[tenants.NAME]`` table. It owns the namespaces that match one of its
``namespaces`` patterns: a pattern with ``*`` or ``?`` is a glob over the whole namespace, any other pattern is a
prefix (``"llama3-8b:"`` owns every namespace that starts with it). Patterns of two tenants that could both match
one namespace are refused when the table is read, so which tenant owns a namespace never depends on order; within
one tenant the first matching pattern wins (they all name the same tenant). A namespace no tenant matches
belongs to the implicit shared tenant ``default`` (``[tenants.default]`` may give it budgets and identities, but
no patterns).

Per tier (``gpu``, ``dram``, ``disk``, ``remote``) a tenant may have a *guaranteed* share, which other tenants'
puts never evict, and a *ceiling* it never exceeds (``[tenants.NAME.dram] guaranteed = "8GiB" ceiling =
"16GiB"``). The sum of the guarantees of a tier must fit its capacity (``check_capacities``, once the daemon
knows them).

The identity fields (``uids``, ``gids``, ``curve_keys``) are read and checked here and enforced where requests
are authorised; ``max_pin_bytes`` bounds the soft pins (retention class ``pin``) of the tenant's puts.

With no ``[tenants]`` table the daemon has one tenant, ``default``, with no budgets: today's behaviour.

Engine-neutral namespaces. The engine connectors say hello in ``kv:MODEL`` for chunks every engine reads (the
canonical format) and in ``vllm:MODEL`` / ``sglang:MODEL`` for an engine's own formats. A pattern written for an
engine's namespaces (``vllm:team-a/*``) also owns the engine-neutral ones of the same models (``kv:team-a/*``,
`ENGINE_PREFIXES`), so tables written before the canonical format keep giving a tenant its engines' chunks; two
tenants that split one model's engines between them now overlap, and are refused.

Example::

    [tenants.chat]
    namespaces = ["llama3-8b:", "chat-*"]
    uids = [1001]
    curve_keys = ["rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"]
    max_pin_bytes = "2GiB"
    [tenants.chat.dram]
    guaranteed = "8GiB"
    ceiling = "16GiB"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..config_file import read_toml
from ..defaults import DEFAULT_TENANT
from ..errors import ConfigError
from ..units import format_size, parse_size

TIERS = ("gpu", "dram", "disk", "remote")
TENANT_KEYS = ("namespaces", "uids", "gids", "curve_keys", "max_pin_bytes") + TIERS
BUDGET_KEYS = ("guaranteed", "ceiling")
MAX_TENANTS = 64          # the tenant label of /metrics stays bounded
MAX_PATTERNS = 256
MAX_PATTERN_CHARS = 256
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")   # no '.': names are parts of dotted stats paths
_Z85_RE = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")


@dataclass(frozen=True)
class Budget:
    """A tenant's share of one tier, in bytes: ``guaranteed`` is never evicted for another tenant, ``ceiling``
    (None: no ceiling but the tier's size) is never exceeded."""

    guaranteed_bytes: int = 0
    ceiling_bytes: int | None = None

    @property
    def limited(self) -> bool:
        return self.guaranteed_bytes > 0 or self.ceiling_bytes is not None

    def describe(self) -> str:
        """``guaranteed 8.0 GiB, ceiling 16.0 GiB`` (for errors and stats)."""
        ceiling = "none" if self.ceiling_bytes is None else format_size(self.ceiling_bytes)
        return f"guaranteed {format_size(self.guaranteed_bytes)}, ceiling {ceiling}"


NO_BUDGET = Budget()


@dataclass(frozen=True)
class Tenant:
    """One tenant of the daemon.

    Attributes:
        name: the table's key (``[tenants.NAME]``); the ``tenant`` label of /metrics.
        namespaces: prefix or glob patterns of the namespaces it owns (empty for ``default``).
        budgets: tier name (``TIERS``) -> Budget; a tier not named has no budget.
        uids, gids: local users and groups (``SO_PEERCRED`` of the Unix socket) that act as this tenant.
        curve_keys: Z85 CURVE public keys (40 characters) of remote clients that act as this tenant.
        max_pin_bytes: most bytes its soft pins may hold (None: bounded by its guarantees alone).
    """

    name: str
    namespaces: tuple[str, ...] = ()
    budgets: Mapping[str, Budget] = field(default_factory=dict)
    uids: tuple[int, ...] = ()
    gids: tuple[int, ...] = ()
    curve_keys: tuple[str, ...] = ()
    max_pin_bytes: int | None = None

    def __hash__(self) -> int:
        return hash(self.name)

    def budget(self, tier: str) -> Budget:
        """This tenant's budget of ``tier`` (``gpu``, ``dram``, ``disk``, ``remote``); NO_BUDGET when none."""
        return self.budgets.get(tier, NO_BUDGET)

    @property
    def restricted(self) -> bool:
        """Whether identities are configured for it (uids, gids or CURVE keys)."""
        return bool(self.uids or self.gids or self.curve_keys)

    def matches(self, namespace: str) -> bool:
        """Whether one of its patterns owns ``namespace``."""
        return any(pattern_matches(p, namespace) for p in self.namespaces)

    def pin_limit(self, tier: str = "dram") -> int:
        """Most bytes this tenant's soft pins may hold in ``tier``: its guarantee there, and max_pin_bytes."""
        limit = self.budget(tier).guaranteed_bytes
        return limit if self.max_pin_bytes is None else min(limit, self.max_pin_bytes)


@dataclass(frozen=True)
class TenantTable:
    """Every tenant, and which owns a namespace. Built by ``parse_tenants`` / ``load_tenants``; frozen, so a reload
    swaps one table for another whole."""

    tenants: tuple[Tenant, ...] = ()
    default: Tenant = Tenant(DEFAULT_TENANT)
    source: str = ""    # the file it was read from ("" for none)

    @property
    def configured(self) -> bool:
        """Whether the config file had a ``[tenants]`` table (else: today's behaviour, one shared tenant)."""
        return bool(self.tenants) or self.default.budgets != {} or self.default.restricted

    @property
    def names(self) -> tuple[str, ...]:
        """Every tenant's name, ``default`` last: the only values of the ``tenant`` label."""
        return tuple(t.name for t in self.tenants) + (self.default.name,)

    def all(self) -> tuple[Tenant, ...]:
        return self.tenants + (self.default,)

    def get(self, name: str) -> Tenant | None:
        return next((t for t in self.all() if t.name == name), None)

    def tenant_for(self, namespace: str) -> Tenant:
        """The tenant that owns ``namespace``: the first whose pattern matches, else the shared ``default``."""
        return _lookup(self, namespace)


@lru_cache(maxsize=4096)
def _lookup(table: TenantTable, namespace: str) -> Tenant:
    for tenant in table.tenants:
        if tenant.matches(namespace):
            return tenant
    return table.default


def is_glob(pattern: str) -> bool:
    return "*" in pattern or "?" in pattern


def pattern_matches(pattern: str, namespace: str) -> bool:
    """A glob (``*``, ``?``) matches the whole namespace; any other pattern is a prefix."""
    if not is_glob(pattern):
        return namespace.startswith(pattern)
    return _glob_regex(pattern).fullmatch(namespace) is not None


@lru_cache(maxsize=1024)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    parts = [".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern]
    return re.compile("".join(parts), re.DOTALL)


def patterns_overlap(a: str, b: str) -> bool:
    """Whether some namespace matches both patterns (a prefix ``p`` is the glob ``p*``)."""
    return _overlap(a if is_glob(a) else a + "*", b if is_glob(b) else b + "*")


@lru_cache(maxsize=4096)
def _overlap(p: str, q: str) -> bool:
    if not p or not q:
        return all(c == "*" for c in p + q)
    if p[0] == "*":
        return _overlap(p[1:], q) or _overlap(p, q[1:])
    if q[0] == "*":
        return _overlap(p, q[1:]) or _overlap(p[1:], q)
    return (p[0] == q[0] or "?" in (p[0], q[0])) and _overlap(p[1:], q[1:])


# -- reading ---------------------------------------------------------------------------------------------------
def load_tenants(path: str | None, capacities: Mapping[str, int | None] | None = None) -> TenantTable:
    """The tenants table of the config file ``path`` (an empty table when ``path`` is None or has no
    ``[tenants]``), checked against the tiers' ``capacities`` when given.

    Raises:
        ConfigError: naming the file and key that is wrong, and how to fix it.
    """
    if not path:
        return TenantTable()
    table = parse_tenants(read_toml(path).get("tenants"), path)
    if capacities is not None:
        check_capacities(table, capacities)
    return table


def parse_tenants(raw: Any, source: str = "config") -> TenantTable:
    """A TenantTable from the ``tenants`` value of a parsed TOML file (None: no table).

    Args:
        raw: the ``[tenants]`` table (a dict of tenant name -> table), or None.
        source: the file name errors start with.

    Raises:
        ConfigError: ``SOURCE: tenants.NAME.KEY: what is wrong``.
    """
    if raw is None:
        return TenantTable(source=source)
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: tenants: expected a table of [tenants.NAME] tables, got {raw!r}")
    if len(raw) > MAX_TENANTS:
        raise ConfigError(f"{source}: tenants: {len(raw)} tenants; at most {MAX_TENANTS} are allowed")
    tenants = [_parse_tenant(name, body, source) for name, body in raw.items()]
    default = next((t for t in tenants if t.name == DEFAULT_TENANT), Tenant(DEFAULT_TENANT))
    named = tuple(t for t in tenants if t.name != DEFAULT_TENANT)
    _refuse_overlaps(named, source)
    _refuse_shared_identities(named + (default,), source)
    return TenantTable(named, default, source)


def _parse_tenant(name: Any, body: Any, source: str) -> Tenant:
    where = f"{source}: tenants.{name}"
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(f"{where}: a tenant name is 1-63 letters, digits, '_' or '-', starting with a letter "
                          f"or digit")
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: expected a table ([tenants.{name}]), got {body!r}")
    unknown = sorted(set(body) - set(TENANT_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(TENANT_KEYS)}")
    namespaces = _read_patterns(body.get("namespaces"), f"{where}.namespaces", name)
    budgets = {tier: _read_budget(body[tier], f"{where}.{tier}") for tier in TIERS if tier in body}
    pins = body.get("max_pin_bytes")
    return Tenant(
        name=name, namespaces=namespaces, budgets=budgets,
        uids=_read_ids(body.get("uids", []), f"{where}.uids"),
        gids=_read_ids(body.get("gids", []), f"{where}.gids"),
        curve_keys=_read_curve_keys(body.get("curve_keys", []), f"{where}.curve_keys"),
        max_pin_bytes=None if pins is None else parse_size(pins, f"{where}.max_pin_bytes"),
    )


ENGINE_PREFIXES = ("vllm:", "sglang:")   # engine namespaces whose models' chunks are also in kv:MODEL
NEUTRAL_PREFIX = "kv:"


def with_neutral(patterns: tuple[str, ...]) -> tuple[str, ...]:
    """``patterns`` and, after each naming an engine's namespaces, the same pattern of the engine-neutral ones."""
    out = list(patterns)
    for pattern in patterns:
        for prefix in ENGINE_PREFIXES:
            if pattern.startswith(prefix):
                out.append(NEUTRAL_PREFIX + pattern[len(prefix):])
    return tuple(dict.fromkeys(out))


def _read_patterns(value: Any, where: str, name: str) -> tuple[str, ...]:
    if name == DEFAULT_TENANT:
        if value is not None:
            raise ConfigError(f"{where}: the default tenant owns every namespace no other tenant matches; remove "
                              f"its namespaces")
        return ()
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: expected a non-empty list of namespace prefixes or globs, e.g. "
                          f"[\"llama3-8b:\", \"team-a-*\"]")
    if len(value) > MAX_PATTERNS:
        raise ConfigError(f"{where}: {len(value)} patterns; at most {MAX_PATTERNS} are allowed")
    for pattern in value:
        if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN_CHARS:
            raise ConfigError(f"{where}: {pattern!r} is not a pattern; give a non-empty prefix or glob of at most "
                              f"{MAX_PATTERN_CHARS} characters")
        if pattern.strip("*") == "":
            raise ConfigError(f"{where}: {pattern!r} matches every namespace; that is the default tenant's part "
                              f"(configure [tenants.default] instead)")
    return with_neutral(tuple(value))


def _read_budget(value: Any, where: str) -> Budget:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a table with guaranteed and/or ceiling, e.g. "
                          f"{{ guaranteed = \"8GiB\", ceiling = \"16GiB\" }}")
    unknown = sorted(set(value) - set(BUDGET_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(BUDGET_KEYS)}")
    guaranteed = parse_size(value.get("guaranteed", 0), f"{where}.guaranteed")
    ceiling = parse_size(value["ceiling"], f"{where}.ceiling") if "ceiling" in value else None
    if ceiling is not None and guaranteed > ceiling:
        raise ConfigError(f"{where}: guaranteed {format_size(guaranteed)} is above the ceiling "
                          f"{format_size(ceiling)}; lower the guarantee or raise the ceiling")
    return Budget(guaranteed, ceiling)


def _read_ids(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**32
                                          for v in value):
        raise ConfigError(f"{where}: expected a list of numeric ids (0..4294967295), e.g. [1001, 1002]; "
                          f"got {value!r}")
    return tuple(value)


def _read_curve_keys(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of Z85 CURVE public keys (40 characters each, the "
                          f"public-key line of `kvstore keygen`'s .key file)")
    for key in value:
        if not isinstance(key, str) or not _Z85_RE.match(key):
            shown = key[:8] + "..." if isinstance(key, str) else repr(key)
            raise ConfigError(f"{where}: {shown} is not a Z85 CURVE public key (40 characters); copy it from the "
                              f"client's .key file")
    return tuple(value)


def _refuse_overlaps(tenants: tuple[Tenant, ...], source: str) -> None:
    for i, a in enumerate(tenants):
        for b in tenants[i + 1:]:
            for pa in a.namespaces:
                for pb in b.namespaces:
                    if patterns_overlap(pa, pb):
                        raise ConfigError(f"{source}: tenants.{b.name}.namespaces: {pb!r} overlaps "
                                          f"tenants.{a.name}'s {pa!r} (a namespace could match both); make the "
                                          f"patterns disjoint")


def _refuse_shared_identities(tenants: tuple[Tenant, ...], source: str) -> None:
    """One uid or CURVE key acts as one tenant (gids may be shared: a group is a weaker claim)."""
    for field_name in ("uids", "curve_keys"):
        seen: dict[Any, str] = {}
        for tenant in tenants:
            for ident in getattr(tenant, field_name):
                if ident in seen:
                    shown = ident if field_name == "uids" else str(ident)[:8] + "..."
                    raise ConfigError(f"{source}: tenants.{tenant.name}.{field_name}: {shown} is already "
                                      f"tenants.{seen[ident]}'s; an identity belongs to one tenant")
                seen[ident] = tenant.name


def check_capacities(table: TenantTable, capacities: Mapping[str, int | None]) -> None:
    """Refuse guarantees that do not fit: per tier, their sum must not exceed the tier's capacity.

    Args:
        table: the tenants.
        capacities: tier -> bytes (None or absent: the tier's size is not known, e.g. a remote store; 0: off).

    Raises:
        ConfigError: ``SOURCE: tenants: the dram guarantees add up to ...``.
    """
    for tier in TIERS:
        capacity = capacities.get(tier)
        if capacity is None:
            continue
        total = sum(t.budget(tier).guaranteed_bytes for t in table.all())
        if total > capacity:
            owners = ", ".join(f"{t.name} {format_size(t.budget(tier).guaranteed_bytes)}" for t in table.all()
                               if t.budget(tier).guaranteed_bytes)
            what = "is off" if capacity == 0 else f"holds {format_size(capacity)}"
            raise ConfigError(f"{table.source}: tenants: the {tier} guarantees add up to {format_size(total)} "
                              f"({owners}) but the {tier} tier {what}; lower them or grow the tier")
