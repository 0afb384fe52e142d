"""A remote store's password never reaches a log line, ``stats``, ``repr`` or an error message (issue 14, item 11).

The store is a real ``redis-server`` with ``requirepass``; the daemon is given a wrong password first (so that
every call fails and is logged, at debug level) and the right one second (so that redaction does not get in the
way of authenticating).
"""

from __future__ import annotations

import json

import pytest

from kvstore.tiers.remote import open_backend
from kvstore.security.redact import redact_url
from conftest import wait_for
from harness.daemons import run_cli

from harness.servers import RedisServer, require

PASSWORD = "pw-4c1f9e-not-for-logs"


@pytest.mark.parametrize("url, shown", [
    ("redis://user:secret@h:6379/0", "redis://user:***@h:6379/0"),
    ("redis://:secret@h", "redis://:***@h"),
    ("redis://secret@h", "redis://***@h"),
    ("redis://user:p@ss@h", "redis://user:***@h"),
    ("rediss://h:6380?password=secret&ttl=3600", "rediss://h:6380?password=***&ttl=3600"),
    ("mooncake://m:50051?metadata=http://u:secret@m:8080/metadata", "mooncake://m:50051?metadata=http://u:***@m:8080/metadata"),
    ("redis://h:6379", "redis://h:6379"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown


@pytest.fixture
def redis_with_password(tmp_path):
    server = RedisServer(tmp_path / "redis", binary=require("redis-server"), extra=["--requirepass", PASSWORD]).start()
    yield server
    server.stop()


def test_password_never_shown_by_the_daemon(start_daemon, redis_with_password):
    wrong = redis_with_password.url.replace("redis://", f"redis://default:{PASSWORD}-wrong@")
    d = start_daemon("--remote", wrong, "--log-level", "debug")
    with d.client(namespace="r") as c:
        keys = c.chunk_keys(list(range(512)))
        c.put(keys[:1], [b"x" * 4096])
        c.lookup(keys)   # a local miss asks the store
        assert wait_for(lambda: c.stats()["remote"]["errors"] > 0, 10)
        stats = json.dumps(c.stats())
    assert d.stop() == 0
    log = d.log()
    assert "redis://default:***@127.0.0.1" in log and "unavailable" in log   # the failure is logged, redacted
    assert PASSWORD not in log and PASSWORD not in stats


def test_backend_repr_and_errors_hide_the_password(redis_with_password):
    url = redis_with_password.url.replace("redis://", f"redis://default:{PASSWORD}@")
    with open_backend(url, timeout=2.0) as backend:
        assert PASSWORD not in repr(backend) and PASSWORD not in backend.url
        assert backend.batch_lookup([b"k" * 16]) == [] and backend.healthy   # the real password still works
    with pytest.raises(ValueError) as err:
        open_backend(f"ftp://user:{PASSWORD}@host:1")
    assert PASSWORD not in str(err.value)


@pytest.mark.parametrize("url", [f"ftp://user:{PASSWORD}@h:21", f"redis://user:{PASSWORD}@"])
def test_bad_remote_url_error_hides_the_password(tmp_path, url):
    result = run_cli("serve", "--socket", str(tmp_path / "s.sock"), "--remote", url)
    assert result.returncode == 2 and "--remote" in result.stderr and PASSWORD not in result.stderr
