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
from workers.drivers.lxc.network import run

CONF, PID = "resolver.conf", "resolver.pid"
# What a desktop is told its answers are good for, at most: it looks names up again that often. The
# resolver keeps no cache, so each answer puts its addresses back in the allowed set if they had left it.
MAX_TTL = 60
_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
# Names end up in dnsmasq's configuration: nothing but labels, dots and a leading "*." gets there.
DOMAIN = re.compile(rf"(?=.{{1,253}}$)(\*\.)?({_LABEL}\.)+{_LABEL}")


def render_conf(
    *,
    listen: str,
    port: int,
    upstreams: tuple[str, ...],
    allow_internet: bool,
    domains: tuple[str, ...],
    nftset: str,
    pid_file: Path,
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
        # More specific domains win over "#" (every name): the allowed ones are forwarded.
        lines.append("address=/#/")
        if domains:
            names = "/".join(domains)
            lines += [f"server=/{names}/{upstream}" for upstream in upstreams]
            lines.append(f"nftset=/{names}/4#{nftset}")
    return "\n".join(lines) + "\n"


def ensure(directory: Path, conf: str) -> None:
    """Run the resolver with this configuration: started if it is not running, restarted if it changed."""
    path = directory / CONF
    changed = not path.exists() or path.read_text() != conf
    if not changed and _pid(directory) is not None:
        return
    stop(directory)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(conf)
    tmp.replace(path)
    result = run(["dnsmasq", f"--conf-file={path}"], timeout=30)
    if result.returncode != 0:
        raise DriverError(f"the desktop's resolver did not start: {result.stderr.strip()}")


def stop(directory: Path) -> None:
    pid = _pid(directory)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def running(directory: Path) -> bool:
    return _pid(directory) is not None


def _pid(directory: Path) -> int | None:
    """The pid of this desktop's resolver, if it runs (a pid file may outlive it, and its pid be reused)."""
    try:
        pid = int((directory / PID).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if f"--conf-file={directory / CONF}".encode() in cmdline.split(b"\0") else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie awaiting its parent counts as gone (the resolver daemonised, so init reaps it).
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return False
