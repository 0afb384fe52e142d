"""Fixtures: real daemon processes on temporary sockets, clients to talk to them, and the session's guard.

Every daemon and CLI run goes through ``harness/daemons.py`` (its own socket, disk dir and sandboxed HOME/XDG dirs).
The session itself also points ``XDG_RUNTIME_DIR``, ``XDG_CACHE_HOME`` and the native-kernel cache into its
scratch root, so that even a default path reached in-process or by a child started by hand stays there; and
``machine_left_as_found`` fails the session, naming the paths, if the user's kvstore directories changed or an
arena, a ``/tmp/kvs-*`` directory or a daemon was left behind (see ``support/hygiene.py``).

Every test gets one of the markers ``unit`` (no daemon or server process) or ``integration`` (real daemons,
servers or engine processes), and ``engine`` where it runs a real vLLM engine (``pytest_collection_modifyitems``
below; docs/development/testing.md says how to run the parts).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

import kvstore

from harness.daemons import (DaemonProc, Daemons, free_kept_arenas, keep_dirs, known_arenas, sandbox_dirs, scratch_root,
                             short_tempdir)
from harness.wait import wait_for
from support import hygiene, runs_once

__all__ = ["DaemonProc", "short_tempdir", "wait_for"]

USER_DIRS = hygiene.user_dirs(dict(os.environ))   # taken before the session's environment is redirected
SESSION_HOME = os.path.join(scratch_root(), "session")
os.environ.update({k: v for k, v in sandbox_dirs(SESSION_HOME).items() if k != "HOME"})
os.environ["KVSTORE_NATIVE_DIR"] = os.path.join(scratch_root(), "native")   # where cupy would cache the CUDA kernel


def require_native(kind: str) -> None:
    """Skip a test of the native ``kind`` library (``index``, ``copy``) where it was not built, naming the build
    command; under CI, where the install builds it, fail instead. The tests never compile it themselves."""
    from kvstore import native

    if native.load(kind) is not None:
        return
    from harness import servers

    why = (f"the native {kind} library is not built ({native.library_path(kind)}): "
           "`pip install -e .` or `python setup.py build_ext --inplace` builds it")
    if servers.in_ci():
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session", autouse=True)
def machine_left_as_found(request) -> Iterator[None]:
    before = hygiene.take(USER_DIRS, skip_tmp=scratch_root())
    watch = hygiene.Watch().start()
    yield
    watch.stop()
    if not keep_dirs():
        shutil.rmtree(scratch_root(), ignore_errors=True)
    # On a shared machine only what is surely ours fails; KVSTORE_TEST_STRICT=1 (CI) counts everything.
    shared = bool(watch.foreign) and not os.environ.get("KVSTORE_TEST_STRICT")
    failures, notes = hygiene.problems(before, hygiene.take(USER_DIRS, skip_tmp=scratch_root()),
                                       ours=watch.ours | known_arenas(), shared=shared)
    if notes:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"left behind during this session, perhaps by another one ({min(watch.foreign)}, ...):", *notes]
        for line in lines:
            reporter.write_line(line) if reporter is not None else print(line)
    if failures:
        pytest.fail("the test session did not leave the machine as it found it:\n  " + "\n  ".join(failures),
                    pytrace=False)


@pytest.fixture(autouse=True)
def kept_arenas_freed() -> Iterator[None]:
    """A daemon a test stopped cleanly keeps its arena for a warm restart: free it when the test ends."""
    yield
    free_kept_arenas()


@pytest.fixture
def start_daemon() -> Iterator:
    """``start_daemon(*flags, workdir=None, wait=True, env=None)``: a daemon that is gone after the test."""
    with Daemons() as daemons:
        yield daemons.start


@pytest.fixture(scope="module")
def start_module_daemon() -> Iterator:
    """As ``start_daemon``, for daemons that serve a whole module."""
    with Daemons() as daemons:
        yield daemons.start


@pytest.fixture
def daemon(start_daemon) -> DaemonProc:
    return start_daemon()


@pytest.fixture
def client(daemon) -> Iterator[kvstore.Client]:
    c = daemon.client(namespace="test")
    yield c
    c.close()


# Modules whose tests start daemons, servers or CLI processes in their own bodies (not through the fixtures
# below, which the markers see on their own), relative to tests/.
PROCESS_MODULES = frozenset({
    "cli/test_cli.py", "client/test_request_limits.py", "connectors/test_import_paths.py",
    "connectors/test_connector_report.py",
    "connectors/vllm_connector/test_connector_vllm.py", "gpu/test_gpu_tier.py", "gpu/test_gpu_wiring.py",
    "metrics/test_metrics.py", "native/test_native.py", "project/test_hygiene.py", "project/test_packaging.py",
    "remote/test_remote_backends.py", "remote/test_remote_tier.py", "routing/test_routing.py",
    "security/test_redaction.py", "security/test_security.py", "server/test_kv_events.py", "server/test_ops.py",
    "server/test_startup_safety.py", "server/test_stop_cleanup.py", "server/test_stop_safety.py",
    "sim/test_simulate.py", "store/test_integrity.py", "tiers/test_warm_restart.py",
})
# Modules that run real engine processes (vLLM's CPU build in KVSTORE_VLLM_VENV, SGLang's CPU path in
# KVSTORE_SGLANG_VENV): minutes each.
ENGINE_MODULES = frozenset({
    "connectors/vllm_connector/test_vllm_engine.py", "connectors/vllm_connector/test_vllm_engine_roles.py",
    "connectors/vllm_connector/test_vllm_families.py", "connectors/vllm_connector/test_vllm_verify.py",
    "connectors/vllm_connector/test_vllm_engine_block_events.py",
    "connectors/vllm_connector/test_vllm_engine_tenants.py", "connectors/vllm_connector/test_vllm_engine_identity.py",
    "connectors/vllm_connector/test_vllm_engine_hybrid.py",
    "connectors/vllm_connector/test_vllm_engine_hybrid_families.py",
    "connectors/sglang_connector/test_sglang_engine.py", "connectors/test_cross_engine.py",
})
# Modules that need a CUDA device when KVSTORE_TEST_DEVICE=cuda asks them to run on one.
GPU_MODULES = frozenset({"connectors/hf_connector/test_connector_hf.py"})
DAEMON_FIXTURES = frozenset({"start_daemon", "start_module_daemon"})
TESTS_DIR = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    runs_once.register(config)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test ``unit`` or ``integration`` (and ``engine``, ``gpu``) from its module and fixtures; under
    CI's second run, leave out what passed in its first (``support/runs_once.py``)."""
    runs_once.leave_out_passed(config, items)
    on_gpu = os.environ.get("KVSTORE_TEST_DEVICE", "cpu") == "cuda"
    for item in items:
        path = Path(str(item.fspath)).resolve()
        module = path.relative_to(TESTS_DIR).as_posix() if path.is_relative_to(TESTS_DIR) else path.name
        if module in ENGINE_MODULES:
            item.add_marker(pytest.mark.engine)
        if on_gpu and module in GPU_MODULES:
            item.add_marker(pytest.mark.gpu)
        runs_processes = (module in ENGINE_MODULES or module in PROCESS_MODULES
                          or not DAEMON_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())))
        item.add_marker(pytest.mark.integration if runs_processes else pytest.mark.unit)
