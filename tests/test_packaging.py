"""The installed package matches the source tree, and the public surface is what __all__ says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
import zipfile

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import kvstore

from daemons import Daemons, run_cli, sandbox_env, short_tempdir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_packages() -> set[str]:
    found = set()
    for top, name in (("kvstore", "kvstore"),):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, os.path.join(ROOT, top))
                found.add(name if rel == "." else name + "." + rel.replace(os.sep, "."))
    return found


def test_every_package_is_listed_in_pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    assert source_packages() == listed


def test_public_surface_is_exactly_all():
    """As httpx does: every public name the package holds is exported, and __all__ names nothing else (submodules
    are reachable as attributes once imported, but are not part of the surface)."""
    public = {name for name, value in vars(kvstore).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert public | {"__version__"} == set(kvstore.__all__)
    assert len(kvstore.__all__) == len(set(kvstore.__all__))


def test_every_error_is_one_tree():
    """Every exception class kvstore defines descends from KVStoreError (the remote, checksum and format errors
    too), so one ``except KVStoreError`` catches whatever kvstore raised on purpose."""
    from kvstore import errors

    defined = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, BaseException)]
    assert {c.__name__ for c in defined} >= {"RemoteError", "ChecksumError", "FormatError", "RecordError",
                                             "DamagedSource"}
    assert all(issubclass(c, errors.KVStoreError) for c in defined)
    assert issubclass(errors.FormatError, ValueError)   # a bad header is also a bad value, as before
    assert not hasattr(errors, "NotFoundError") and errors.error_from_code(6, "x").__class__ is errors.InternalError


def test_wire_error_codes_are_unique_and_stable():
    from kvstore import errors
    codes = {cls.__name__: cls.code for cls in errors.RequestError.__subclasses__()}
    assert len(set(codes.values())) == len(codes)
    assert codes["BadRequestError"] == 1 and codes["StoreFullError"] == 5 and codes["InternalError"] == 11


def test_every_setting_is_documented_in_the_readme():
    from kvstore.config import SETTINGS

    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    missing = [s.name for s in SETTINGS if f"`--{s.name.replace('_', '-')}" not in readme]
    assert not missing, f"settings missing from the README's flag table: {missing}"


# -- torch is the engine side's extra: the daemon, the CLI and the client run without it ----------------------

SIDECAR_MODULES = ["kvstore", "kvstore.cli.main", "kvstore.cli.serve", "kvstore.cli.stats", "kvstore.cli.keygen",
                   "kvstore.cli.alerts", "kvstore.cli.simulate", "kvstore.cli.route", "kvstore.cli.watch",
                   "kvstore.client.client", "kvstore.server.daemon", "kvstore.routing", "kvstore.sim.replay"]


def torch_blocker(where: str) -> dict[str, str]:
    """An environment in which ``import torch`` fails as it does where torch is not installed."""
    with open(os.path.join(where, "torch.py"), "w") as f:
        f.write("raise ImportError('torch is not installed (blocked by the test)')\n")
    return {"PYTHONPATH": os.pathsep.join([where, ROOT, os.environ.get("PYTHONPATH", "")])}


def test_sidecar_modules_never_import_torch():
    code = ("import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code, *SIDECAR_MODULES], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


CLIENT = """
import sys, kvstore
with kvstore.connect(sys.argv[1], namespace="no-torch", timeout=10) as c:
    keys = c.chunk_keys(list(range(512)))
    c.put(keys, [b"a" * 5000, bytearray(b"b" * 7000)])
    with c.get(keys) as views:
        assert [bytes(v) for v in views] == [b"a" * 5000, b"b" * 7000]
    print(c.lookup(keys), "torch" in sys.modules)
