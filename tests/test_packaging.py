"""The installed package matches the source tree, and the public surface is what __all__ says."""

from __future__ import annotations

import os
import sys
import types

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import kvstore

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
