"""The native libraries, built with the wheel or the editable install (see docs/design/native.md).

Everything else about the package is in pyproject.toml. The C sources in native/ are built by setuptools'
build_ext into plain shared libraries (no Python C API: they are called through ctypes), named without a Python
ABI tag, next to the Python side in kvstore/native/. Each library is optional: where a compiler (or OpenMP) is
missing its build is skipped with a warning and kvstore runs the Python path instead. The CUDA kernel
(native/kvstore_copy.cu) is not compiled here but shipped as a source, which cupy compiles at first use.
"""

from __future__ import annotations

import os
import shutil

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

CUDA_SOURCE = os.path.join("native", "kvstore_copy.cu")

# The engine side lives in the top-level connectors/ and is installed as kvstore.connectors.<engine>, the import
# path users' engine configs name (see kvstore/connectors/__init__.py for the checkout's side of the mapping).
ENGINE_PACKAGES = {f"kvstore.connectors.{name}": os.path.join("connectors", *name.split("."))
                   for name in find_packages("connectors")}
PACKAGES = find_packages(include=["kvstore", "kvstore.*"]) + sorted(ENGINE_PACKAGES)

LIBRARIES = [
    # the lookup index's walk and placement: plain C, no dependency
    Extension("kvstore.native._kvstore_index", [os.path.join("native", "kvstore_index.c")],
              extra_compile_args=["-O3"], optional=True),
    # the host gather/scatter: OpenMP
    Extension("kvstore.native._kvstore_copy", [os.path.join("native", "kvstore_copy.c")],
              extra_compile_args=["-O3", "-fopenmp"], extra_link_args=["-fopenmp"], optional=True),
]


class BuildSharedLibraries(build_ext):
    """build_ext for libraries loaded through ctypes: ``<name>.so``, with no Python symbols to export."""

    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return ext.export_symbols   # no PyInit_<name>: these are not Python modules

    def copy_file(self, infile: str, outfile: str, *args: object, **kwargs: object) -> tuple[str, bool]:
        """Put a library built for the editable install in place by renaming a copy over the old one.

        A copy over the old file would truncate it under every process that maps it (a running daemon, a test
        run of the same checkout), which then dies of SIGBUS; a rename leaves them the old file's pages.
        """
        partial = f"{outfile}.partial-{os.getpid()}"
        _, copied = super().copy_file(infile, partial, *args, **kwargs)  # type: ignore[arg-type]
        os.replace(partial, outfile)
        return outfile, copied


class BuildWithKernelSource(build_py):
    """build_py that also puts the CUDA kernel's source in the package, for cupy to compile where it runs."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:   # an editable install reads native/ of the checkout
            target = os.path.join(self.build_lib, "kvstore", "native")
            os.makedirs(target, exist_ok=True)
            shutil.copy(CUDA_SOURCE, target)


setup(packages=PACKAGES, package_dir=ENGINE_PACKAGES, ext_modules=LIBRARIES,
      cmdclass={"build_ext": BuildSharedLibraries, "build_py": BuildWithKernelSource})
