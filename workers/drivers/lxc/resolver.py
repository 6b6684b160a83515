"""Each desktop's resolver: a dnsmasq of its own, on the host's address on the bridge.

Every DNS packet a desktop sends is redirected to its resolver whatever address it was sent to
(``network``), so an agent that brings its own resolver gets the same answers. Open, the resolver
forwards every name to the host's upstream resolvers. Allow-list, it forwards the allowed names only,
answers "no such domain" for the others, and adds the addresses it hands out to the desktop's allowed
set in nftables, through which the firewall lets connections pass: a name's addresses are reachable
once the desktop has looked the name up, and no other address is. Deny-all, it answers no name.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

from workers.drivers.base import DriverError
from workers.drivers.lxc import cgroups
from workers.drivers.lxc.network import run

CONF, PID, LOG = "resolver.conf", "resolver.pid", "resolver.log"
# How much of the end of a resolver's log is read for the names it refused, and kept when trimmed.
LOG_KEPT = 1024 * 1024
# A look-up the resolver answered from its configuration with "no such domain": a refused name.
_REFUSED = re.compile(r"query\[A\] (\S+) from \S+\n[^\n]*: config \1 is NXDOMAIN\n")
# What a desktop is told its answers are good for, at most: it looks names up again that often. The
# resolver keeps no cache, so each answer puts its addresses back in the allowed set if they had left it.
MAX_TTL = 60
# A resolver runs on the host, so in a cgroup of its own per desktop (not the container's, which LXC
# removes when the desktop stops): however a desktop makes it work, it takes no more of the host than
# this. Its look-ups are rate-limited before they reach it (``network``); dnsmasq keeps no cache here
# and forks at most 20 children for TCP look-ups.
LIMITS = cgroups.Limits(memory_bytes=32 * 1024 * 1024, cpu_fraction=0.1, pids=32)


def render_conf(
    *,
    listen: str,
    port: int,
    upstreams: tuple[str, ...],
    allow_internet: bool,
    domains: tuple[str, ...],
    nftset: str,
    pid_file: Path,
    log_file: Path,
) -> str:
    """dnsmasq's configuration for one desktop. ``nftset`` is ``family#table#set``."""
    lines = [
        "no-resolv",
        "no-hosts",
        "no-poll",
        "bind-dynamic",
        f"listen-address={listen}",
        f"port={port}",
        f"pid-file={pid_file}",
        f"max-ttl={MAX_TTL}",
        "cache-size=0",
    ]
    if allow_internet:
        lines += [f"server={upstream}" for upstream in upstreams]
    else:
        # More specific domains win over "#" (every name): the allowed ones are forwarded. The log
        # says which names were refused.
        lines += ["address=/#/", "log-queries", f"log-facility={log_file}"]
        if domains:
            names = "/".join(domains)
            lines += [f"server=/{names}/{upstream}" for upstream in upstreams]
            lines.append(f"nftset=/{names}/4#{nftset}")
    return "\n".join(lines) + "\n"


def ensure(directory: Path, conf: str) -> None:
    """Run the resolver with this configuration: started if it is not running, restarted if it changed."""
    path = directory / CONF
    changed = not path.exists() or path.read_text() != conf
    if not changed and running(directory):
        return
    stop(directory)
    # A resolver whose desktop is gone (its engine was stopped between starting it and writing its pid)
    # may still hold the port this desktop's address maps to.
    for pid, other in _resolvers().items():
        if other.parent.parent == directory.parent and not other.exists():
            _kill(pid)
            cgroups.remove(cgroup_of(other.parent))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(conf)
    tmp.replace(path)
    result = run(["dnsmasq", f"--conf-file={path}"], timeout=30)
    if result.returncode != 0:
        raise DriverError(f"the desktop's resolver did not start: {result.stderr.strip()}")
    # Moved once it has forked into the background (the children it forks later follow it there).
    group = cgroup_of(directory)
    cgroups.create(group, LIMITS)
    for pid, other in _resolvers().items():
        if other == path:
            cgroups.add(group, pid)


def cgroup_of(directory: Path) -> str:
    return f"lebureau.resolver.{directory.name}"


def stop(directory: Path) -> None:
    for pid, conf in _resolvers().items():
        if conf == directory / CONF:
            _kill(pid)
    cgroups.remove(cgroup_of(directory))


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def refused_names(directory: Path) -> list[tuple[str, int]]:
    """The names the desktop looked up and its policy refused, with how many times, the latest first
    (from the end of its resolver's log)."""
    try:
        with open(directory / LOG, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_KEPT))
            text = log.read().decode(errors="replace")
    except OSError:
        return []
    counts: dict[str, int] = {}
    for match in _REFUSED.finditer(text):
        name = match.group(1)
        counts[name] = counts.pop(name, 0) + 1  # moved to the end: the latest last
    return list(reversed(counts.items()))


def trim_log(directory: Path) -> None:
    """Keep the end of a long log only (the resolver appends, so it writes on after the cut)."""
    path = directory / LOG
    with contextlib.suppress(FileNotFoundError), open(path, "r+b") as log:
        size = log.seek(0, os.SEEK_END)
        if size > 4 * LOG_KEPT:
            log.seek(size - LOG_KEPT)
            tail = log.read()
            log.truncate(0)
            log.seek(0)
            log.write(tail)


def running(directory: Path) -> bool:
    return any(conf == directory / CONF and _alive(pid) for pid, conf in _resolvers().items())


def _resolvers() -> dict[int, Path]:
    """Every desktop resolver running on the host, by pid, with its configuration file: found by their
    command line rather than their pid files, which a resolver may not have written yet."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if args[0].endswith(b"dnsmasq"):
            for arg in args:
                if arg.startswith(b"--conf-file=") and arg.endswith(CONF.encode()):
                    found[int(cmdline.parent.name)] = Path(arg.removeprefix(b"--conf-file=").decode())
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie awaiting its parent counts as gone (the resolver daemonised, so init reaps it).
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return False
