"""Helpers shared by the test modules: daemon starters, real servers, workloads, engine harnesses.

Test modules import from here (``from support.daemons import run_cli``); no test module imports another.
"""
