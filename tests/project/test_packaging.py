"""The installed package matches the source tree, and the public surface is what __all__ says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import types
import zipfile

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import kvstore

from harness.daemons import Daemons, run_cli, sandbox_env, short_tempdir
from support.paths import ROOT



def source_packages() -> set[str]:
    found = set()
    for top, name in (("kvstore", "kvstore"), ("connectors", "kvstore.connectors")):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, os.path.join(ROOT, top))
                found.add(name if rel == "." else name + "." + rel.replace(os.sep, "."))
    return found


def test_every_package_is_found_by_setup():
    """setup.py's package list (kvstore/ found, connectors/ mapped to kvstore.connectors) holds every package of
    the source tree and nothing else; pyproject keeps no second, hand-written list."""
    import setuptools  # noqa: F401 - provides distutils on Python 3.12 and later
    from distutils.core import run_setup

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        assert "packages" not in tomllib.load(f)["tool"].get("setuptools", {})
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        dist = run_setup(os.path.join(ROOT, "setup.py"), stop_after="init")
    finally:
        os.chdir(cwd)
    assert set(dist.packages) == source_packages()


def test_the_daemon_runs_its_loop_with_uvloop_run():
    """``uvloop.install()`` (deprecated: it replaces the process's event loop policy) is called nowhere."""
    import ast

    for dirpath, _, files in os.walk(os.path.join(ROOT, "kvstore")):
        for name in (f for f in files if f.endswith(".py")):
            path = os.path.join(dirpath, name)
            for node in ast.walk(ast.parse(open(path).read(), path)):
                if isinstance(node, ast.Attribute) and node.attr == "install":
                    assert not (isinstance(node.value, ast.Name) and node.value.id == "uvloop"), path
    from kvstore.server.lifecycle import daemon

    assert "from uvloop import run" in open(daemon.__file__).read()


def test_one_version_source():
    """The version is written once, in kvstore/_version.py; pyproject reads it from there."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        pyproject = tomllib.load(f)
    assert "version" not in pyproject["project"] and pyproject["project"]["dynamic"] == ["version"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kvstore._version.__version__"}
    with open(os.path.join(ROOT, "LICENSE")) as f:
        license_text = f.read()
    assert pyproject["project"]["license"] == "Apache-2.0" and "Apache License" in license_text
    assert "Version 2.0, January 2004" in license_text and "END OF TERMS AND CONDITIONS" in license_text


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


# -- torch is the engine side's extra: the daemon, the CLI and the client run without it ----------------------

SIDECAR_MODULES = ["kvstore", "kvstore.cli.main", "kvstore.cli.serve", "kvstore.cli.stats", "kvstore.cli.keygen",
                   "kvstore.cli.alerts", "kvstore.cli.simulate", "kvstore.cli.route", "kvstore.cli.watch",
                   "kvstore.client.client", "kvstore.server.lifecycle.daemon", "kvstore.routing", "kvstore.sim.replay"]


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


# -- the wheel carries what an installed kvstore needs, and builds its native libraries --------------------------

SOURCE_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE")


def build_wheel(where: str, env: dict[str, str] | None = None) -> str:
    """``pip wheel`` of a copy of the source tree (so that no build/ or egg-info lands in the checkout), which
    builds the native libraries from native/ (``env``: e.g. ``CC=false``, a machine without a compiler)."""
    src = os.path.join(where, "src")
    for top in ("kvstore", "connectors", "native"):
        shutil.copytree(os.path.join(ROOT, top), os.path.join(src, top),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    for name in SOURCE_FILES:
        shutil.copy(os.path.join(ROOT, name), src)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", src, "--no-deps", "--no-build-isolation", "-q",
                          "-w", os.path.join(where, "dist")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = [os.path.join(where, "dist", n) for n in os.listdir(os.path.join(where, "dist"))]
    return wheel


def has_compiler() -> bool:
    return shutil.which(os.environ.get("CC") or "cc") is not None


@pytest.fixture(scope="module")
def wheel():
    where = short_tempdir("wheel-")
    yield build_wheel(where)
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="module")
def wheel_without_compiler():
    where = short_tempdir("wheel-")
    yield build_wheel(where, {"CC": "false"})
    shutil.rmtree(where, ignore_errors=True)


def test_wheel_holds_every_module_the_license_and_the_cuda_source(wheel):
    assert os.path.basename(wheel).startswith(f"kvstore-{kvstore.__version__}-")   # the one version source
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "kvstore/native/kvstore_copy.cu" in names   # compiled through cupy where a GPU is used
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)
    expected = {os.path.relpath(os.path.join(top, f), ROOT)
                for top, _, files in os.walk(os.path.join(ROOT, "kvstore")) for f in files if f.endswith(".py")}
    assert expected <= names, sorted(expected - names)


@pytest.mark.skipif(not has_compiler(), reason="no C compiler here to build the native libraries")
def test_the_wheel_holds_the_built_native_libraries(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"kvstore/native/_kvstore_index.so", "kvstore/native/_kvstore_copy.so"} <= names
    assert not any(n.endswith((".c", ".o")) for n in names)


def test_the_source_distribution_holds_the_native_sources_and_the_build_script(tmp_path):
    src = tmp_path / "src"
    for top in ("kvstore", "connectors", "native"):
        shutil.copytree(os.path.join(ROOT, top), src / top, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in SOURCE_FILES:
        shutil.copy(os.path.join(ROOT, name), src)
    out = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], cwd=src,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").iterdir()
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"setup.py", "LICENSE", "native/kvstore_index.c", "native/kvstore_copy.c", "native/kvstore_copy.cu",
            "kvstore/native/__init__.py"} <= names, sorted(names)
    assert not any(n.endswith(".so") for n in names)


INSTALLED = """
import os, sys, torch
import kvstore
from kvstore import native
from kvstore.mapped.index_reader import SharedIndexView
from kvstore.ops import registry
from kvstore.protocol.index_layout import HOST
from kvstore.mapped.index_writer import PublishedIndex

writer = PublishedIndex(sys.argv[1], 16)
reader = SharedIndexView(sys.argv[1])
keys = [os.urandom(16) for _ in range(3)]
writer.set_many([(k, HOST, None, 100) for k in keys])
writer.beat()
print(native.describe(), registry.select(torch.device("cpu")).name, reader.lookup(keys, False) == (3, {"host": 3}),
      os.path.dirname(kvstore.__file__))
reader.close()
writer.close()
"""


def run_installed(wheel: str, where: str) -> list[str]:
    """Install ``wheel`` (not editable) into a fresh venv away from the checkout and run ``INSTALLED`` there: the
    shared index written and read, and the gather/scatter choice. The venv sees this interpreter's packages
    through PYTHONPATH (the wheel's dependencies, torch), never the checkout or an editable install of it."""
    venv = os.path.join(where, "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    python = os.path.join(venv, "bin", "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel],
                   check=True, capture_output=True, timeout=300)
    import sysconfig

    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    out = subprocess.run([python, "-c", INSTALLED, os.path.join(where, "index")], capture_output=True, text=True,
                         timeout=120, cwd=where, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    words = out.stdout.split()
    assert words[-1].startswith(venv + "/"), words   # the installed package ran, not the checkout
    assert words[2] == "True", words                 # the index answered
    return words[:2]


@pytest.mark.skipif(not has_compiler(), reason="no C compiler here to build the native libraries")
def test_an_installed_wheel_runs_its_built_native_libraries(wheel):
    where = short_tempdir("venv-")
    try:
        assert run_installed(wheel, where) == ["index,copy", "gather:torch,scatter:native"]
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_without_a_compiler_the_wheel_builds_installs_and_runs_the_python_paths(wheel_without_compiler):
    names = set(zipfile.ZipFile(wheel_without_compiler).namelist())
    assert not any(n.endswith(".so") for n in names) and "kvstore/native/kvstore_copy.cu" in names
    where = short_tempdir("venv-")
    try:
        assert run_installed(wheel_without_compiler, where) == ["none", "torch"]
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


def ci_steps() -> list[str]:
    """The commands of .ci/run, one a line, comments left out."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]


def readme_test_command() -> str:
    block = first_screen().split("```sh\n", 1)[1].split("```", 1)[0]
    return block.splitlines()[1].split("#", 1)[0].strip()


def test_ci_runs_the_readme_test_command_first_where_nothing_but_torch_is_installed():
    steps = ci_steps()
    bare_run = steps.index(readme_test_command())   # its first run
    before = steps[:bare_run]
    assert "bash .ci/install-extras.sh" in steps[bare_run:]
    extras = extras_venv_steps()
    installs = [s for s in before if " install " in f" {s} " and s not in extras]
    assert installs == ['"$BARE/bin/pip" install torch==2.13.0']   # a fresh virtualenv, torch only
    assert not any("$BARE" in s for s in extras if " install " in f" {s} ")   # the other one is built aside
    assert before.index('rm -rf "$BARE"') < before.index('python3 -m venv "$BARE"')
    assert "export KVSTORE_TEST_BARE=1" in before   # missing extras skip with their reason, even under CI


def test_ci_builds_the_engines_during_the_bare_run_and_waits_for_them_before_the_extras():
    steps = ci_steps()
    bare_run = steps.index(readme_test_command())
    started = steps.index(') >"$ENGINE_LOG" 2>&1 &')
    waited = next(i for i, s in enumerate(steps) if s.startswith('if ! wait "$ENGINES"'))
    assert started < bare_run < waited < steps.index("bash .ci/install-extras.sh")
    engine_installs = [s for s in steps[:started] if ".ci/install-" in s]
    assert engine_installs == ["nice -n 19 bash .ci/install-vllm-engine.sh",
                               "nice -n 19 bash .ci/install-sglang-engine.sh"]


def extras_venv_steps() -> list[str]:
    """The steps that make the virtualenv with every extra, in the background during the run without extras."""
    steps = ci_steps()
    return steps[steps.index('EXTRAS_LOG="$(mktemp)"') + 2:steps.index(') >"$EXTRAS_LOG" 2>&1 &')]


def test_ci_installs_torch_first_and_runs_the_readme_test_command_verbatim():
    steps = ci_steps()
    test_command = readme_test_command()
    extras = extras_venv_steps()
    pip = [s.removeprefix("nice -n 19 ") for s in extras if "pip install" in s]
    assert pip[0] == "pip install torch==2.13.0"
    main_run = steps[steps.index(test_command) + 1:]   # after the run without extras
    assert "bash .ci/install-extras.sh" in main_run and main_run[-1] == test_command


def test_ci_makes_the_extras_virtualenv_once_the_bare_run_installed_kvstore_and_waits_for_it():
    """Two editable installs of one checkout at once race on its metadata; the servers wait for the bare run's
    end, which must not see one appear; the lint gate and the docs fail the run from the background too."""
    steps = ci_steps()
    extras = extras_venv_steps()
    assert extras[1].startswith('until "$BARE/bin/python" -c') and "kvstore" in extras[1]
    assert {"nice -n 19 bash .ci/lint.sh \"$PYTHON\"", "nice -n 19 bash .ci/docs.sh \"$PYTHON\""} <= set(extras)
    assert not any("install-extras" in s or "install-peers" in s or "install-ops" in s for s in extras)
    waited = next(i for i, s in enumerate(steps) if s.startswith('if ! wait "$EXTRAS"'))
    assert steps.index(readme_test_command()) < waited < steps.index("bash .ci/install-extras.sh")


def test_ci_runs_each_test_once_across_its_two_runs():
    steps = ci_steps()
    bare_run = steps.index(readme_test_command())
    assert 'export KVSTORE_TEST_PASSED_LOG="$PASSED"' in steps[:bare_run]
    assert steps[-2:] == ['export KVSTORE_TEST_SKIP_PASSED="$PASSED"', readme_test_command()]


def test_a_run_leaves_out_exactly_the_tests_a_run_before_passed(tmp_path):
    """The first run lists what passed (not what failed or skipped); the second runs the rest."""
    (tmp_path / "test_three.py").write_text(
        "import pytest\n"
        "def test_passes(): pass\n"
        "def test_fails(): assert False\n"
        "def test_skips(): pytest.skip('an extra is missing')\n")
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {os.path.join(ROOT, 'tests')!r})\n"
        "from support import runs_once\n"
        "def pytest_configure(config): runs_once.register(config)\n"
        "def pytest_collection_modifyitems(config, items): runs_once.leave_out_passed(config, items)\n")
    log = tmp_path / "passed.txt"

    def run(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_three.py"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**os.environ, **env})

    run(KVSTORE_TEST_PASSED_LOG=str(log))
    assert log.read_text().split() == ["test_three.py::test_passes"]
    again = run(KVSTORE_TEST_SKIP_PASSED=str(log))
    assert "1 failed, 1 skipped, 1 deselected" in again.stdout
    assert "1 tests passed in the run before" in again.stdout


def test_ci_runs_everything_in_a_fresh_virtualenv_it_makes():
    steps = ci_steps()
    made = steps.index('python3 -m venv "$VENV"')
    activated = steps.index('. "$VENV/bin/activate"')
    first_pip = next(i for i, s in enumerate(steps) if i > activated and "pip install" in s)
    assert steps[made - 1].startswith("rm -rf ") and made < activated < first_pip   # fresh, then used
    assert any(s.startswith('export PYTHON="$VENV/bin/python"') for s in steps)   # and so do the .ci/install-*.sh
    with open(os.path.join(ROOT, ".gitignore")) as f:
        ignored = f.read().split()
    assert "/.venv-ci/" in ignored and "/.venv-bare/" in ignored


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
    from harness import servers

    for check in (lambda: servers.require("no-such-server-binary"),
                  lambda: servers.require_module("no_such_module_for_kvstore", "the thing")):
        with pytest.raises(pytest.skip.Exception, match=r"`bash \.ci/install-extras\.sh` installs it"):
            if servers.extras_required():
                pytest.skip("under CI a missing extra fails instead: `bash .ci/install-extras.sh` installs it")
            check()