"""


def test_daemon_cli_and_client_work_where_torch_is_not_installed(tmp_path):
    env = torch_blocker(str(tmp_path))
    with Daemons() as daemons:
        d = daemons.start(env=env)
        got = subprocess.run([sys.executable, "-c", CLIENT, d.address], capture_output=True, text=True, timeout=60,
                             env=sandbox_env(str(tmp_path), env))
        assert got.returncode == 0, got.stderr
        assert got.stdout.split() == ["2", "False"]
        stats = run_cli("stats", "--socket", d.socket_path, "--json", env=env)
        assert stats.returncode == 0 and json.loads(stats.stdout)["tiers"]["host"]["chunks"] == 2, stats.stderr
        assert "internal_error" not in d.log() and "Traceback" not in d.log()
    refused = run_cli("serve", "--socket", str(tmp_path / "g.sock"), "--host-mem", "8MiB", "--gpu-mem", "1GiB",
                      env=env)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "kvstore: error: --gpu-mem needs torch (with CUDA), which is not installed: pip install 'kvstore[gpu]'"]


def test_torch_is_an_extra_not_a_dependency():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert not [d for d in project["dependencies"] if d.startswith("torch")]
    extras = project["optional-dependencies"]
    for extra in ("engine", "test", "gpu"):
        assert any(d.startswith("torch") for d in extras[extra]), extra


# -- the wheel carries what an installed kvstore needs ----------------------------------------------------------

def build_wheel(where: str) -> str:
    """``pip wheel`` of a copy of the source tree (so that no build/ or egg-info lands in the checkout)."""
    src = os.path.join(where, "src")
    shutil.copytree(os.path.join(ROOT, "kvstore"), os.path.join(src, "kvstore"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", src, "--no-deps", "--no-build-isolation", "-q",
                          "-w", os.path.join(where, "dist")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = [os.path.join(where, "dist", n) for n in os.listdir(os.path.join(where, "dist"))]
    return wheel


@pytest.fixture(scope="module")
def wheel():
    where = short_tempdir("wheel-")
    yield build_wheel(where)
    shutil.rmtree(where, ignore_errors=True)


def test_wheel_holds_every_module_and_the_native_sources(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"kvstore/ops/native_src/kvstore_copy.c", "kvstore/ops/native_src/kvstore_copy.cu"} <= names
    expected = {os.path.relpath(os.path.join(top, f), ROOT)
                for top, _, files in os.walk(os.path.join(ROOT, "kvstore")) for f in files if f.endswith(".py")}
    assert expected <= names, sorted(expected - names)


def see_this_environment(python: str) -> None:
    """Let the venv of ``python`` import this environment's packages (pyzmq, msgpack, ...) after its own.

    ``venv --system-site-packages`` would not do: made from a virtualenv's interpreter it sees the base Python's
    site-packages, not the virtualenv's, where the README's commands install the dependencies. A ``.pth`` file
    that names this environment's site directories adds them after the venv's own (their own ``.pth`` files,
    an editable kvstore among them, are not run), so the installed wheel's kvstore is the one imported."""
    import site

    own = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                         text=True, check=True, timeout=60).stdout.strip()
    with open(os.path.join(own, "outer-environment.pth"), "w") as f:
        f.write("".join(path + "\n" for path in site.getsitepackages() if os.path.isdir(path)))


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_an_installed_wheel_builds_the_native_kernels(wheel):
    """Installed (not editable) into a fresh venv, away from the checkout: the kernels build from package data."""
    where = short_tempdir("venv-")
    try:
        venv = os.path.join(where, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
        python = os.path.join(venv, "bin", "python")
        see_this_environment(python)
        # --ignore-installed: a kvstore visible to pip already (an editable install, a checkout on PYTHONPATH)
        # must not stand in for the wheel
        subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--ignore-installed",
                        "-q", wheel],
                       check=True, capture_output=True, timeout=300)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["KVSTORE_NATIVE_DIR"] = os.path.join(where, "native")
        out = subprocess.run([python, "-m", "kvstore.ops.native", "cpu"], capture_output=True, text=True,
                             timeout=300, cwd=where, env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stderr == ""   # no runpy warning, no missing-sources message
        assert out.stdout.startswith(f"cpu: {env['KVSTORE_NATIVE_DIR']}/kvstore_copy_cpu_")
        assert out.stdout.strip().endswith(".so")
        where_from = subprocess.run([python, "-c", "import kvstore.ops.native as n; print(n.SOURCE_DIR)"],
                                    capture_output=True, text=True, cwd=where, env=env, timeout=120).stdout.strip()
        assert where_from.startswith(venv + "/"), where_from
    finally:
        shutil.rmtree(where, ignore_errors=True)


# -- the first screen: two commands, what the test command skips, and CI running it verbatim -----------------

def first_screen() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        return "".join(f.readlines()[:40])


def test_readme_first_screen_has_two_commands_and_names_what_the_tests_skip():
    screen = first_screen()
    block = screen.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["pip install -e . && kvstore serve", "pip install -e '.[test]' && python -m pytest"]
    assert "torch==" not in screen and "picks the CPU build" not in screen
    skip_line = next(line for line in screen.splitlines() if line.startswith("The test command skips"))
    for what in ("vLLM", "SGLang", "Mooncake", "Redis", "`bash .ci/install-extras.sh`"):
        assert what in skip_line, what


def test_ci_installs_torch_first_and_runs_the_readme_test_command_verbatim():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        steps = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    block = first_screen().split("```sh\n", 1)[1].split("```", 1)[0]
    test_command = block.splitlines()[1].split("#", 1)[0].strip()
    pip = [s for s in steps if s.startswith("pip install")]
    assert pip[0] == "pip install torch==2.13.0"
    assert "bash .ci/install-extras.sh" in steps and steps[-1] == test_command


def test_ci_runs_everything_in_a_fresh_virtualenv_it_makes():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        steps = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    made = next(i for i, s in enumerate(steps) if s.startswith("python3 -m venv "))
    activated = next(i for i, s in enumerate(steps) if s.endswith("/bin/activate\"") and s.startswith("."))
    first_pip = next(i for i, s in enumerate(steps) if s.startswith("pip install"))
    assert steps[made - 1].startswith("rm -rf ") and made < activated < first_pip   # fresh, then used
    assert any(s.startswith('export PYTHON="$VENV/bin/python"') for s in steps)   # and so do the .ci/install-*.sh
    with open(os.path.join(ROOT, ".gitignore")) as f:
        assert "/.venv-ci/" in f.read().split()


def test_install_extras_runs_every_installer_once(tmp_path):
    ci = tmp_path / ".ci"
    ci.mkdir()
    shutil.copy(os.path.join(ROOT, ".ci", "install-extras.sh"), ci)
    for name in ("install-a.sh", "install-vllm-engine.sh"):
        (ci / name).write_text(f'echo {name} >> "$(dirname "$0")/ran"\n')
    out = subprocess.run(["bash", str(ci / "install-extras.sh")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (ci / "ran").read_text().split() == ["install-a.sh", "install-vllm-engine.sh"]


def test_skips_for_missing_extras_name_the_install_command():
    import servers

    for check in (lambda: servers.require("no-such-server-binary"),
                  lambda: servers.require_module("no_such_module_for_kvstore", "the thing")):
        with pytest.raises(pytest.skip.Exception, match=r"`bash \.ci/install-extras\.sh` installs it"):
            if servers.in_ci():
                pytest.skip("under CI a missing extra fails instead: `bash .ci/install-extras.sh` installs it")
            check()
