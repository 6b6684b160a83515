"""CPU time, from /proc and the cgroups: what each part of a bench costs the machine."""

from __future__ import annotations

import os
from pathlib import Path


def _stat(pid: Path) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name (pgrp at 2, utime and stime at 11 and 12)."""
    return (pid / "stat").read_text().rsplit(")", 1)[1].split()


def group_cpu_seconds(pgid: int) -> float:
    """CPU time (user + system) of the processes of a process group: a relay and any child it forks."""
    ticks = 0
    for pid in Path("/proc").glob("[0-9]*"):
        try:
            fields = _stat(pid)
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def group_running(*words: str) -> int:
    """The process group of the process whose command line holds all of `words` (a server and its port)."""
    for pid in Path("/proc").glob("[0-9]*"):
        try:
            args = (pid / "cmdline").read_bytes().split(b"\0")
            if all(word.encode() in args for word in words):
                return int(_stat(pid)[2])
        except OSError:
            continue
    raise LookupError(f"no process runs with {words}")


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def container_cpu_seconds(key: str) -> float:
    """CPU time of an LXC desktop, everything in it, from its cgroup (v1 or v2)."""
    v1 = Path(f"/sys/fs/cgroup/cpuacct/lxc.payload.{key}/cpuacct.usage")
    if v1.exists():
        return int(v1.read_text()) / 1e9
    stat = dict(
        line.split() for line in Path(f"/sys/fs/cgroup/lxc.payload.{key}/cpu.stat").read_text().splitlines()
    )
    return int(stat["usage_usec"]) / 1e6
