"""From measured queries/s to replicas and dollars: how many retrieval replicas a GRPO trainer of N GPUs needs.

Demand model (docs/sizing.md gives the arithmetic and its assumptions):
  queries per step   = train_batch_size x n (GRPO samples per prompt) x turns (searches per trajectory, at most)
  rollout seconds    = rollout_seconds_8gpu x 8 / gpus (data-parallel rollout: twice the GPUs, half the time)
  peak queries/s     = queries per step / rollout seconds (every search of a step falls inside its rollout)
  replicas           = ceil(peak queries/s / (queries/s per replica x headroom))
No de-duplication is assumed (GRPO's n samples repeat first-turn queries; the service's cache and in-flight
de-duplication absorb some), so the count is an upper bound for the given rollout time.

Cost per million queries = hourly on-demand price / (queries/s x 3600) x 1e6, at a dated price (PRICES).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Price:
    """An on-demand hourly price, with where it came from and when (prices change: never undated)."""

    instance: str
    vcpus: int
    usd_per_hour: float
    source: str


# From memory of the AWS EC2 on-demand price list (us-east-1, Linux); not fetched: this machine has no internet.
# c7a = AMD EPYC 9R14 (Zen 4: AVX-512, VNNI and BF16), the closest rented match to the CPU benchmarked here.
PRICES = {
    "c7a.large": Price(
        "c7a.large", 2, 0.1026, "AWS EC2 on-demand us-east-1, as remembered for 2025 (approximate)"
    ),
    "c7a.4xlarge": Price(
        "c7a.4xlarge", 16, 0.8211, "AWS EC2 on-demand us-east-1, as remembered for 2025 (approximate)"
    ),
}


@dataclass(frozen=True)
class TrainerLoad:
    """Search-R1's recipe (DESIGN.md section 6): batch 512, GRPO n=5, at most 4 searches per trajectory."""

    gpus: int
    train_batch_size: int = 512
    n: int = 5
    turns: int = 4
    rollout_seconds_8gpu: float = 60.0  # assumption: rollout phase of one step on 8 H100s (docs/sizing.md)

    @property
    def queries_per_step(self) -> int:
        return self.train_batch_size * self.n * self.turns

    @property
    def rollout_seconds(self) -> float:
        return self.rollout_seconds_8gpu * 8 / self.gpus

    @property
    def peak_qps(self) -> float:
        return self.queries_per_step / self.rollout_seconds


def replicas_needed(load: TrainerLoad, qps_per_replica: float, headroom: float = 0.7) -> int:
    """Replicas so that each runs at most `headroom` of its measured queries/s (latency stays bounded)."""
    if qps_per_replica <= 0:
        raise ValueError("qps_per_replica must be positive")
    return max(1, math.ceil(load.peak_qps / (qps_per_replica * headroom)))


def usd_per_million(qps: float, price: Price) -> float:
    """Dollars per million queries for one replica kept busy at `qps`."""
    return price.usd_per_hour / (qps * 3600) * 1e6


def sizing_table(
    encoders: dict[str, float],
    *,
    cores: int,
    price: Price,
    gpus: tuple[int, ...] = (8, 16, 32, 64),
    rollout_seconds_8gpu: float = 60.0,
) -> list[dict[str, Any]]:
    """One row per (encoder, trainer size): q/s per core, replicas of `price.vcpus` cores, $/1M queries.

    `encoders`: name -> measured queries/s of one replica with `cores` cores. A replica of another size is
    scaled by cores (the worker pool keeps per-core throughput flat; docs/sizing.md says how to check).
    """
    rows = []
    for name, qps in encoders.items():
        per_core = qps / cores
        replica_qps = per_core * price.vcpus
        for g in gpus:
            load = TrainerLoad(gpus=g, rollout_seconds_8gpu=rollout_seconds_8gpu)
            rows.append(
                {
                    "encoder": name,
                    "qps_per_core": round(per_core, 1),
                    "gpus": g,
                    "queries_per_step": load.queries_per_step,
                    "peak_qps": round(load.peak_qps, 1),
                    "replica": price.instance,
                    "replica_qps": round(replica_qps, 1),
                    "replicas": replicas_needed(load, replica_qps),
                    "usd_per_million": round(usd_per_million(replica_qps, price), 4),
                    "price": asdict(price),
                }
            )
    return rows


def format_sizing(rows: list[dict[str, Any]]) -> str:
    header = f"{'encoder':40} {'q/s/core':>9} {'GPUs':>5} {'peak q/s':>9}  {'replicas':18} {'$/1M q':>8}"
    lines = [header, "-" * len(header)]
    for r in rows:
        replicas = f"{r['replicas']} x {r['replica']}"
        lines.append(
            f"{r['encoder']:40} {r['qps_per_core']:9.1f} {r['gpus']:5d} {r['peak_qps']:9.0f}  {replicas:18} "
            f"{r['usd_per_million']:8.3f}"
        )
    if rows:
        p = rows[0]["price"]
        load = TrainerLoad(gpus=8)
        lines.append(
            f"price: {p['instance']} ${p['usd_per_hour']}/h ({p['source']}); load: batch {load.train_batch_size} x "
            f"n {load.n} x {load.turns} turns per step, rollout {load.rollout_seconds_8gpu:.0f} s on 8 GPUs "
            "(assumed), 70% headroom, no de-dup credit"
        )
    return "\n".join(lines)


__all__ = [
    "PRICES",
    "Price",
    "TrainerLoad",
    "format_sizing",
    "replicas_needed",
    "sizing_table",
    "usd_per_million",
]
