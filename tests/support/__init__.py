"""Helpers of the test modules alone: the session's guard (``hygiene``), engine harnesses, raw clients, event
consumers, scrapers and the store state machine.

What the benchmarks use too lives in the top-level ``harness`` package (daemons, servers, workloads, engine
virtualenvs). Test modules import from here (``from support.scrape import free_port``); no test module imports
another. Within this package, modules import each other relatively (``from .hygiene import``).
"""
