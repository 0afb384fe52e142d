"""Rolling restarts in the simulator (``kvstore/sim/restarts.py``): what an upgrade costs with and without warm
restart, on synthetic traces with known answers and through the CLI."""

from __future__ import annotations

import json

import pytest

from kvstore.errors import ConfigError
from kvstore.sim.replay import Capacity
from kvstore.sim.restarts import RollingPlan, check_plan, replay_rolling, upgrade_cost
from kvstore.sim.trace import Request

from harness import daemons

CHUNK = 1 << 20
ROOMY = Capacity(1 << 30, 0, CHUNK)


def same_prompt(times: int) -> list[Request]:
    return [Request(0, 512 * 4, 0, (1, 2, 3, 4)) for _ in range(times)]


def test_a_cold_restart_of_the_only_daemon_loses_its_dram_and_a_warm_one_does_not():
    trace = same_prompt(10)
    plan = RollingPlan(fleet=1, every=5)
    none, cold, warm = (replay_rolling(trace, ROOMY, plan, m) for m in ("none", "cold", "warm"))
    assert none.hit_tokens == warm.hit_tokens == 9 * 2048   # only the very first request misses
    assert cold.restarts == 1 and cold.hit_tokens == 8 * 2048   # and the first one after the restart
    cost = upgrade_cost(trace, ROOMY, plan)
    assert cost["warm"]["cost"] == 0 and cost["cold"]["cost"] == pytest.approx(0.1)


def test_a_cold_restart_keeps_what_the_disk_tier_holds():
    trace = same_prompt(10)
    with_disk = Capacity(1 << 30, 1 << 30, CHUNK)
    cold = replay_rolling(trace, with_disk, RollingPlan(1, 5), "cold")
    assert cold.hit_tokens == 9 * 2048   # served from disk after the restart


def test_a_rolling_upgrade_restarts_each_daemon_of_the_fleet_once():
    plan = RollingPlan(fleet=3, every=4)
    turns = [plan.restart_at(i, 40) for i in range(40)]
    assert [t for t in turns if t is not None] == [0, 1, 2]
    assert plan.window(40) == (4, 16)


def test_plans_that_cannot_be_simulated_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="not modelled with a GPU tier"):
        check_plan(2, 10, 100, gpu_bytes=1 << 30)
    with pytest.raises(ConfigError, match="is not less than the 100 replayed"):
        check_plan(2, 100, 100, gpu_bytes=0)


def test_the_cli_reports_the_cost_of_an_upgrade(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 0, "input_length": 1024, "hash_ids": [i % 7, 100 + i % 7]})
                             + "\n" for i in range(60)))
    out = daemons.run_cli("simulate", str(trace), "--host-mem", "1GiB", "--chunk-bytes", "1MiB",
                          "--restart-every", "10", "--fleet", "2", "--json", timeout=120)
    assert out.returncode == 0, out.stderr
    rolling = json.loads(out.stdout)["rolling_restarts"]
    assert rolling["restarts"] == 2 and rolling["warm"]["cost"] == 0 and rolling["cold"]["cost"] > 0
    table = daemons.run_cli("simulate", str(trace), "--host-mem", "1GiB", "--chunk-bytes", "1MiB",
                            "--restart-every", "10", timeout=120)
    assert "warm restarts" in table.stdout and "cold restarts" in table.stdout
    bad = daemons.run_cli("simulate", str(trace), "--host-mem", "1GiB", "--chunk-bytes", "1MiB", "--fleet", "2")
    assert bad.returncode != 0 and "--fleet sizes the fleet of --restart-every" in bad.stderr
