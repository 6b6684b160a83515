"""A fleet's worth at once: fifty creates through the whole control plane, then the control plane's
answers and the desktops' memory with all of them running.

    .venv/bin/python bench/fleet.py [--burst 50] [--workers 4] [--idle-wait 20]

Starts its own daphne and Celery worker pool (`bench/stack.py`, the business tier: 50 running at
most) and sends N `POST /api/desktops` (minimal profile) at once. Each must reach `running` or be
refused with a clear quota or capacity error; the bench counts the creates lost (neither, after
three minutes), names held twice and addresses leased twice. With the burst running and idle, it
times `GET /api/desktops` (target p95 <= 200 ms) and reads the memory of a few desktops (target
<= 200 MiB each): the machine runs at least that many desktops. Destroys everything it made.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from requests.adapters import HTTPAdapter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.provision import Bench
from bench.provision_driver import memory_of
from bench.report import Figure, record
from bench.stack import control_plane
from bench.stats import percentile, summary

GIVE_UP = 180  # seconds after which a create that is neither running nor refused counts as lost
# Each create polls the API as a client would (its 5xx answers are counted), this often.
POLL = 0.5
SERVER_ERRORS: list[int] = []  # 5xx answers to the burst's polling


def create(bench: Bench, name: str) -> tuple[str, float | str]:
    """(name, seconds to running) or (name, why it was refused or lost)."""
    start = time.perf_counter()
    response = bench.http.post(f"{bench.base}/api/desktops", json={"name": name, "imageProfile": "minimal"})
    if response.status_code != 201:
        return name, f"refused {response.status_code}: {response.json()['error']['message']}"
    desktop_id = response.json()["id"]
    bench.made.append(desktop_id)
    while time.perf_counter() - start < GIVE_UP:
        response = bench.http.get(f"{bench.base}/api/desktops/{desktop_id}")
        if response.status_code >= 500:
            SERVER_ERRORS.append(response.status_code)  # counted and reported; the create goes on
            time.sleep(POLL)
            continue
        desktop = response.json()
        if desktop["state"] == "running":
            return name, time.perf_counter() - start
        if desktop["state"] == "error":
            return name, f"error: {desktop['lastError']}"
        time.sleep(POLL)
    return name, "lost"


def listed(bench: Bench) -> list[dict]:
    desktops, url = [], f"{bench.base}/api/desktops?pageSize=100"
    while url:
        page = bench.http.get(url).json()
        desktops += page["results"]
        url = page["next"]
    return desktops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4, help="lifecycle worker processes")
    parser.add_argument("--idle-wait", type=float, default=20, help="seconds to let the fleet settle")
    args = parser.parse_args()
    with control_plane("fleet", concurrency=args.workers) as stack:
        bench = Bench(stack)
        bench.http.mount("http://", HTTPAdapter(pool_maxsize=args.burst))  # one connection per create
        try:
            wall = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.burst) as pool:
                outcomes = dict(pool.map(lambda i: create(bench, f"fleet-{i:03d}"), range(args.burst)))
            wall = time.perf_counter() - wall
            fleet = listed(bench)
            time.sleep(args.idle_wait)
            api = []
            for _ in range(50):
                start = time.perf_counter()
                bench.http.get(f"{stack.base}/api/desktops?pageSize=100").raise_for_status()
                api.append((time.perf_counter() - start) * 1000)
            running = [d for d in fleet if d["state"] == "running"]
            memory = [
                next(v for k, v in memory_of(d["id"]).items() if k.startswith("sum of PSS"))
                for d in running[:: max(1, len(running) // 5)]
            ]
        finally:
            bench.destroy_all()
    report(args, outcomes, wall, fleet, running, api, memory)


def report(args, outcomes, wall, fleet, running, api, memory) -> None:
    times = [v for v in outcomes.values() if isinstance(v, float)]
    refused = {n: v for n, v in outcomes.items() if isinstance(v, str) and v.startswith("refused")}
    failed = {n: v for n, v in outcomes.items() if isinstance(v, str) and not v.startswith("refused")}
    lost = [n for n, v in outcomes.items() if v == "lost"]
    names = Counter(d["name"] for d in fleet if d["state"] != "destroyed")
    addresses = Counter(d["privateIp"] for d in running)
    held_twice = [n for n, count in names.items() if count > 1]
    leased_twice = [ip for ip, count in addresses.items() if count > 1]
    print()
    print(f"{args.burst} creates at once ({args.workers} lifecycle workers), minimal profile, over HTTP")
    if times:
        print(summary("create -> running (each)", times))
    print(f"{'':<28} all answered after {wall:.1f} s: {len(times)} running, ", end="")
    print(f"{len(refused)} refused, {len(failed)} failed")
    for name, why in {**refused, **failed}.items():
        print(f"  {name}: {why}")
    print(f"lost {len(lost)}, names held twice {len(held_twice)}, addresses leased twice {len(leased_twice)}")
    print(f"server errors (5xx) answering the burst's polling: {len(SERVER_ERRORS)}")
    print(summary(f"GET /api/desktops, {len(running)} running", api, "ms"))
    print(f"idle desktop memory (PSS), {len(memory)} sampled: max {max(memory):.1f} MiB")
    record(
        Figure(
            f"{args.burst} creates at once: running",
            len(times),
            "desktops",
            args.burst,
            higher_is_better=True,
        ),
        Figure(f"{args.burst} creates at once: slowest to running", max(times), "s"),
        Figure(
            f"{args.burst} creates at once: lost, held twice or leased twice",
            len(lost) + len(held_twice) + len(leased_twice),
            "",
            0,
        ),
        Figure(f"{args.burst} creates at once: server errors answering them", len(SERVER_ERRORS), "", 0),
        Figure(f"API list p95 with {len(running)} desktops running", percentile(api, 0.95), "ms", 200),
        Figure(f"idle desktop memory with {len(running)} running (max PSS)", max(memory), "MiB", 200),
    )


if __name__ == "__main__":
    main()
