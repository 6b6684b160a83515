"""The LXC driver's host network: the project's bridge and its nftables tables.

The firewall is declarative: :func:`render_ruleset` turns the bridge settings and every desktop's
address and egress policy into the whole of the project's two nftables tables, and :func:`apply`
replaces them in one atomic ``nft -f`` transaction. Rebuilding everything on each change keeps it
idempotent and self-healing (a host reboot or a hand edit is repaired by the next change).

The addresses each desktop's resolver has let it reach (``resolver``), and those a desktop without
the internet tried and failed to reach, live in a third table, ``<table>_dns``, which a change never
replaces, only completes: they would otherwise be forgotten whenever another desktop starts. Its
forward chain runs first and marks the packets of a desktop to an address of its allowed set; the main
table lets marked packets of a desktop without the internet through, once the networks no desktop
reaches have been dropped. Its input and forward chains also keep each desktop's share of what the
host shares (its open connections, its DNS and ping rates): in the main table, every rewrite would start
those counts again, and a tenant can have the rules rewritten at will (a desktop made or destroyed).

Run as a module to create the bridge and an empty firewall (``image-build/host-setup.sh`` does)::

    python3 workers/drivers/lxc/network.py --bridge lbbr0 --subnet 10.213.0.0/24
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import subprocess
from dataclasses import dataclass, field

TABLE = "lebureau"
# Host-side names of the desktops' veth interfaces start with this. Bridge-family rules see every
# bridge of the host and this kernel cannot match on the bridge's name, so each driver instance
# (production, tests, bench) has its own prefix and its bridge rules only touch its own ports.
VETH_PREFIX = "lbv"


# Never reachable from a desktop, whatever its egress policy: this host's and its neighbours' private
# networks, link-local (169.254.169.254 is a cloud's metadata service: the host's own credentials),
# loopback, shared and reserved space, multicast.
DENIED_CIDRS = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
)


# The mark of a desktop's packet to an address its resolver allowed (see the module's docstring).
ALLOWED_MARK = 0x00004C42
# How long an address a resolver allowed stays allowed after it was put there or last used (a look-up
# does not renew it, but puts it back once gone).
ALLOWED_FOR = 86400
# The blocked destinations kept per desktop, and for how long after the last attempt.
BLOCKED_KEPT, BLOCKED_FOR = 256, 7 * 86400


@dataclass(frozen=True)
class DesktopRules:
    ip: str
    # The host side of the desktop's veth and the desktop's MAC: its frames may only carry its own
    # MAC and address, untagged.
    veth: str
    mac: str
    allow_internet: bool = True
    allowed_cidrs: tuple[str, ...] = field(default_factory=tuple)
    # Where on the host's bridge address the desktop's resolver listens (its DNS is sent there).
    resolver_port: int = 0


@dataclass(frozen=True)
class HostLimits:
    """What one desktop may spend of what the host shares between every desktop and itself: entries of
    its one connection-tracking table, and DNS and ping packets answered by the host."""

    connections: int = 2048
    dns_per_second: int = 100
    pings_per_second: int = 20


def allowed_set(veth: str) -> str:
    """The name of the desktop's set of addresses its resolver allowed, in the ``<table>_dns`` table."""
    return f"allow_{veth}"


def blocked_set(veth: str) -> str:
    """The name of the desktop's set of addresses it could not reach, each with its count of packets."""
    return f"blocked_{veth}"


def resolver_port(subnet: str, ip: str, base: int) -> int:
    """Each address of the subnet has a port of its own for its resolver, from ``base`` on."""
    return base + int(ipaddress.ip_address(ip)) - int(ipaddress.ip_network(subnet).network_address)


def gateway_of(subnet: str) -> str:
    """The host's address on the bridge: the subnet's first address."""
    return str(next(ipaddress.ip_network(subnet).hosts()))


