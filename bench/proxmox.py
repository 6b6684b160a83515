"""Time to running of the Proxmox driver against the PVE simulator at AgentLab's median task times.

    .venv/bin/python bench/proxmox.py [--concurrent 20] [--cold 3]

No Proxmox exists here: the simulator (tests/pve/, needs ../shared/proxmox-api-schema/) plays a
three-node cluster whose clone takes 2.5 s, start 10 s, guest agent 3 s and cloud-init 6 s after
start. The SSH step is simulated by waiting until the VM's cloud-init would have finished (that is
when sshd would accept the control plane's key); its time is reported apart from the control plane's.

Prints: a cold create; a claim from the warm pool (booted members); 20 creates at once.
Targets: a warm claim within 1 s of control-plane time on top of the SSH step; 20 concurrent
creates within 2x a single one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.database import django_setup
from bench.report import Figure, record

# The simulator's console speaks RFB with the relays' code, which reads the project's settings.
django_setup()

from tests.pve.simulator import Simulator, TaskTimes  # noqa: E402
from tests.pve.support import SSH_KEY, TEMPLATE, driver_for, make_spec  # noqa: E402
from workers.drivers.proxmox import PoolShape  # noqa: E402
from workers.drivers.proxmox.api import vm_name  # noqa: E402

NODES = {"pve1": (262144, 64), "pve2": (262144, 64), "pve3": (262144, 64)}
SHAPE = PoolShape("minimal", 1, 1024, 10, size=1)


class SimulatedSsh:
    """The SSH step: wait for the guest's cloud-init to finish, as ``cloud-init status --wait`` would."""

    def __init__(self, sim: Simulator):
        self.sim = sim
        self.seconds: dict[str, float] = {}
        self.lock = threading.Lock()

    def __call__(self, spec, ip: str) -> None:
        began = time.monotonic()
        done_at = self.sim.cloudinit_done_at(self.sim.vm_by_name(vm_name(spec.key)).vmid)
        time.sleep(max(0.0, done_at - time.time()))
        with self.lock:
            self.seconds[spec.key] = time.monotonic() - began


def timed(driver, ssh: SimulatedSsh, spec) -> tuple[float, float]:
    """Seconds to running, and the part of them the control plane spent (without the SSH step)."""
    began = time.monotonic()
    driver.provision(spec)
    total = time.monotonic() - began
    return total, total - ssh.seconds[spec.key]


def line(name: str, runs: list[tuple[float, float]]) -> str:
    totals, control = [r[0] for r in runs], [r[1] for r in runs]
    return (
        f"{name:<30} n={len(runs):<3} to running: median {statistics.median(totals):6.2f} s "
        f"max {max(totals):6.2f} s | without the SSH step: median {statistics.median(control):6.3f} s "
        f"max {max(control):6.3f} s"
    )


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cold", type=int, default=3, help="cold creates one after the other")
    parser.add_argument("--concurrent", type=int, default=20, help="creates at once")
    args = parser.parse_args()

    sim = Simulator(NODES, times=TaskTimes.agentlab()).start()
    sim.add_template(TEMPLATE, "pve1")
    ssh = SimulatedSsh(sim)
    driver = driver_for(sim, guest_setup=ssh, poll_interval=0.5, agent_timeout=120, task_timeout=120)
    times = TaskTimes.agentlab()
    print(
        f"simulated task times: clone {times.clone} s, start {times.start} s, "
        f"agent {times.agent} s and cloud-init {times.cloudinit} s after start; driver polls every 0.5 s"
    )
    try:
        cold = [timed(driver, ssh, make_spec()) for _ in range(args.cold)]
        print(line("cold create", cold))

        pooled = driver_for(sim, guest_setup=ssh, poll_interval=0.5, warm_pool=(SHAPE,), task_timeout=120)
        began = time.monotonic()
        made = pooled.refill_pool()
        print(
            f"{'warm pool refill':<30} {made[SHAPE.tag]} booted members in {time.monotonic() - began:.2f} s"
        )
        warm = [timed(pooled, ssh, make_spec(ssh_public_key=SSH_KEY)) for _ in range(3)]
        print(line("warm pool claim", warm))

        began = time.monotonic()
        with ThreadPoolExecutor(args.concurrent) as pool:
            burst = list(
                pool.map(lambda s: timed(driver, ssh, s), [make_spec() for _ in range(args.concurrent)])
            )
        wall = time.monotonic() - began
        print(line(f"{args.concurrent} concurrent creates", burst))
        desktops = [vm for vm in sim.vms.values() if "lebureau;" in vm.config.get("tags", "")]
        spread = {node: sum(vm.node == node for vm in desktops) for node in NODES}
        single = statistics.median(r[0] for r in cold)
        print(f"{'':<30} all running after {wall:.2f} s, {wall / single:.2f}x a single cold create")
        print(f"{'desktops per node':<30} {spread}")
        warm_control = max(r[1] for r in warm)
        print(f"target warm claim <= 1 s + SSH step: {warm_control:.3f} s, {verdict(warm_control <= 1)}")
        print(
            f"target {args.concurrent} at once < 2x one: {wall / single:.2f}x, {verdict(wall < 2 * single)}"
        )
        record(
            Figure(
                "Proxmox (simulated) warm-pool claim, control plane's share, slowest", warm_control, "s", 1
            ),
            Figure(
                f"Proxmox (simulated) {args.concurrent} creates at once, times one", wall / single, "x", 2
            ),
        )
    finally:
        sim.stop()


if __name__ == "__main__":
    main()
