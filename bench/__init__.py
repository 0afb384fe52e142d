"""kvstore's benchmarks, each a module run from the repository root: ``python -m bench.NAME [--quick]``.

``bench/results/`` holds the latest full run of each (``NAME-latest.json``); earlier runs are in git's history.
The daemons, servers and workloads a benchmark starts come from the top-level ``harness`` package
(``harness.daemons`` and its neighbours), shared with the tests: the one place that sandboxes every process a
test or a benchmark starts.
"""