def render_ruleset(
    bridge: str,
    subnet: str,
    desktops: list[DesktopRules],
    host_tcp_ports: tuple[int, ...],
    table: str = TABLE,
    veth_prefix: str = VETH_PREFIX,
    denied_cidrs: tuple[str, ...] = DENIED_CIDRS,
    existing_sets: tuple[str, ...] = (),
    limits: HostLimits = HostLimits(),
) -> str:
    """The project's tables for these desktops; ``existing_sets`` are the sets the ``_dns`` table holds
    now (those of desktops gone are deleted)."""
    gateway = gateway_of(subnet)
    ips = sorted({d.ip for d in desktops}, key=ipaddress.ip_address)
    no_internet = sorted({d.ip for d in desktops if not d.allow_internet}, key=ipaddress.ip_address)
    bindings = sorted(f'"{d.veth}" . {d.mac} . {d.ip}' for d in desktops)
    denied = sorted({str(ipaddress.ip_network(c)) for c in denied_cidrs}, key=ipaddress.ip_network)
    egress = sorted(
        {
            f"{d.ip} . {ipaddress.ip_network(c, strict=False)}"
            for d in desktops
            if not d.allow_internet
            for c in d.allowed_cidrs
        }
    )

    def elements(items: list[str]) -> str:
        return f"elements = {{ {', '.join(items)} }}" if items else ""

    resolvers = sorted(f"{d.ip} : {gateway} . {d.resolver_port}" for d in desktops if d.resolver_port)
    mark = f"{ALLOWED_MARK:#010x}"
    ports = ", ".join(str(p) for p in sorted(set(host_tcp_ports)))
    host_ports_rule = f"tcp dport {{ {ports} }} accept" if ports else ""

    outside_ports_rule = f'iifname != "{bridge}" tcp dport {{ {ports} }} drop' if ports else ""
    # The leading "add table" makes the "delete table" valid when the table does not exist yet,
    # so the whole replacement is one transaction whatever the current state.
    return f"""
add table inet {table}
delete table inet {table}
table inet {table} {{
    set desktops {{ type ipv4_addr; {elements(ips)} }}
    set no_internet {{ type ipv4_addr; {elements(no_internet)} }}
    set egress_allow {{ type ipv4_addr . ipv4_addr; flags interval; {elements(egress)} }}
    set denied {{ type ipv4_addr; flags interval; {elements(denied)} }}
    map resolvers {{ type ipv4_addr : ipv4_addr . inet_service; {elements(resolvers)} }}

    # Whatever resolver a desktop asks, its own answers.
    chain prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        iifname "{bridge}" meta l4proto {{ tcp, udp }} th dport 53 dnat ip to ip saddr map @resolvers
    }}

    chain input {{
        type filter hook input priority filter; policy accept;
        iifname "lo" accept
        # A neighbour routing through another interface reaches neither the desktops' side of the host
        # (their resolvers) nor the ports meant for desktops alone, whatever those listen on.
        iifname != "{bridge}" ip daddr {subnet} drop
        {outside_ports_rule}
        iifname != "{bridge}" accept
        ct state established,related accept
        ip saddr != @desktops drop
        icmp type echo-request accept
        meta l4proto {{ tcp, udp }} ct original proto-dst 53 ct status dnat accept
        udp dport 67 ip daddr {{ {gateway}, 255.255.255.255 }} accept
        {host_ports_rule}
        drop
    }}

    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "{bridge}" oifname "{bridge}" drop
        oifname "{bridge}" ct state established,related accept
        oifname "{bridge}" drop
        iifname "{bridge}" meta nfproto ipv6 drop
        iifname "{bridge}" ip saddr != @desktops drop
        iifname "{bridge}" ip daddr @denied counter drop
        iifname "{bridge}" ip saddr @no_internet ip saddr . ip daddr @egress_allow accept
        iifname "{bridge}" ip saddr @no_internet meta mark & {mark} == {mark} accept
        iifname "{bridge}" ip saddr @no_internet drop
    }}

    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr {subnet} oifname != "{bridge}" masquerade
    }}
}}

add table bridge {table}
delete table bridge {table}
table bridge {table} {{
    set bindings {{ type ifname . ether_addr . ipv4_addr; {elements(bindings)} }}

    # A frame the bridge drops here is never learnt either: no spoofed MAC reaches its table.
    chain prerouting {{
        type filter hook prerouting priority filter; policy accept;
        iifname != "{veth_prefix}*" accept
        ether type != {{ ip, arp }} counter drop
        ether type ip iifname . ether saddr . ip saddr != @bindings counter drop
        ether type arp iifname . ether saddr . arp saddr ip != @bindings counter drop
        ether type arp iifname . arp saddr ether . arp saddr ip != @bindings counter drop
    }}

    chain forward {{
        type filter hook forward priority filter; policy accept;
        iifname "{veth_prefix}*" oifname "{veth_prefix}*" drop
    }}
}}
{_render_dns_table(table, bridge, desktops, existing_sets, limits)}"""


