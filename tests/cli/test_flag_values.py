"""Flag and config values the commands once misread or misnamed each get one line that says how to fix them
(issue 40, item 5): a size without a unit that is a fraction or less than a page, a negative duration, a
config file's value refused at start named by its key in the file, and the positive counts and durations every
command checks the same way (``kvstore/cli/flag_types.py``)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from harness.daemons import run_cli, short_tempdir

from kvstore.errors import ConfigError
from kvstore.units import parse_count, parse_seconds, parse_size


@pytest.fixture
def workdir():
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The one error line of a refused command (event lines logged before it are fine; a traceback is not)."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    errors = [line for line in result.stderr.splitlines() if not line.startswith("ts=")]
    assert len(errors) == 1 and errors[0].startswith("kvstore"), result.stderr
    return errors[0]


@pytest.mark.parametrize("text, needle", [
    ("1.5", "'1.5' has no unit, so it would be bytes, and bytes are whole; write the unit, e.g. 1.5GiB"),
    ("16", "'16' has no unit, so it would be 16 bytes, less than a page; write the unit, e.g. 16GiB or 16MiB"),
    (1, "'1' has no unit, so it would be 1 byte, less than a page"),
    ("1.5b", "'1.5b' is not a whole number of bytes"),
])
def test_a_size_without_its_unit_is_refused_with_the_unit_to_write(text, needle):
    with pytest.raises(ConfigError, match=r"^--gpu-mem: ") as err:
        parse_size(text, "--gpu-mem")
    assert needle in str(err.value)


@pytest.mark.parametrize("text, size", [("0", 0), (0, 0), ("4096", 4096), ("16B", 16), ("1.5GiB", 3 << 29),
                                        ("1000000", 1000000)])
def test_sizes_in_bytes_and_with_units_are_read_as_before(text, size):
    assert parse_size(text, "--host-mem") == size


@pytest.mark.parametrize("text", ["-1", " -5s", -1, "0", 0])
def test_a_duration_that_is_not_positive_says_it_must_be(text):
    with pytest.raises(ConfigError, match=r"^--lease-ttl: must be positive, got"):
        parse_seconds(text, "--lease-ttl")


@pytest.mark.parametrize("text, needle", [("0", "must be positive, got '0'"), ("-2", "must be positive, got '-2'"),
                                          ("x", "expected a whole number, got 'x'"),
                                          ("1.5", "expected a whole number, got '1.5'")])
def test_a_count_that_is_not_a_positive_whole_number_says_so(text, needle):
    with pytest.raises(ConfigError, match="^--fleet: " + needle):
        parse_count(text, "--fleet")


@pytest.mark.parametrize("args, needle", [
    (["serve", "--host-mem", "1.5"], "--host-mem: '1.5' has no unit, so it would be bytes"),
    (["serve", "--gpu-mem", "16"], "--gpu-mem: '16' has no unit, so it would be 16 bytes, less than a page"),
    (["serve", "--lease-ttl", "-1"], "--lease-ttl: must be positive, got '-1'"),
    (["route", "--instance", "a=ipc:///x", "--chunk-tokens", "0"], "argument --chunk-tokens: must be positive"),
    (["route", "--instance", "a=ipc:///x", "--deadline-ms", "-5"], "argument --deadline-ms: must be positive"),
    (["simulate", "t.jsonl", "--host-mem", "1GiB", "--chunk-bytes", "1MiB", "--fleet", "x"],
     "argument --fleet: expected a whole number, got 'x'"),
    (["scrub", "--timeout", "-1"], "argument --timeout: must be positive, got '-1'"),
    (["scrub", "--rate", "1.5"], "argument --rate: '1.5' has no unit"),
    (["reload", "--timeout", "0"], "argument --timeout: must be positive, got '0'"),
])
def test_a_bad_value_gives_one_line_naming_its_flag(args, needle):
    assert needle in one_line_error(run_cli(*args))


def test_a_config_files_disk_size_refused_at_start_is_named_by_its_key(workdir):
    """A disk size no larger than the filesystem passes the checks of the configuration, and is refused when the
    tier is set up (the room it can really have is less); the line names the file and its key, not the flag."""
    disk = os.path.join(workdir, "disk")
    total = shutil.disk_usage(workdir).total
    config = os.path.join(workdir, "kvstore.toml")
    with open(config, "w") as f:
        f.write(f'disk_dir = "{disk}"\ndisk_size = {total}\nhost_mem = "16MiB"\n'
                f'socket = "{os.path.join(workdir, "kv.sock")}"\n')
    line = one_line_error(run_cli("serve", "--config", config, timeout=60))
    assert f"{config}: disk_size: " in line and "does not fit the filesystem" in line, line
    assert "--disk-size" not in line, line
