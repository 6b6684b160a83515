"""One desktop's LXC container: its configuration (id map, caps, veth) and the ``lxc-*`` tools."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import time
from pathlib import Path

from workers.drivers.base import (
    DriverError,
    InstanceSpec,
    InstanceState,
    TransientDriverError,
    guest_hostname,
)
from workers.drivers.lxc import cgroups
from workers.drivers.lxc.config import LxcConfig
from workers.drivers.lxc.network import gateway_of, run

MARKER = "# managed-by: lebureau"
# What each port must answer first for the desktop to count as usable.
BANNERS = {22: b"SSH-", 5900: b"RFB "}
LXC_STATES = {
    "RUNNING": InstanceState.RUNNING,
    "STARTING": InstanceState.RUNNING,
    "THAWED": InstanceState.RUNNING,
    "FROZEN": InstanceState.SUSPENDED,
    "FREEZING": InstanceState.SUSPENDED,
}


def render_config(config: LxcConfig, spec: InstanceSpec, meta: dict, rootfs: Path) -> str:
    v2 = cgroups.unified()
    memory = spec.memory_mib * 1024 * 1024
    quota, period = spec.vcpus * 100_000, 100_000
    if v2:
        caps = [
            f"lxc.cgroup2.memory.max = {memory}",
            f"lxc.cgroup2.cpu.max = {quota} {period}",
            f"lxc.cgroup2.cpu.weight = {config.cpu_weight}",
            "lxc.cgroup2.pids.max = 4096",
        ]
    else:
        caps = [
            f"lxc.cgroup.memory.limit_in_bytes = {memory}",
            f"lxc.cgroup.cpu.cfs_period_us = {period}",
            f"lxc.cgroup.cpu.cfs_quota_us = {quota}",
            # v1's shares count 1024 where v2's weight counts 100.
            f"lxc.cgroup.cpu.shares = {config.cpu_weight * 1024 // 100}",
            "lxc.cgroup.pids.max = 4096",
        ]
    prefix = ipaddress.ip_network(config.subnet).prefixlen
    lines = [
        MARKER,
        f"lxc.uts.name = {guest_hostname(spec.hostname)}",
        f"lxc.rootfs.path = dir:{rootfs}",
        "lxc.include = /usr/share/lxc/config/common.conf",
        "lxc.include = /usr/share/lxc/config/userns.conf",
        f"lxc.idmap = u 0 {config.id_base} {config.id_count}",
        f"lxc.idmap = g 0 {config.id_base} {config.id_count}",
        "lxc.net.0.type = veth",
        f"lxc.net.0.link = {config.bridge}",
        "lxc.net.0.flags = up",
        "lxc.net.0.name = eth0",
        f"lxc.net.0.veth.pair = {meta['veth']}",
        f"lxc.net.0.hwaddr = {meta['hwaddr']}",
        f"lxc.net.0.ipv4.address = {meta['ip']}/{prefix}",
        f"lxc.net.0.ipv4.gateway = {gateway_of(config.subnet)}",
        # systemd shuts down cleanly on SIGRTMIN+3; LXC's default SIGPWR does nothing to it.
        "lxc.signal.halt = SIGRTMIN+3",
        "lxc.tty.max = 0",
        *caps,
        "",
    ]
    return "\n".join(lines)


def write_config(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)


def is_ours(config_path: Path) -> bool:
    return config_path.read_text().startswith(MARKER)


class Lxc:
    """The ``lxc-*`` tools on the engine's own container path."""

    def __init__(self, lxc_path: Path, stop_timeout: int):
        self.lxc_path, self.stop_timeout = lxc_path, stop_timeout

    def tool(self, command: str, key: str, *args: str) -> subprocess.CompletedProcess:
        result = run([command, "-n", key, "-P", str(self.lxc_path), *args])
        if result.returncode != 0:
            raise DriverError(
                f"{command} failed for desktop {key}: {result.stderr.strip() or result.stdout.strip()}"
            )
        return result

    def state(self, key: str) -> InstanceState:
        state = self.tool("lxc-info", key, "-s", "-H").stdout.strip()
        return LXC_STATES.get(state, InstanceState.STOPPED)

    def start(self, key: str, log: Path) -> None:
        log.unlink(missing_ok=True)
        result = run(["lxc-start", "-n", key, "-P", str(self.lxc_path), "-d", "-o", str(log), "-l", "WARN"])
        if result.returncode != 0:
            detail = log.read_text()[-1500:] if log.exists() else result.stderr
            raise DriverError(f"desktop {key} failed to start: {detail.strip()}")

    def stop(self, key: str, force: bool) -> None:
        state = self.state(key)
        if state == InstanceState.STOPPED:
            return
        if state == InstanceState.SUSPENDED:
            # A frozen init cannot handle the halt signal.
            self.tool("lxc-unfreeze", key)
        self.tool("lxc-stop", key, *(["-k"] if force else ["-t", str(self.stop_timeout)]))

    def thaw_or_start(self, key: str, log: Path) -> bool:
        """Bring the container up from frozen or stopped; True if it had to boot."""
        state = self.state(key)
        if state == InstanceState.SUSPENDED:
            self.tool("lxc-unfreeze", key)
        elif state == InstanceState.STOPPED:
            self.start(key, log)
            return True
        return False


def wait_ready(key: str, ip: str, config: LxcConfig) -> None:
    """Until each of the ready ports answers with its banner, or a transient error."""
    # The address may have belonged to a destroyed desktop with another MAC: without this the
    # host keeps sending to the old MAC until its neighbour entry goes stale (about 30 s).
    run(["ip", "neigh", "flush", "to", ip, "dev", config.bridge])
    deadline = time.monotonic() + config.ready_timeout
    pending = list(config.ready_ports)
    while pending:
        if _answers(ip, pending[0]):
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            raise TransientDriverError(
                f"desktop {key} started but {ip}:{pending[0]} did not answer "
                f"within {config.ready_timeout:.0f} s"
            )
        time.sleep(0.05)


def _answers(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5) as conn:
            conn.settimeout(2)
            return conn.recv(16).startswith(BANNERS.get(port, b""))
    except OSError:
        return False
