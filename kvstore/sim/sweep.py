"""Hit rate against capacity: replay a trace at a range of host tier sizes and draw the curve as a PNG.

Each point is one full replay (``replay.py``) with a host tier of ``fraction × distinct blocks`` chunks and no
disk tier, so the x axis is simply "how much cache", wherever it lives; the operator's own configuration is drawn
as one marker at its host + disk total, and the unbounded hit rate as the ceiling the curve climbs towards.
Points are independent, so they run in parallel processes (one per core). matplotlib is imported only here
(the ``sim`` extra), with the non-interactive Agg backend.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from dataclasses import dataclass
from typing import Sequence

from .replay import Capacity, ReplayResult, replay
from .trace import Request

FRACTIONS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class SweepPoint:
    policy: str
    fraction: float        # of the trace's distinct blocks
    capacity_bytes: int
    hit_rate: float


_requests: Sequence[Request] = ()


def _init(requests: Sequence[Request]) -> None:
    global _requests
    _requests = requests


def _one(policy: str, fraction: float, blocks: int, chunk_bytes: int, block_tokens: int) -> SweepPoint:
    host = max(1, int(blocks * fraction)) * chunk_bytes
    result: ReplayResult = replay(_requests, Capacity(host, 0, chunk_bytes), policy, block_tokens)
    return SweepPoint(policy, fraction, host, result.hit_rate())


def sweep(requests: Sequence[Request], chunk_bytes: int, policies: Sequence[str], blocks: int,
          fractions: Sequence[float] = FRACTIONS, block_tokens: int = 512,
          workers: int | None = None) -> list[SweepPoint]:
    """One point per (policy, fraction), ordered as given."""
    jobs = [(p, f) for p in policies for f in fractions]
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        _init(requests)
        return [_one(p, f, blocks, chunk_bytes, block_tokens) for p, f in jobs]
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init,
                                                initargs=(requests,)) as pool:
        futures = [pool.submit(_one, p, f, blocks, chunk_bytes, block_tokens) for p, f in jobs]
        return [f.result() for f in futures]


def plot(points: Sequence[SweepPoint], ceiling: float, path: str, configured: tuple[int, float] | None = None,
         title: str = "") -> None:
    """Write the hit-rate curve(s) to ``path`` (PNG); ``configured`` is (bytes, hit rate) of the asked tiers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib = float(1 << 30)
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for policy in dict.fromkeys(p.policy for p in points):
        mine = [p for p in points if p.policy == policy]
        ax.plot([p.capacity_bytes / gib for p in mine], [100 * p.hit_rate for p in mine], marker="o", ms=3,
                label=policy)
    ax.axhline(100 * ceiling, color="grey", linestyle="--", label=f"unbounded ({100 * ceiling:.1f} %)")
    if configured is not None:
        ax.plot([configured[0] / gib], [100 * configured[1]], marker="*", ms=12, color="black", linestyle="none",
                label=f"host + disk asked ({100 * configured[1]:.1f} %)")
    ax.set_xscale("log")
    ax.set_xlabel("cache capacity (GiB, log scale)")
    ax.set_ylabel("token hit rate (%)")
    ax.set_ylim(0, max(5.0, 100 * ceiling * 1.1))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
