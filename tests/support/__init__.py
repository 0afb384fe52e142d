"""Helpers shared by the test modules: daemon starters, real servers, workloads, engine harnesses.

Test modules import from here (``from support.daemons import run_cli``); no test module imports another.
The benchmarks import the same modules as ``tests.support`` (``from tests.support.daemons import Daemons``), run
from the repository root; so within this package, modules import each other relatively (``from .hygiene import``).
"""
