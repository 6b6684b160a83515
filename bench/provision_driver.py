"""Driver-level provisioning benchmark of the LXC driver (no API, no database, no Celery).

    sudo .venv/bin/python bench/provision_driver.py [--sequential 20] [--concurrent 10] [--idle-wait 20]

Times ``LxcDriver.provision`` from the call to its return, which is when sshd (22) and the VNC
server (5900) of the desktop both answer: N one after the other, then M at once. Then measures the
memory of one idle desktop. Uses its own bridge, subnet, firewall table and state directories, and
destroys everything it made.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import Figure, record
from bench.stats import summary
from workers.drivers.base import InstanceSpec
from workers.drivers.lxc import LxcConfig, LxcDriver, network

ROOT = Path("/var/lib/lebureau/bench")
SUBNET = "10.216.0.0/24"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOv0Q0bVGbL7nJc3lYQ0T6SaoJ1NGQ3z0Dmp7Kx8t9bE bench"


def spec(memory_mib: int) -> InstanceSpec:
    key = f"dsk_b{secrets.token_hex(5)}"
    return InstanceSpec(
        key=key, hostname=key, vcpus=1, memory_mib=memory_mib, disk_gib=4, ssh_public_key=SSH_KEY
    )


def timed_provision(driver: LxcDriver, s: InstanceSpec) -> float:
    start = time.perf_counter()
    driver.provision(s)
    return time.perf_counter() - start


def memory_of(key: str) -> dict[str, float]:
    """The idle desktop's memory from its cgroup (v1 or v2) and the PSS of its processes, in MiB."""
    mib = 1024 * 1024
    v1 = Path(f"/sys/fs/cgroup/memory/lxc.payload.{key}")
    v2 = Path(f"/sys/fs/cgroup/lxc.payload.{key}")
    figures: dict[str, float] = {}
    if v1.exists():
        stat = dict(line.split() for line in (v1 / "memory.stat").read_text().splitlines())
        figures["cgroup usage (incl. page cache)"] = int((v1 / "memory.usage_in_bytes").read_text()) / mib
        figures["cgroup rss (anon)"] = int(stat["total_rss"]) / mib
        figures["cgroup page cache"] = int(stat["total_cache"]) / mib
        group = v1
    else:
        stat = dict(line.split() for line in (v2 / "memory.stat").read_text().splitlines())
        figures["cgroup usage (incl. page cache)"] = int((v2 / "memory.current").read_text()) / mib
        figures["cgroup anon"] = int(stat["anon"]) / mib
        figures["cgroup page cache"] = int(stat["file"]) / mib
        group = v2
    pss = rss = 0
    # systemd in the guest moves its processes into child cgroups.
    pids = [pid for procs in group.rglob("cgroup.procs") for pid in procs.read_text().split()]
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        values = {line.split(":")[0]: int(line.split()[1]) for line in rollup[1:]}
        pss += values.get("Pss", 0)
        rss += values.get("Rss", 0)
    figures[f"sum of PSS over {len(pids)} processes"] = pss / 1024
    figures["sum of RSS (shared pages counted per process)"] = rss / 1024
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=20)
    parser.add_argument("--concurrent", type=int, default=10)
    parser.add_argument("--memory-mib", type=int, default=2048)
    parser.add_argument("--idle-wait", type=float, default=20, help="seconds to let a desktop settle")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the LXC driver mounts disks and starts containers")

    driver = LxcDriver(
        LxcConfig(
            state_dir=ROOT / "desktops",
            lxc_path=ROOT / "lxc",
            lock_dir=ROOT / "locks",
            bridge="lbbench0",
            subnet=SUBNET,
            nft_table="lebureau_bench",
            veth_prefix="lbb",
        )
    )
    made: list[str] = []
    try:
        image = Path("/var/lib/lebureau/images/minimal/current").resolve()
        print(f"host: {os.cpu_count()} cores; image: {image}")
        sequential = []
        for i in range(args.sequential):
            s = spec(args.memory_mib)
            made.append(s.key)
            sequential.append(timed_provision(driver, s))
            print(f"  sequential {i + 1}/{args.sequential}: {sequential[-1]:.3f} s", flush=True)
        for key in made:
            driver.destroy(key)
        made.clear()

        specs = [spec(args.memory_mib) for _ in range(args.concurrent)]
        made.extend(s.key for s in specs)
        wall = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.concurrent) as pool:
            concurrent = list(pool.map(lambda s: timed_provision(driver, s), specs))
        wall = time.perf_counter() - wall
        for key in made:
            driver.destroy(key)
        made.clear()

        idle = spec(args.memory_mib)
        made.append(idle.key)
        driver.provision(idle)
        time.sleep(args.idle_wait)
        memory = memory_of(idle.key)

        print()
        print("provision -> sshd and VNC answering (LxcDriver.provision wall time)")
        if sequential:
            print(summary("sequential", sequential))
        if concurrent:
            print(summary(f"{args.concurrent} concurrent (each)", concurrent))
            print(f"{'':<28} all {args.concurrent} running after {wall:.3f} s")
        print(f"idle desktop after {args.idle_wait:.0f} s (minimal profile, Xvnc + openbox + xterm + sshd):")
        for name, value in memory.items():
            print(f"  {name:<48} {value:8.1f} MiB")
        # The engine alone: reference figures under the API's, which carry the targets.
        record(
            Figure("LXC engine provision, sequential, median", statistics.median(sequential), "s"),
            Figure(f"LXC engine provision, {args.concurrent} at once, slowest", max(concurrent), "s"),
        )
    finally:
        for key in made:
            driver.destroy(key)
        # The bench's bridge and firewall go with it; the driver makes them again when needed.
        network.remove_tables("lebureau_bench")
        subprocess.run(["ip", "link", "del", "lbbench0"], capture_output=True)


if __name__ == "__main__":
    main()
