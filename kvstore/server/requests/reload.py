"""Reloading the tenants table without a restart (``kvstore reload``, SIGHUP).

The daemon remembers the config file it was started with and the flags given with it (``ConfigSource``). A
reload reads that file again and validates its ``[tenants]`` table exactly as the start did (the same parser,
and ``check_capacities`` against the tiers' sizes in force). A table that does not pass is refused in one line,
logged and answered to ``kvstore reload``; the old table stays in force. A good one is applied at once
(``Service.set_tenants``): the Store's budgets in every tier, the access checks, and the shared index's privacy.
Every other setting is only compared: one whose value in the file (flags still win, as at start) differs from
the value in force is named as needing a restart, and is not applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol

from ... import logs
from ...config import ServerConfig, read_settings
from ...errors import ConfigError

if TYPE_CHECKING:
    from ...tenants.table import TenantTable


class Reloadable(Protocol):
    """What a reload needs of the daemon's service (``service.Service``), named here so this module does not
    import it (the service holds the reload)."""

    config: ServerConfig

    def capacities(self) -> dict[str, int | None]: ...

    def set_tenants(self, table: "TenantTable") -> None: ...


@dataclass(frozen=True)
class ConfigSource:
    """Where the daemon's settings came from: its config file (None: none) and the flags given with it."""

    path: str | None = None
    flags: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReloadReport:
    """What a reload did: ``applied`` the new table (its tenants), or ``error`` (the line that refused it)."""

    applied: bool
    tenants: list[str] = field(default_factory=list)
    needs_restart: list[str] = field(default_factory=list)   # settings whose file value differs from the one in force
    error: str | None = None

    def wire(self) -> dict[str, Any]:
        """The RELOAD reply's fields."""
        return {"applied": self.applied, "tenants": self.tenants, "needs_restart": self.needs_restart,
                "error": self.error}


def changed_settings(config: ServerConfig, source: ConfigSource) -> list[str]:
    """The settings whose value, read again from ``source``, differs from ``config``'s.

    Raises:
        ConfigError: a setting in the file is not valid.
    """
    values = read_settings(source.flags, source.path)
    return [f.name for f in fields(config) if values[f.name] != getattr(config, f.name)]


def reload_tenants(svc: Reloadable, source: ConfigSource) -> ReloadReport:
    """Read ``source``'s tenants table again and apply it to ``svc``, or refuse it and keep the old one; logged."""
    from ...tenants.table import load_tenants

    if not source.path:
        report = ReloadReport(False, error="the daemon was started without --config: there is no file to reload; "
                                           "restart it with --config FILE to use a tenants table")
    else:
        try:
            restart = changed_settings(svc.config, source)
            table = load_tenants(source.path, svc.capacities())
            svc.set_tenants(table)   # refused whole when it needs a tenant key file it cannot have
        except ConfigError as exc:
            report = ReloadReport(False, error=str(exc))
        else:
            report = ReloadReport(True, tenants=[t.name for t in table.all()], needs_restart=restart)
    if report.applied:
        logs.info("tenants_reloaded", file=source.path, tenants=",".join(report.tenants),
                  needs_restart=",".join(report.needs_restart))
    else:
        logs.error("reload_refused", file=source.path, error=report.error, kept="the tenants table in force")
    return report
