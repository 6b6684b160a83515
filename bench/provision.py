"""Provisioning through the whole control plane: API call -> Celery worker -> LXC -> running.

    .venv/bin/python bench/provision.py [--sequential 20] [--concurrent 10] [--idle-wait 20]

Starts its own daphne and Celery worker (on the development database, `make setup`), with an LXC
network of its own, and times each `POST /api/desktops` (minimal profile) over HTTP until the API
reports `running` and the desktop's VNC server answers: N one after the other, then M at once.
Then prints the memory of one idle desktop. Destroys everything it made.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lebureau.settings")

import django  # noqa: E402

django.setup()

import requests  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402

from bench.provision_driver import memory_of  # noqa: E402
from bench.stats import summary  # noqa: E402
from desktops import services  # noqa: E402
from desktops.audit import Actor  # noqa: E402
from lebureau.celery import app as celery_app  # noqa: E402
from tests.support.services import free_port, port_open, service_process  # noqa: E402

BENCH_LXC = {
    "COMPUTE_DRIVER": "lxc",
    "LXC_STATE_DIR": "/var/lib/lebureau/bench-api/desktops",
    "LXC_PATH": "/var/lib/lebureau/bench-api/lxc",
    "LXC_BRIDGE": "lbbench1",
    "LXC_SUBNET": "10.217.0.0/24",
    "LXC_NFT_TABLE": "lebureau_bench_api",
    "LXC_VETH_PREFIX": "lbp",
}
BROKER = "redis://127.0.0.1:6379/13"


def vnc_answers(ip: str) -> bool:
    try:
        with socket.create_connection((ip, 5900), timeout=1) as conn:
            return conn.recv(4) == b"RFB "
    except OSError:
        return False


class Bench:
    def __init__(self, base: str, key: str):
        self.base = base
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {key}"
        self.made: list[str] = []

    def create(self, name: str) -> float:
        """Seconds from the API call to running with VNC answering."""
        start = time.perf_counter()
        response = self.http.post(f"{self.base}/api/desktops", json={"name": name, "imageProfile": "minimal"})
        response.raise_for_status()
        desktop_id = response.json()["id"]
        self.made.append(desktop_id)
        while True:
            desktop = self.http.get(f"{self.base}/api/desktops/{desktop_id}").json()
            if desktop["state"] == "error":
                raise RuntimeError(f"{name}: {desktop['lastError']}")
            if desktop["state"] == "running" and vnc_answers(desktop["privateIp"]):
                return time.perf_counter() - start
            time.sleep(0.1)  # polling harder would load the 2 cores the desktops boot on

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=20)
    parser.add_argument("--concurrent", type=int, default=10)
    parser.add_argument("--idle-wait", type=float, default=20, help="seconds to let a desktop settle")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the LXC engine mounts disks and starts containers")

    clear_leftovers()
    run = uuid.uuid4().hex[:8]
    queue = f"bench-{run}"
    user = get_user_model().objects.create_user(f"bench-{run}", f"bench-{run}@example.com", None)
    workspace = services.workspace_create(user=user, name="provisioning bench")
    actor = Actor(user=user)
    _, key = services.api_key_create(actor=actor, workspace_id=workspace.id, name="bench", scope="write")
    logs = Path(tempfile.mkdtemp(prefix="bench-provision-"))
    port = free_port()
    env = {**os.environ, **BENCH_LXC, "CELERY_BROKER_URL": BROKER, "CELERY_QUEUE": queue}
    celery_app.conf.broker_url = BROKER
    worker = [sys.executable, "-m", "celery", "-A", "lebureau", "worker", "-Q", queue, "-l", "INFO"]
    web = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "lebureau.asgi:application"]
    bench = Bench(f"http://127.0.0.1:{port}", key)
    try:
        with (
            service_process("worker", [*worker, "-c", str(args.concurrent)], env, logs, worker_answers),
            service_process("daphne", web, env, logs, lambda: port_open(port)),
        ):
            try:
                figures = measure(bench, args)
            finally:
                bench.destroy_all()
    finally:
        workspace.delete()
        user.delete()
        for family in ("inet", "bridge"):
            subprocess.run(
                ["nft", "delete", "table", family, BENCH_LXC["LXC_NFT_TABLE"]], capture_output=True
            )
        subprocess.run(["ip", "link", "del", BENCH_LXC["LXC_BRIDGE"]], capture_output=True)
    report(args, *figures)


def clear_leftovers() -> None:
    """Desktops an interrupted earlier run left on the bench's engine would skew its figures."""
    from django.test import override_settings

    from workers.drivers.lxc import LxcDriver

    with override_settings(**{k: v for k, v in BENCH_LXC.items() if k.startswith("LXC_")}):
        driver = LxcDriver.from_settings()
        for key in {i.key for i in driver.list_instances()} | {
            p.parent.name for p in driver.state_dir.glob("*/meta.json")
        }:
            driver.destroy(key)


def worker_answers() -> bool:
    return bool(celery_app.control.ping(timeout=0.5))


def measure(bench: Bench, args) -> tuple[list[float], list[float], float, dict[str, float]]:
    sequential = []
    for i in range(args.sequential):
        sequential.append(bench.create(f"seq-{i}"))
        print(f"  sequential {i + 1}/{args.sequential}: {sequential[-1]:.3f} s", flush=True)
    bench.destroy_all()

    wall = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.concurrent) as pool:
        concurrent = list(pool.map(bench.create, [f"conc-{i}" for i in range(args.concurrent)]))
    wall = time.perf_counter() - wall
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


if __name__ == "__main__":
    main()
