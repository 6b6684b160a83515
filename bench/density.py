"""Density: how many minimal desktops this machine runs with the control plane still answering in time.

    .venv/bin/python bench/density.py [--step 10] [--cap 60] [--idle-wait 15]

Starts its own control plane (`bench/stack.py`), its workspace on a tier of the bench's own whose
limits are the cap, and adds minimal desktops through the API STEP at a time. After each step, the
fleet left idle for IDLE-WAIT seconds, it times `GET /api/desktops?pageSize=100` (target p95 <= 200
ms) and reads the memory (PSS) of five of the desktops (target <= 200 MiB each, as bench/fleet.py).
It stops at the first step that misses a target or fails a create, or at the cap. The density is the
largest count that met both targets: a floor, not the limit, when the cap ended the run.
Destroys everything it made.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from requests.adapters import HTTPAdapter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fleet import create, listed
from bench.provision import Bench
from bench.provision_driver import memory_of
from bench.report import Figure, record
from bench.stack import control_plane
from bench.stats import percentile
from billing.models import Tier
from billing.services import subscription_set
from desktops.audit import Actor

API_TARGET, MEMORY_TARGET = 200, 200  # ms at p95, MiB of PSS per idle desktop


def lift_limits(stack, cap: int) -> None:
    """The business tier runs 50 at once: the bench's workspace gets a tier of its own, up to the cap."""
    tier, _ = Tier.objects.update_or_create(
        name="bench-density",
        defaults={
            "max_desktops": cap,
            "max_running": cap,
            "max_disk_gib": cap * 1000,
            "monthly_spend_cap": None,
            "is_public": False,
        },
    )
    subscription_set(actor=Actor(user=stack.user, support=True), workspace_id=stack.workspace.id, tier=tier)


def measure(bench: Bench, running: list[dict]) -> tuple[float, float]:
    """(API list p95 in ms, the largest PSS of five desktops in MiB) of the fleet as it stands."""
    api = []
    for _ in range(30):
        start = time.perf_counter()
        bench.http.get(f"{bench.base}/api/desktops?pageSize=100").raise_for_status()
        api.append((time.perf_counter() - start) * 1000)
    sampled = running[:: max(1, len(running) // 5)][:5]
    memory = [next(v for k, v in memory_of(d["id"]).items() if k.startswith("sum of PSS")) for d in sampled]
    return percentile(api, 0.95), max(memory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=int, default=10, help="desktops added at a time")
    parser.add_argument("--cap", type=int, default=60, help="the most desktops the bench starts")
    parser.add_argument("--idle-wait", type=float, default=15, help="seconds to let each step settle")
    parser.add_argument("--workers", type=int, default=4, help="lifecycle worker processes")
    args = parser.parse_args()
    steps: list[tuple[int, float, float]] = []  # (desktops running, API p95, largest PSS)
    stopped = f"the cap of {args.cap} desktops"
    with control_plane("density", concurrency=args.workers) as stack:
        lift_limits(stack, args.cap)
        bench = Bench(stack)
        bench.http.mount("http://", HTTPAdapter(pool_maxsize=args.step))
        try:
            while len(bench.made) < args.cap:
                first = len(bench.made)
                names = [f"dense-{i:03d}" for i in range(first, min(first + args.step, args.cap))]
                with ThreadPoolExecutor(max_workers=len(names)) as pool:
                    outcomes = dict(pool.map(lambda name: create(bench, name), names))
                failed = {name: why for name, why in outcomes.items() if isinstance(why, str)}
                if failed:
                    stopped = f"creates failing at {first + len(names)}: {failed}"
                    break
                time.sleep(args.idle_wait)
                running = [d for d in listed(bench) if d["state"] == "running"]
                api_p95, memory = measure(bench, running)
                steps.append((len(running), api_p95, memory))
                print(
                    f"{len(running):3d} running: API list p95 {api_p95:.1f} ms, largest PSS {memory:.1f} MiB"
                )
                if api_p95 > API_TARGET or memory > MEMORY_TARGET:
                    stopped = "a missed target"
                    break
        finally:
            bench.destroy_all()
    report(steps, stopped)


def report(steps: list[tuple[int, float, float]], stopped: str) -> None:
    within = [step for step in steps if step[1] <= API_TARGET and step[2] <= MEMORY_TARGET]
    density = within[-1][0] if within else 0
    print()
    print(f"stopped by {stopped}")
    print(
        f"density: {density} minimal desktops running with the API list p95 <= {API_TARGET} ms "
        f"and idle desktops <= {MEMORY_TARGET} MiB"
    )
    name = "density: minimal desktops running within the API and memory targets"
    record(Figure(name, density, "desktops", higher_is_better=True))
    if within:
        _, api_p95, memory = within[-1]
        record(
            Figure(f"density: API list p95 with {density} running", api_p95, "ms", API_TARGET),
            Figure(
                f"density: idle desktop memory with {density} running (max PSS)", memory, "MiB", MEMORY_TARGET
            ),
        )


if __name__ == "__main__":
    main()
