"""The CI's install scripts: they say what they need, enable nothing at boot, and put the vLLM engine's
virtualenv outside the checkout, where the tests and the benchmarks find it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from harness.engines.venv import venv_dir
from support.paths import ROOT

CI = Path(ROOT) / ".ci"


def script_venv(env: dict[str, str]) -> str:
    """Where ``.ci/install-vllm-engine.sh`` would put the engine's virtualenv under ``env``."""
    return subprocess.run(["bash", str(CI / "install-vllm-engine.sh"), "--where"], env=env, capture_output=True,
                          text=True, check=True, timeout=30).stdout.strip()


@pytest.mark.parametrize("cache", ["xdg", "home"])
def test_the_engine_virtualenv_lives_outside_the_checkout_by_default(tmp_path, cache):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home")}
    if cache == "xdg":
        env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    base = tmp_path / "cache" if cache == "xdg" else tmp_path / "home" / ".cache"
    assert venv_dir(env) == base / "kvstore-dev" / "venv-vllm"
    assert script_venv(env) == str(venv_dir(env))
    assert not str(venv_dir(env)).startswith(str(Path(ROOT).resolve()) + os.sep)


def test_kvstore_vllm_venv_names_the_virtualenv_for_the_script_and_the_tests(tmp_path, monkeypatch):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KVSTORE_VLLM_VENV": str(tmp_path / "engine")}
    assert venv_dir(env) == tmp_path / "engine" and script_venv(env) == str(tmp_path / "engine")
    monkeypatch.setenv("KVSTORE_VLLM_VENV", str(tmp_path / "engine"))
    assert venv_dir() == tmp_path / "engine"


def test_the_session_looks_in_the_users_cache_not_its_sandbox():
    import harness

    # conftest.py pointed XDG_CACHE_HOME into the session's sandbox; the virtualenv stays where the user has it
    assert os.environ.get("XDG_CACHE_HOME", "") != harness.USER_XDG_CACHE_HOME
    user = {"HOME": os.environ.get("HOME", ""), "XDG_CACHE_HOME": harness.USER_XDG_CACHE_HOME}
    if not os.environ.get("KVSTORE_VLLM_VENV"):
        assert venv_dir() == venv_dir(user)


def test_the_engine_tests_find_a_virtualenv_at_the_default_place(tmp_path, monkeypatch):
    import harness
    from harness.engines import vllm_real

    monkeypatch.delenv("KVSTORE_VLLM_VENV", raising=False)
    monkeypatch.setattr(harness, "USER_XDG_CACHE_HOME", str(tmp_path))
    venv = tmp_path / "kvstore-dev" / "venv-vllm"
    assert vllm_real.engine_python() is None and str(venv) in vllm_real.skip_reason()
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    package = venv / "lib" / "python3.11" / "site-packages" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    assert vllm_real.engine_python() == str(venv / "bin" / "python")


def test_install_peers_enables_nothing_at_boot_and_leaves_an_existing_redis_alone():
    text = (CI / "install-peers.sh").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "systemctl enable" not in code and "systemctl start" not in code
    assert "systemctl stop" not in code   # a redis-server that was there before is its administrator's
    installed = code.split("apt-get install", 1)[1].split("\nfi\n", 1)[0]   # the branch that installed packages
    assert "systemctl disable --now redis-server" in installed


def test_the_extras_installer_says_it_needs_apt_and_root_wherever_it_is_named():
    header = (CI / "install-extras.sh").read_text().split("set -euo", 1)[0]
    assert "apt-get" in header and "root" in header and "KVSTORE_VLLM_VENV" in header
    readme = (Path(ROOT) / "README.md").read_text()
    line = next(line for line in readme.splitlines() if "install-extras.sh" in line)
    assert "apt-get" in line and "root" in line
    testing = (Path(ROOT) / "docs" / "development" / "testing.md").read_text()
    assert re.search(r"install-extras\.sh.*?apt-get.*?root", testing, flags=re.DOTALL)
    assert "KVSTORE_VLLM_VENV" in testing and "kvstore-dev/venv-vllm" in testing