# The ``_dns`` table's sets of every desktop's share of the host, by source address.
SHARED_SETS = {
    "connections": "type ipv4_addr; size 65535; flags dynamic;",
    "dns_rate": "type ipv4_addr; size 65535; flags dynamic, timeout; timeout 1m;",
    "ping_rate": "type ipv4_addr; size 65535; flags dynamic, timeout; timeout 1m;",
}


def _render_dns_table(
    table: str, bridge: str, desktops: list[DesktopRules], existing: tuple[str, ...], limits: HostLimits
) -> str:
    """The ``_dns`` table completed, never replaced: its sets keep what the resolvers put in them, what
    each desktop without the internet tried to reach and could not (per address, with a counter), and
    each desktop's share of the host."""
    dns = f"{table}_dns"
    by_veth = {d.veth: d for d in desktops}
    lines = [f"add table inet {dns}"]
    lines += [f"add set inet {dns} {name} {{ {spec} }}" for name, spec in SHARED_SETS.items()]

    def over_rate(rate_set: str, per_second: int) -> str:
        limit = f"limit rate over {per_second}/second burst {2 * per_second} packets"
        return f"update @{rate_set} {{ ip saddr {limit} }} drop"

    over = f"ct count over {limits.connections}"
    connections = f'iifname "{bridge}" ct state new add @connections {{ ip saddr {over} }} drop'
    # Before the main table's chains, where a flood from one port pair is one established flow.
    lines += [
        f"add chain inet {dns} input {{ type filter hook input priority filter - 1; policy accept; }}",
        f"flush chain inet {dns} input",
        f'add rule inet {dns} input iifname "{bridge}" meta l4proto {{ tcp, udp }} ct original proto-dst 53 '
        + over_rate("dns_rate", limits.dns_per_second),
        f'add rule inet {dns} input iifname "{bridge}" icmp type echo-request '
        + over_rate("ping_rate", limits.pings_per_second),
        f"add rule inet {dns} input {connections}",
    ]
    for veth in sorted(by_veth):
        lines += [
            f"add set inet {dns} {allowed_set(veth)} "
            f"{{ type ipv4_addr; flags dynamic, timeout; timeout {ALLOWED_FOR}s; }}",
            f"add set inet {dns} {blocked_set(veth)} "
            f"{{ type ipv4_addr; size {BLOCKED_KEPT}; flags dynamic, timeout; timeout {BLOCKED_FOR}s; }}",
        ]
    lines += [
        f"add chain inet {dns} forward {{ type filter hook forward priority filter - 1; policy accept; }}",
        f"flush chain inet {dns} forward",
        f"add rule inet {dns} forward {connections}",
    ]
    mark = f"{ALLOWED_MARK:#010x}"
    for veth, d in sorted(by_veth.items()):
        if d.allow_internet:
            continue
        allowed, blocked = allowed_set(veth), blocked_set(veth)
        # Each use keeps the address allowed for ALLOWED_FOR more.
        lines.append(
            f"add rule inet {dns} forward ip saddr {d.ip} ip daddr @{allowed} "  # noqa: S608 (nft, not SQL)
            f"update @{allowed} {{ ip daddr }} meta mark set meta mark | {mark}"
        )
        # What the main table drops: new connections neither marked above nor to an allowed network.
        networks = f"ip daddr != {{ {', '.join(d.allowed_cidrs)} }} " if d.allowed_cidrs else ""
        lines.append(
            f"add rule inet {dns} forward ip saddr {d.ip} ct state new meta mark & {mark} != {mark} "
            f"{networks}update @{blocked} {{ ip daddr counter }}"
        )
    lines += [f"delete set inet {dns} {name}" for name in sorted(set(existing) - _set_names(by_veth))]
    return "\n".join(lines) + "\n"


