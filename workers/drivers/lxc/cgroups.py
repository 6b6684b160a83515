"""Host cgroups by name, v1 or v2: what a desktop's container uses, and the limits of what the engine runs
on a desktop's behalf outside its container (its resolver), so that the host's share of each is bounded."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    cpu_fraction: float  # of one core
    pids: int


def unified() -> bool:
    return (ROOT / "cgroup.controllers").exists()


def _dirs(group: str) -> list[Path]:
    if unified():
        return [ROOT / group]
    return [ROOT / controller / group for controller in ("memory", "cpu", "cpuacct", "pids")]


def create(group: str, limits: Limits) -> None:
    """The group with these limits (made, or its limits written again)."""
    quota = max(1000, int(limits.cpu_fraction * PERIOD_US))
    if unified():
        # Children get the controllers only where the parent hands them down (LXC needs the same).
        (ROOT / "cgroup.subtree_control").write_text("+memory +cpu +pids")
        files = {
            ROOT / group: {
                "memory.max": limits.memory_bytes,
                "cpu.max": f"{quota} {PERIOD_US}",
                "pids.max": limits.pids,
            }
        }
    else:
        files = {
            ROOT / "memory" / group: {"memory.limit_in_bytes": limits.memory_bytes},
            ROOT / "cpu" / group: {"cpu.cfs_period_us": PERIOD_US, "cpu.cfs_quota_us": quota},
            ROOT / "cpuacct" / group: {},
            ROOT / "pids" / group: {"pids.max": limits.pids},
        }
    for directory, values in files.items():
        directory.mkdir(exist_ok=True)
        for name, value in values.items():
            (directory / name).write_text(str(value))


def add(group: str, pid: int) -> None:
    """Move a process into the group; what it forks from then on stays in it."""
    for directory in _dirs(group):
        (directory / "cgroup.procs").write_text(str(pid))


def remove(group: str) -> None:
    """Remove the group once nothing runs in it (a group still in use stays, for the next remove)."""
    for directory in _dirs(group):
        with contextlib.suppress(FileNotFoundError, OSError):
            directory.rmdir()


def usage(group: str) -> tuple[int, float] | None:
    """Memory in use (bytes) and CPU time (seconds) of what runs in the group, or None if it is gone."""
    try:
        if unified():
            stat = dict(line.split() for line in (ROOT / group / "cpu.stat").read_text().splitlines())
            return int((ROOT / group / "memory.current").read_text()), int(stat["usage_usec"]) / 1e6
        memory = int((ROOT / "memory" / group / "memory.usage_in_bytes").read_text())
        return memory, int((ROOT / "cpuacct" / group / "cpuacct.usage").read_text()) / 1e9
    except (OSError, KeyError, ValueError):
        return None  # stopped, or gone between the check and the read
