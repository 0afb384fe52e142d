"""Each test once across CI's two runs of the suite.

CI (``.ci/run``) runs the README's test command twice: in a virtualenv with nothing but torch (every test that
needs an extra skips), then with every extra installed. A test that passed in the first run has nothing more
to prove in the second, where it would only double the wall time; what the second run adds is the tests that
skipped for want of an extra. So the first run lists the tests that passed (``KVSTORE_TEST_PASSED_LOG``: a file
it writes, one test id a line) and the second leaves those out (``KVSTORE_TEST_SKIP_PASSED``: the file to
read), saying how many. Outside CI neither variable is set and every test runs.
"""

from __future__ import annotations

import os

import pytest

LOG_VAR = "KVSTORE_TEST_PASSED_LOG"
SKIP_VAR = "KVSTORE_TEST_SKIP_PASSED"


class PassedLog:
    """Collects the ids of tests whose every phase passed, and writes them when the session ends."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.passed: set[str] = set()
        self.failed: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed or report.skipped:
            self.failed.add(report.nodeid)
        elif report.when == "call":
            self.passed.add(report.nodeid)

    def pytest_sessionfinish(self) -> None:
        with open(self.path, "w") as f:
            f.writelines(f"{nodeid}\n" for nodeid in sorted(self.passed - self.failed))


def passed_before(path: str) -> frozenset[str]:
    """The test ids in ``path``, a file an earlier run wrote; a missing file is an error naming the variable."""
    try:
        with open(path) as f:
            return frozenset(line.strip() for line in f if line.strip())
    except OSError as e:
        raise pytest.UsageError(f"{SKIP_VAR}={path}: cannot read the list of tests that passed before ({e}); "
                                f"unset it to run every test") from None


def leave_out_passed(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests that an earlier run (``KVSTORE_TEST_SKIP_PASSED``) says passed."""
    path = os.environ.get(SKIP_VAR)
    if not path:
        return
    done = passed_before(path)
    kept = [item for item in items if item.nodeid not in done]
    left_out = [item for item in items if item.nodeid in done]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"{len(left_out)} tests passed in the run before ({SKIP_VAR}) and are not run again")


def register(config: pytest.Config) -> None:
    """Install the passed-tests log where ``KVSTORE_TEST_PASSED_LOG`` asks for one."""
    path = os.environ.get(LOG_VAR)
    if path:
        config.pluginmanager.register(PassedLog(path), "kvstore-passed-log")