def _set_names(veths) -> set[str]:
    return {name for veth in veths for name in (allowed_set(veth), blocked_set(veth))} | SHARED_SETS.keys()


def existing_dns_sets(table: str) -> tuple[str, ...]:
    """The sets the ``_dns`` table holds now (none when it does not exist yet)."""
    listed = run(["nft", "-j", "list", "table", "inet", f"{table}_dns"])
    if listed.returncode != 0:
        return ()
    items = json.loads(listed.stdout)["nftables"]
    return tuple(i["set"]["name"] for i in items if "set" in i and i["set"]["table"] == f"{table}_dns")


def blocked_destinations(table: str, veth: str) -> list[tuple[str, int, int]]:
    """What the desktop tried to reach and could not: (address, packets, seconds since the last), the
    latest first."""
    listed = run(["nft", "-j", "list", "set", "inet", f"{table}_dns", blocked_set(veth)])
    if listed.returncode != 0:
        return []
    items = json.loads(listed.stdout)["nftables"]
    elements = next((i["set"].get("elem", []) for i in items if "set" in i), [])
    found = [
        (e["elem"]["val"], e["elem"]["counter"]["packets"], BLOCKED_FOR - e["elem"]["expires"])
        for e in elements
        if isinstance(e, dict) and "counter" in e.get("elem", {})
    ]
    return sorted(found, key=lambda f: f[2])


def forget_allowed(table: str, veth: str) -> None:
    """Empty a desktop's allowed set: what its former policy let it resolve is no longer reachable."""
    run(["nft", "flush", "set", "inet", f"{table}_dns", allowed_set(veth)])


def remove_tables(table: str) -> None:
    """The project's tables, gone (a test's bridge going with the test)."""
    for family, name in (("inet", table), ("bridge", table), ("inet", f"{table}_dns")):
        run(["nft", "delete", "table", family, name])


def apply(ruleset: str) -> None:
    result = run(["nft", "-f", "-"], stdin=ruleset)
    if result.returncode != 0:
        raise RuntimeError(f"nft rejected the project's firewall: {result.stderr.strip()}")


def ensure_bridge(bridge: str, subnet: str) -> None:
    """Create the bridge with the host's address on it; a no-op when it is already there."""
    address = f"{gateway_of(subnet)}/{ipaddress.ip_network(subnet).prefixlen}"
    if run(["ip", "link", "show", "dev", bridge]).returncode != 0:
        _ip("link", "add", bridge, "type", "bridge")
    shown = run(["ip", "-4", "-o", "addr", "show", "dev", bridge])
    if f" {address} " not in shown.stdout:
        _ip("addr", "replace", address, "dev", bridge)
    _ip("link", "set", bridge, "up")
    with open("/proc/sys/net/ipv4/ip_forward") as f:
        forwarding = f.read().strip() == "1"
    if not forwarding:
        with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
            f.write("1\n")


def _ip(*args: str) -> None:
    result = run(["ip", *args])
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


def run(command: list[str], stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a host tool (found on PATH: these are root's system tools, never user input)."""
    return subprocess.run(  # noqa: S603
        command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Create the LXC driver's bridge and an empty firewall.")
    parser.add_argument("--bridge", default="lbbr0")
    parser.add_argument("--subnet", default="10.213.0.0/24")
    parser.add_argument("--table", default=TABLE)
    parser.add_argument("--veth-prefix", default=VETH_PREFIX)
    args = parser.parse_args()
    ensure_bridge(args.bridge, args.subnet)
    # Only when the table is missing: replacing it would drop the rules of running desktops
    # (the driver re-renders them with their addresses on its next change).
    if run(["nft", "list", "table", "inet", args.table]).returncode != 0:
        apply(render_ruleset(args.bridge, args.subnet, [], (), args.table, args.veth_prefix))
    print(f"bridge {args.bridge} ({gateway_of(args.subnet)}) and nftables tables '{args.table}' ready")


if __name__ == "__main__":
    main()
