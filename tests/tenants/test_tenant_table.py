"""The tenants table: patterns, budgets and identities are read, checked and refused in one line."""

from __future__ import annotations

import pytest

from kvstore.config import build_config
from kvstore.errors import ConfigError
from kvstore.tenants import (
    DEFAULT_TENANT,
    Budget,
    check_capacities,
    load_tenants,
    parse_tenants,
)
from kvstore.tenants.table import patterns_overlap

KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"


def test_prefix_and_glob_patterns_pick_their_tenant_and_the_rest_is_shared():
    table = parse_tenants({"chat": {"namespaces": ["llama:", "chat-*"]}, "batch": {"namespaces": ["b?tch"]}})
    assert table.tenant_for("llama:salt=1").name == "chat"
    assert table.tenant_for("chat-7").name == "chat"
    assert table.tenant_for("batch").name == "batch"
    assert table.tenant_for("batches").name == DEFAULT_TENANT   # a glob matches the whole namespace
    assert table.tenant_for("other").name == DEFAULT_TENANT
    assert table.names == ("chat", "batch", DEFAULT_TENANT)


def test_sizes_are_read_with_units_and_no_table_is_todays_behaviour():
    table = parse_tenants({"a": {"namespaces": ["a"], "dram": {"guaranteed": "1GiB", "ceiling": "2GiB"},
                                 "disk": {"ceiling": 4096}, "max_pin_bytes": "64MiB",
                                 "uids": [1001], "gids": [100], "curve_keys": [KEY]}})
    a = table.tenant_for("a1")
    assert a.budget("dram") == Budget(1 << 30, 2 << 30)
    assert a.budget("disk") == Budget(0, 4096)
    assert a.budget("gpu") == Budget()
    assert a.pin_limit("dram") == 64 << 20 and a.restricted
    empty = parse_tenants(None)
    assert not empty.configured and empty.tenant_for("anything").name == DEFAULT_TENANT


@pytest.mark.parametrize("raw, message", [
    ({"a": {"namespaces": ["ab"]}, "b": {"namespaces": ["a*"]}}, "tenants.b.namespaces: 'a*' overlaps"),
    ({"a": {"namespaces": ["x-"]}, "b": {"namespaces": ["x"]}}, "overlaps"),
    ({"a": {"namespaces": ["*-a"]}, "b": {"namespaces": ["b-*"]}}, "overlaps"),
    ({"a": {"namespaces": ["x"], "dram": {"guaranteed": "2GiB", "ceiling": "1GiB"}}}, "above the ceiling"),
    ({"a": {"namespaces": ["x"], "colour": "red"}}, "tenants.a: unknown key 'colour'"),
    ({"a": {"namespaces": ["x"], "dram": {"guarantee": "1GiB"}}}, "tenants.a.dram: unknown key 'guarantee'"),
    ({"a": {"namespaces": ["x"], "dram": {"ceiling": "lots"}}}, "tenants.a.dram.ceiling: cannot read"),
    ({"a": {"namespaces": []}}, "tenants.a.namespaces: expected a non-empty list"),
    ({"a": {"namespaces": ["*"]}}, "matches every namespace"),
    ({"a": {"namespaces": ["x"], "uids": ["root"]}}, "tenants.a.uids: expected a list of numeric ids"),
    ({"a": {"namespaces": ["x"], "curve_keys": ["short"]}}, "tenants.a.curve_keys: short... is not a Z85"),
    ({"a": {"namespaces": ["x"], "uids": [7]}, "b": {"namespaces": ["y"], "uids": [7]}}, "already tenants.a's"),
    ({"default": {"namespaces": ["x"]}}, "the default tenant owns every namespace"),
    ({"bad name": {"namespaces": ["x"]}}, "a tenant name is"),
])
def test_bad_tables_are_refused_naming_file_and_key(raw, message):
    with pytest.raises(ConfigError, match=r"^f\.toml: ") as caught:
        parse_tenants(raw, "f.toml")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_disjoint_patterns_do_not_overlap():
    assert not patterns_overlap("a-", "b-")
    assert not patterns_overlap("a?c", "abd")
    assert patterns_overlap("a?c", "abc")
    assert not patterns_overlap("x*y", "x*z")


def test_guarantees_must_fit_the_tier(tmp_path):
    path = tmp_path / "kvstore.toml"
    path.write_text('host_mem = "64MiB"\n[tenants.a]\nnamespaces = ["a"]\n[tenants.a.dram]\nguaranteed = "48MiB"\n'
                    '[tenants.b]\nnamespaces = ["b"]\n[tenants.b.dram]\nguaranteed = "32MiB"\n')
    table = load_tenants(str(path))
    check_capacities(table, {"dram": 80 << 20, "remote": None})
    with pytest.raises(ConfigError, match=r"kvstore.toml: tenants: the dram guarantees add up to 80.0 MiB"):
        check_capacities(table, {"dram": 64 << 20})
    assert build_config(config_file=str(path)).host_mem == 64 << 20   # the settings reader leaves [tenants] alone


def test_engine_patterns_also_own_the_engine_neutral_namespaces():
    """Tables written for the engines' own namespaces keep their engines' canonical chunks (``kv:MODEL``)."""
    table = parse_tenants({"a": {"namespaces": ["vllm:team-a/"]}, "b": {"namespaces": ["sglang:team-b/*"]}})
    assert table.tenant_for("kv:team-a/llama").name == "a"
    assert table.tenant_for("vllm:team-a/llama").name == "a"
    assert table.tenant_for("kv:team-b/qwen;salt=s").name == "b"
    assert table.tenant_for("kv:team-c/x").name == "default"
    with pytest.raises(ConfigError, match="overlaps"):   # one model's engines split between two tenants
        parse_tenants({"a": {"namespaces": ["vllm:m"]}, "b": {"namespaces": ["sglang:m"]}})
