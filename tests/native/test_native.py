"""The native code: built with the package and only loaded at run time, named where the daemon reports what runs
in C, and the CUDA kernel's launch and source checked without a GPU (its run on one is bench/gpu_check.py's)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess

import pytest
import torch

from conftest import require_native

from harness.daemons import run_cli

import kvstore
from kvstore import native
from kvstore.native import cuda
from kvstore.ops import registry
from support.paths import ROOT



@pytest.fixture
def native_off(monkeypatch):
    monkeypatch.setenv("KVSTORE_NATIVE", "off")
    native.forget()
    cuda.forget()
    yield
    native.forget()
    cuda.forget()


def test_paths_name_the_built_libraries_and_none_when_off(native_off, monkeypatch):
    assert native.paths() == [] and native.describe() == "none"
    monkeypatch.delenv("KVSTORE_NATIVE")
    native.forget()
    require_native("index")
    require_native("copy")
    assert native.paths() == ["index", "copy"] and native.describe() == "index,copy"
    with pytest.raises(ValueError, match="unknown native library 'cuda'"):
        native.load("cuda")


def test_a_bad_kvstore_native_value_is_one_clear_error(monkeypatch):
    for value, hint in (("build", "nothing is built at run time"), ("yes", "")):
        monkeypatch.setenv("KVSTORE_NATIVE", value)
        native.forget()
        with pytest.raises(kvstore.ConfigError, match=rf"KVSTORE_NATIVE='{value}'.*{hint}.*set it to auto or off"):
            native.load("index")
    monkeypatch.setenv("KVSTORE_NATIVE", "Off ")
    native.forget()
    assert native.load("index") is None
    native.forget()


def test_a_daemon_given_a_bad_kvstore_native_stops_before_creating_anything(start_daemon):
    from kvstore.mapped.index_writer import index_path_for
    from kvstore.mapped.arena import arena_path_for

    d = start_daemon(env={"KVSTORE_NATIVE": "build"}, wait=False)
    assert d.proc.wait(30) != 0
    assert "kvstore: error: KVSTORE_NATIVE='build'" in d.log() and "Traceback" not in d.log()
    assert not os.path.exists(index_path_for(d.socket_path)) and not os.path.exists(arena_path_for(d.socket_path))


def test_the_ready_line_and_stats_say_which_paths_are_native(start_daemon):
    require_native("index")
    require_native("copy")
    for env, expected in (({}, "index,copy"), ({"KVSTORE_NATIVE": "off"}, "none")):
        d = start_daemon(env=env)
        ready = next(line for line in d.log().splitlines() if "event=ready" in line)
        assert f" native={expected} " in ready, ready
        shown = run_cli("stats", "--socket", d.socket_path, "--json")
        assert shown.returncode == 0 and json.loads(shown.stdout)["native"] == expected, shown.stderr
        table = run_cli("stats", "--socket", d.socket_path)
        assert "native paths" in table.stdout and expected in table.stdout, table.stdout


def test_nothing_is_compiled_at_run_time():
    """The package's native side loads what the build made; no module of it starts a compiler."""
    for name in sorted(os.listdir(os.path.join(ROOT, "kvstore", "native"))):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(ROOT, "kvstore", "native", name)).read())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & {"subprocess", "distutils", "setuptools"}, name


# -- the CUDA kernel, without a GPU -------------------------------------------------------------------------

def test_cuda_launch_plan():
    """One thread block per (row, plane); 16-byte units when aligned, with fewer threads for short rows."""
    assert cuda.plan(0, 64, 4096, True) is None and cuda.plan(16, 0, 4096, True) is None
    long_row = cuda.plan(16, 64, 16 * 1024, True)
    assert long_row == cuda.Launch(cuda.VEC16, (16, 64), 512, 1024)
    assert cuda.plan(16, 64, 16 * 200, True) == cuda.Launch(cuda.VEC16, (16, 64), 128, 200)
    assert cuda.plan(16, 64, 16 * 8, True) == cuda.Launch(cuda.VEC16, (16, 64), 32, 8)
    assert cuda.plan(3, 2, 1000, False) == cuda.Launch(cuda.BYTES, (3, 2), 256, 1000)
    assert cuda.plan(1, cuda.MAX_GRID_Y, 16, True) is not None
    with pytest.raises(ValueError, match="at most 65535"):
        cuda.plan(1, cuda.MAX_GRID_Y + 1, 16, True)


