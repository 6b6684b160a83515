"""What a desktop VM tried to reach and its egress policy refused: the packets its firewall dropped, read
from PVE's firewall log, and the names the desktops' resolver refused it, kept on the VM's firewall.

**Addresses.** The VM firewall logs what it drops on the way out (the ``log_level_out`` option for its
policy, each DROP rule's ``log``), and PVE serves a VM's lines of the node's firewall log at
``GET /nodes/{node}/qemu/{vmid}/firewall/log``. Their format is pvefw-logger's (pve-firewall,
``src/pvefw-logger.c``: ``<VMID> <LOGLEVEL> <CHAIN> <TIME> <TIMEZONE> <MSG>``, e.g.
``117 6 tap117i0-OUT 14/Mar/2014:12:47:07 +0100 policy DROP: IN=fwbr117i0 … SRC=… DST=… …``; the
message is ``policy DROP: `` for the policy and ``DROP: `` for a rule, ``Firewall.pm``). Without
``since``/``until`` PVE reads the current log file only (with them, every rotated one too), which its
logrotate starts again daily: so the lines of a destination only grow until then, a counter that the
domain sees start again, as the LXC engine's do once an address is forgotten. PVE rate-limits logging
(the host's ``log_ratelimit``, 1/s with a burst of 5 by default): a flood counts as what was logged.

**Names.** The resolver and the workers may run on different hosts; the one place both reach is the
cluster, through the API they already use. So the resolver keeps the names it refused a VM in the
comment of an IP set of that VM's own firewall, ``lb-refused``, which no rule uses and which goes with
the VM: ``lebureau refused since <epoch>: <name>=<count>@<epoch of the last> …``, the latest first, the
last ``REFUSED_KEPT`` names only. ``since`` (when the set was made, with the VM's firewall) also tells
which log lines are this VM's: a VMID is reused once its VM is gone, and PVE's log keeps the former
one's lines under it.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from dataclasses import dataclass

from workers.drivers.base import BlockedDestination

REFUSED = "lb-refused"
REFUSED_COMMENT = "lebureau refused since "
# The names kept per VM, and how much of each (a desktop chooses its names: they stay short and plain).
REFUSED_KEPT = 32
NAME_MAX = 100
# The level the VM firewall logs its drops at (any but "nolog" would do: PVE logs them all alike).
LOG_LEVEL = "info"
# Lines read per request of a VM's firewall log, and requests at most per reading.
LOG_PAGE = 5000
LOG_PAGES = 10

_MONTHS = {
    month: number
    for number, month in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}
_LOG_LINE = re.compile(
    r"(?P<vmid>\d+) [0-7] (?P<chain>\S+) (?P<day>\d\d)/(?P<month>\w{3})/(?P<year>\d{4}):"
    r"(?P<time>\d\d:\d\d:\d\d) (?P<zone>[+-]\d{4}) (?:policy )?(?:DROP|REJECT): .*?\bDST=(?P<dst>[0-9.]+) "
)
_ENTRY = re.compile(r"(?P<name>[^\s=]+)=(?P<count>\d+)@(?P<last>\d+)")
_UNSAFE = re.compile(r"[^a-z0-9._-]")


@dataclass(frozen=True)
class RefusedName:
    name: str
    count: int
    # When it was last refused (seconds since the epoch).
    last: int


def refused_comment(since: int, names: Iterable[RefusedName]) -> str:
    entries = " ".join(f"{n.name}={n.count}@{n.last}" for n in names)
    return f"{REFUSED_COMMENT}{since}: {entries}".rstrip()


def refused_record(comment: str) -> tuple[int, list[RefusedName]] | None:
    """Since when the record runs and its names, the latest first; None for any other comment."""
    if not comment.startswith(REFUSED_COMMENT):
        return None
    since, _, rest = comment.removeprefix(REFUSED_COMMENT).partition(":")
    if not since.isdigit():
        return None
    names = [
        RefusedName(m["name"], int(m["count"]), int(m["last"]))
        for m in map(_ENTRY.fullmatch, rest.split())
        if m
    ]
    return int(since), names


def recorded(names: Iterable[RefusedName], refused: dict[str, tuple[int, int]]) -> list[RefusedName]:
    """The record with ``refused`` (name -> (look-ups, when the last was)) added: the latest first, the
    last REFUSED_KEPT names only."""
    merged = {n.name: n for n in names}
    for name, (count, last) in refused.items():
        known = merged.get(name)
        if known is not None:
            count, last = known.count + count, max(known.last, last)
        merged[name] = RefusedName(name, count, last)
    return sorted(merged.values(), key=lambda n: (-n.last, n.name))[:REFUSED_KEPT]


def clean_name(name: str) -> str:
    """A name as the record keeps it: a desktop may ask for any bytes, the record takes plain ones."""
    return _UNSAFE.sub("?", name.lower())[:NAME_MAX] or "?"


def dropped(lines: Iterable[str], vmid: int, since: float, now: float) -> list[BlockedDestination]:
    """The VM's outbound drops in these log lines from ``since`` on, per destination: packets and seconds
    since the last, the latest first."""
    found: dict[str, list[int]] = {}
    for line in lines:
        match = _LOG_LINE.match(line)
        if match is None or int(match["vmid"]) != vmid or not match["chain"].endswith("-OUT"):
            continue
        at = _timestamp(match)
        if at is None or at < since:
            continue
        seen = found.setdefault(match["dst"], [0, at])
        seen[0] += 1
        seen[1] = max(seen[1], at)
    destinations = [BlockedDestination(dst, n, max(0, int(now - last))) for dst, (n, last) in found.items()]
    return sorted(destinations, key=lambda d: (d.seconds_ago, d.address))


def _timestamp(match: re.Match) -> int | None:
    # By hand: strptime's %b follows the process's locale, pvefw-logger's months are C's.
    month = _MONTHS.get(match["month"])
    if month is None:
        return None
    hour, minute, second = map(int, match["time"].split(":"))
    zone = match["zone"]
    offset = datetime.timedelta(hours=int(zone[1:3]), minutes=int(zone[3:5])) * (-1 if zone[0] == "-" else 1)
    try:
        at = datetime.datetime(
            int(match["year"]),
            month,
            int(match["day"]),
            hour,
            minute,
            second,
            tzinfo=datetime.timezone(offset),
        )
    except ValueError:
        return None
    return int(at.timestamp())
