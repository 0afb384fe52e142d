"""``kvstore alerts`` and ``kvstore dashboard``: print the Prometheus rules (YAML) or the Grafana dashboard (JSON)."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("alerts", help="print Prometheus alerting rules (YAML) for the daemon's metrics",
                       description="Print Prometheus alerting rules (YAML) for the metrics the daemon serves with "
                                   "--metrics-port; every expression names only metrics the daemon exports.")
    p.set_defaults(run=run_alerts)
    p = sub.add_parser("dashboard", help="print a Grafana dashboard (JSON) for the daemon's metrics",
                       description="Print a Grafana dashboard (JSON, to import) for the metrics the daemon serves "
                                   "with --metrics-port.")
    p.set_defaults(run=run_dashboard)


def run_alerts(args: argparse.Namespace) -> int:
    from ..metrics.alerts import rules_yaml

    sys.stdout.write(rules_yaml())
    return 0


def run_dashboard(args: argparse.Namespace) -> int:
    from ..metrics.dashboard import dashboard_json

    sys.stdout.write(dashboard_json())
    return 0
