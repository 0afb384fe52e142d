"""Prometheus metrics: one module of definitions, and the exporter, alert rules and dashboard generated from it."""
