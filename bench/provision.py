"""Provisioning through the whole control plane: API call -> Celery worker -> LXC -> running.

    .venv/bin/python bench/provision.py [--sequential 20] [--concurrent 10] [--idle-wait 20]

Starts its own daphne and Celery worker (on the bench database, `bench/database.py`), with an LXC
network of its own, and times each `POST /api/desktops` (minimal profile) over HTTP until the
workspace's event stream reports `running` and the desktop's VNC server answers: N one after the
other, then M at once. Then prints the memory of one idle desktop. Destroys everything it made.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.events import WorkspaceEvents
from bench.provision_driver import memory_of
from bench.report import Figure, record
from bench.stack import control_plane
from bench.stats import percentile, summary
from workers.drivers.base import ProvisionStep


def vnc_answers(ip: str) -> bool:
    try:
        with socket.create_connection((ip, 5900), timeout=1) as conn:
            return conn.recv(4) == b"RFB "
    except OSError:
        return False


class Bench:
    def __init__(self, stack):
        self.base = stack.base
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {stack.key}"
        # States arrive on the page's event stream: polling the API from 10 threads would load the
        # 2 cores the desktops boot on.
        self.events = WorkspaceEvents(stack.base, stack.workspace.id, stack.user)
        self.made: list[str] = []
        self.marks: dict[str, dict[str, float]] = {}  # desktop id -> milestone -> when

    def create(self, name: str) -> float:
        """Seconds from the API call to running with VNC answering."""
        start = time.perf_counter()
        response = self.http.post(f"{self.base}/api/desktops", json={"name": name, "imageProfile": "minimal"})
        response.raise_for_status()
        desktop_id = response.json()["id"]
        self.made.append(desktop_id)
        self.marks[desktop_id] = {"POST": start, "answered": time.perf_counter()}
        self.events.wait_state(desktop_id, "running")
        while not vnc_answers(self.events.addresses[desktop_id]):
            time.sleep(0.01)
        self.marks[desktop_id]["VNC"] = time.perf_counter()
        return self.marks[desktop_id]["VNC"] - start

    def timeline(self) -> str:
        """Median seconds from the POST to each milestone, over the desktops made since the last destroy."""
        steps = self.events.steps
        marks = [
            {
                **own,
                **{step: steps[(i, step)] for step in ProvisionStep if (i, step) in steps},
                "running": self.events.states[(i, "running")],
            }
            for i, own in self.marks.items()
        ]
        order = ["answered", *ProvisionStep, "running", "VNC"]
        return " · ".join(
            f"{name} {statistics.median(m[name] - m['POST'] for m in marks if name in m):.2f}"
            for name in order
            if any(name in m for m in marks)
        )

    def destroy_all(self) -> None:
        for desktop_id in self.made:
            self.http.delete(f"{self.base}/api/desktops/{desktop_id}")
        for desktop_id in self.made:
            while self.http.get(f"{self.base}/api/desktops/{desktop_id}").json()["state"] not in (
                "destroyed",
                "error",
            ):
                time.sleep(0.1)
        self.made.clear()
        self.marks.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=20)
    parser.add_argument("--concurrent", type=int, default=10)
    parser.add_argument("--idle-wait", type=float, default=20, help="seconds to let a desktop settle")
    args = parser.parse_args()
    with control_plane("provision", concurrency=args.concurrent) as stack:
        bench = Bench(stack)
        try:
            figures = measure(bench, args)
        finally:
            bench.destroy_all()
    report(args, *figures)


def measure(bench: Bench, args) -> tuple[list[float], list[float], float, dict[str, float]]:
    sequential = []
    for i in range(args.sequential):
        sequential.append(bench.create(f"seq-{i}"))
        print(f"  sequential {i + 1}/{args.sequential}: {sequential[-1]:.3f} s", flush=True)
    print(f"  where the time goes (median s after the POST): {bench.timeline()}", flush=True)
    bench.destroy_all()

    wall = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.concurrent) as pool:
        concurrent = list(pool.map(bench.create, [f"conc-{i}" for i in range(args.concurrent)]))
    wall = time.perf_counter() - wall
    print(f"  where the time goes (median s after the POST): {bench.timeline()}", flush=True)
    bench.destroy_all()

    bench.create("idle")
    time.sleep(args.idle_wait)
    return sequential, concurrent, wall, memory_of(bench.made[0])


def report(args, sequential, concurrent, wall, memory) -> None:
    print()
    print("POST /api/desktops -> API says running and VNC answers (minimal profile, over HTTP)")
    print(summary("sequential", sequential))
    print(summary(f"{args.concurrent} concurrent (each)", concurrent))
    print(
        f"{'':<28} all {args.concurrent} running after {wall:.3f} s   (targets: median <= 1.5 s, <= 4 s each)"
    )
    print(f"idle desktop after {args.idle_wait:.0f} s (Xvnc + openbox + xterm + sshd; target <= 200 MiB):")
    for name, value in memory.items():
        print(f"  {name:<48} {value:8.1f} MiB")
    pss = next(value for name, value in memory.items() if name.startswith("sum of PSS"))
    record(
        Figure("API create -> running, sequential, median", statistics.median(sequential), "s", 1.5),
        Figure(f"API create -> running, {args.concurrent} at once, slowest", max(concurrent), "s", 4),
        Figure(
            f"API create -> running, {args.concurrent} at once, p95", percentile(concurrent, 0.95), "s", 4
        ),
        Figure("idle minimal desktop, memory (PSS)", pss, "MiB", 200),
    )


if __name__ == "__main__":
    main()