def test_the_cuda_source_is_found_and_holds_both_kernels():
    source = native.cuda_source()
    assert source is not None and source.name == "kvstore_copy.cu"
    text = source.read_text()
    assert "#include" not in text   # NVRTC, which cupy compiles with, has no host headers
    for kernel in cuda.KERNELS:
        assert f'extern "C" __global__ void {kernel}(' in text


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no CUDA toolkit (nvcc) here to compile the kernel to PTX")
def test_the_cuda_source_compiles_to_both_entry_points(tmp_path):
    """The device code compiles (to PTX: no GPU needed) and exports the two names ``cuda.py`` looks up."""
    out = tmp_path / "kvstore_copy.ptx"
    built = subprocess.run(["nvcc", "--ptx", "-arch=compute_80", "-std=c++14", str(native.cuda_source()),
                            "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    entries = [line for line in out.read_text().splitlines() if ".entry" in line]
    assert sorted(e.split(".entry", 1)[1].strip().rstrip("(") for e in entries) == sorted(cuda.KERNELS)


def test_without_cupy_or_a_gpu_the_cuda_path_is_torch(native_off, monkeypatch):
    monkeypatch.delenv("KVSTORE_NATIVE")
    try:
        import cupy  # noqa: F401
        pytest.skip("cupy is installed here")
    except ImportError:
        pass
    assert cuda.module() is None
    gpu = torch.device("cuda")
    assert registry.select(gpu) is registry.TORCH
    with pytest.raises(RuntimeError, match=r"need cupy \(pip install 'kvstore\[gpu\]'\)"):
        registry.select(gpu, "native")


def test_the_cuda_kernel_cache_is_a_directory_the_daemon_may_write(monkeypatch, tmp_path):
    """``KVSTORE_NATIVE_DIR``, else systemd's ``CacheDirectory=``, else the XDG cache; cupy is pointed there
    only while it compiles, and a ``CUPY_CACHE_DIR`` already set is left alone."""
    for name in ("KVSTORE_NATIVE_DIR", "CACHE_DIRECTORY", "CUPY_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert native.cuda_cache_dir() == tmp_path / "xdg" / "kvstore" / "cuda"
    monkeypatch.setenv("CACHE_DIRECTORY", f"{tmp_path}/var:{tmp_path}/other")
    assert native.cuda_cache_dir() == tmp_path / "var" / "cuda"
    monkeypatch.setenv("KVSTORE_NATIVE_DIR", str(tmp_path / "forced"))
    assert native.cuda_cache_dir() == tmp_path / "forced"
    with cuda._cupy_cache_dir():
        assert os.environ["CUPY_CACHE_DIR"] == str(tmp_path / "forced") and (tmp_path / "forced").is_dir()
    assert "CUPY_CACHE_DIR" not in os.environ
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "users"))
    with cuda._cupy_cache_dir():
        assert os.environ["CUPY_CACHE_DIR"] == str(tmp_path / "users")
    assert os.environ["CUPY_CACHE_DIR"] == str(tmp_path / "users")


class _Kernel:
    """Stands in for a cupy RawKernel (cupy cannot run here): records the compile's cache dir and each launch."""

    def __init__(self, name: str, calls: list) -> None:
        self.name, self.calls = name, calls

    @property
    def kernel(self) -> str:
        self.calls.append(("compile", self.name, os.environ.get("CUPY_CACHE_DIR")))
        return self.name

    def __call__(self, grid, block, args, stream=None) -> None:
        self.calls.append(("launch", self.name, grid, block, args, stream))


def test_the_cuda_launch_packs_each_argument_as_the_kernel_declares_it(monkeypatch, tmp_path):
    """Pointers as 8-byte words, the int64 sizes as int64, ``to_chunk`` as a 4-byte int, on the caller's stream;
    the kernels compiled once per device, with cupy's cache in kvstore's directory."""
    import contextlib
    import types

    import numpy as np

    calls: list = []
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=lambda index: contextlib.nullcontext(), ExternalStream=lambda ptr: ("stream", ptr)))
    module = types.SimpleNamespace(get_function=lambda name: _Kernel(name, calls))
    monkeypatch.delenv("CUPY_CACHE_DIR", raising=False)
    monkeypatch.setenv("KVSTORE_NATIVE_DIR", str(tmp_path))
    kernels = cuda.CudaKernels(fake, module)
    launch = cuda.plan(4, 6, 4096, True)
    for _ in range(2):
        kernels.copy_rows(launch, 0, 0xABC, (0x1000, 8192, 0x2000, 4, 64, 0x3000, 1))
    compiles = [c for c in calls if c[0] == "compile"]
    assert compiles == [("compile", k, str(tmp_path)) for k in cuda.KERNELS]   # once, in kvstore's cache dir
    launches = [c for c in calls if c[0] == "launch"]
    assert len(launches) == 2
    _, name, grid, block, args, stream = launches[0]
    assert (name, grid, block, stream) == (cuda.VEC16, (4, 6), (128,), ("stream", 0xABC))
    assert [type(a) for a in args] == [np.uint64, np.int64, np.int64, np.uint64, np.int64, np.int64, np.uint64,
                                       np.int32]
    assert [int(a) for a in args] == [0x1000, 8192, 256, 0x2000, 4, 64, 0x3000, 1]
    assert "CUPY_CACHE_DIR" not in os.environ
