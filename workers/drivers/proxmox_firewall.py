"""The PVE firewall of one desktop VM: options, IP sets and rules rendered from a network policy.

Inbound: only the control plane, on SSH and VNC. Outbound: the control plane's callback ports, the
policy's allowed CIDRs, never the private ranges (other desktops, internal networks), and the
internet only when the policy allows it. ``ipfilter``/``macfilter`` stop a guest from spoofing.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import quote

from workers.drivers.base import DriverError, NetworkPolicy

CONTROL, ALLOWED, PRIVATE = "lb-control", "lb-allowed", "lb-private"
COMMENT = "lebureau"
# The fields of a rule the driver sets, the ones compared to decide whether rules changed.
RULE_FIELDS = ("type", "action", "proto", "dport", "source", "dest", "enable", "comment")


@dataclass(frozen=True)
class FirewallPlan:
    options: dict[str, object]
    ipsets: dict[str, tuple[str, ...]]
    rules: tuple[dict[str, str], ...]


def firewall_plan(
    policy: NetworkPolicy,
    control_cidrs: tuple[str, ...],
    control_tcp_ports: tuple[int, ...],
    private_cidrs: tuple[str, ...],
) -> FirewallPlan:
    allowed = tuple(_network(cidr) for cidr in policy.allowed_cidrs)
    rules = [
        _rule("in", "ACCEPT", "22", source=f"+{CONTROL}"),
        _rule("in", "ACCEPT", "5900", source=f"+{CONTROL}"),
        _rule("out", "ACCEPT", ",".join(map(str, control_tcp_ports)), dest=f"+{CONTROL}"),
    ]
    if allowed:
        rules.append(_rule("out", "ACCEPT", dest=f"+{ALLOWED}"))
    rules.append(_rule("out", "DROP", dest=f"+{PRIVATE}"))
    return FirewallPlan(
        options={
            "enable": 1,
            "dhcp": 1,
            "ipfilter": 1,
            "macfilter": 1,
            "policy_in": "DROP",
            "policy_out": "ACCEPT" if policy.allow_internet else "DROP",
        },
        ipsets={
            CONTROL: tuple(_network(c) for c in control_cidrs),
            ALLOWED: allowed,
            PRIVATE: tuple(_network(c) for c in private_cidrs),
        },
        rules=tuple(rules),
    )


def apply_firewall(vm_api, plan: FirewallPlan) -> None:
    """Converge the VM's firewall on the plan: IP sets first, then rules, then the options.

    New rules go in on top before the old ones are removed, so there is never a moment without them.
    """
    firewall = vm_api.firewall
    existing = {s["name"] for s in firewall.ipset.get()}
    for name, cidrs in plan.ipsets.items():
        if name not in existing:
            firewall.ipset.post(name=name, comment=COMMENT)
        present = {e["cidr"] for e in firewall.ipset(name).get()}
        for cidr in sorted(set(cidrs) - present):
            firewall.ipset(name).post(cidr=cidr)
        for cidr in sorted(present - set(cidrs)):
            firewall.ipset(name)(quote(cidr, safe="")).delete()
    current = firewall.rules.get()
    if [_comparable(r) for r in sorted(current, key=lambda r: r["pos"])] != list(plan.rules):
        for pos, rule in enumerate(plan.rules):
            firewall.rules.post(pos=pos, **rule)
        for pos in reversed(range(len(plan.rules), len(plan.rules) + len(current))):
            firewall.rules(pos).delete()
    firewall.options.put(**plan.options)


def _rule(direction: str, action: str, dport: str = "", **address: str) -> dict[str, str]:
    rule = {"type": direction, "action": action, "enable": "1", "comment": COMMENT, **address}
    if dport:
        rule.update(proto="tcp", dport=dport)
    return rule


def _comparable(rule: dict) -> dict[str, str]:
    return {k: str(rule[k]) for k in RULE_FIELDS if k in rule and rule[k] != ""}


def _network(cidr: str) -> str:
    try:
        return str(ipaddress.IPv4Network(cidr, strict=False))
    except ValueError as exc:
        raise DriverError(f"allowed CIDR {cidr!r} is not an IPv4 network: {exc}") from exc
