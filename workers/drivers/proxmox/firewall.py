"""The PVE firewall of one desktop VM: options, IP sets and rules rendered from a network policy.

Inbound: only the control plane, on SSH and VNC. Outbound: the control plane's callback ports (the
guest endpoint; none of its other ports, whatever the policy), the policy's allowed CIDRs and the
addresses its allowed domains resolve to, never the private ranges (other desktops, internal
networks), and the internet only when the policy allows it.
``ipfilter``/``macfilter`` stop a guest from spoofing.

The allowed domains are kept in the comment of their IP set, so the periodic refresh finds them on
the VM itself (the control plane stores no policy) and re-resolves them: addresses behind a name
change, and a set resolved once would go stale.

With the desktops' resolver (``resolver``) the VM's DNS may go to it alone, and it adds the addresses
it answers to the same set, each entry's comment saying until when (the record's TTL): the refresh
removes them once that has passed. Wildcards (``*.example.com``) can only be allowed that way, since
no lookup in advance can list a wildcard's names.

Every packet dropped on the way out is logged (``blocked``): the option ``log_level_out`` for the policy,
each DROP rule's ``log`` for the rest. The set ``lb-refused`` is made with the firewall and left alone
after: the desktops' resolver keeps there the names it refused the VM.
"""

from __future__ import annotations

import ipaddress
import math
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import quote

from proxmoxer import ResourceException

from workers.drivers.base import DriverError, NetworkPolicy, TransientDriverError
from workers.drivers.proxmox.api import pve_message
from workers.drivers.proxmox.blocked import LOG_LEVEL, REFUSED, refused_comment

CONTROL, ALLOWED, DOMAINS, PRIVATE = "lb-control", "lb-allowed", "lb-domains", "lb-private"
# PVE's own set for a NIC's allowed source addresses (with the `ipfilter` option): only the address
# the control plane gave the VM, so the guest can neither spoof another nor choose its own.
IPFILTER = "ipfilter-net0"
COMMENT = "lebureau"
DOMAINS_COMMENT = f"{COMMENT} domains:"
# The comment of an address the resolver answered: it is allowed until then (seconds since the epoch).
ANSWERED_COMMENT = f"{COMMENT} dns until "
_DOMAIN = re.compile(
    r"(?=.{1,253}$)(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
)

# A domain name -> its IPv4 addresses; raises OSError (socket.gaierror) when the lookup fails.
Resolver = Callable[[str], Iterable[str]]
# The fields of a rule the driver sets, the ones compared to decide whether rules changed.
RULE_FIELDS = ("type", "action", "proto", "dport", "source", "dest", "enable", "log", "comment")


@dataclass(frozen=True)
class FirewallPlan:
    options: dict[str, object]
    ipsets: dict[str, tuple[str, ...]]
    rules: tuple[dict[str, str], ...]
    # The IP sets' comments; the domains' one names them.
    comments: dict[str, str]


def firewall_plan(
    policy: NetworkPolicy,
    address: str,
    control_cidrs: tuple[str, ...],
    control_tcp_ports: tuple[int, ...],
    private_cidrs: tuple[str, ...],
    resolve: Resolver,
    resolver: str = "",
) -> FirewallPlan:
    """``resolver``: the address of the desktops' resolver, when there is one."""
    allowed = tuple(_network(cidr) for cidr in policy.allowed_cidrs)
    domains = tuple(sorted({_domain(name) for name in policy.allowed_domains}))
    wildcards = [d for d in domains if d.startswith("*.")]
    if wildcards and not resolver:
        raise DriverError(
            f"allowed domain {wildcards[0]!r} is a wildcard: it needs the desktops' resolver "
            "(PROXMOX_RESOLVER_ADDRESS), since no lookup in advance lists its names"
        )
    rules = [
        _rule("in", "ACCEPT", "22", source=f"+{CONTROL}"),
        _rule("in", "ACCEPT", "5900", source=f"+{CONTROL}"),
    ]
    if control_tcp_ports:
        rules.append(_rule("out", "ACCEPT", ",".join(map(str, control_tcp_ports)), dest=f"+{CONTROL}"))
    if resolver:
        # DNS to our resolver only, in every policy, before any rule could let it out elsewhere (an
        # allowed name may well be a public resolver's): what it answers is what the set holds.
        resolver = str(ipaddress.IPv4Address(resolver))
        rules += [_rule("out", "ACCEPT", "53", proto, dest=resolver) for proto in ("udp", "tcp")]
        rules += [_rule("out", "DROP", "53", proto) for proto in ("udp", "tcp")]
    # Nothing else of the control plane, in every policy and even where its address is public: its
    # pages, API and admin stay out of a desktop's reach.
    rules.append(_rule("out", "DROP", dest=f"+{CONTROL}"))
    # Denied before anything is allowed: no allowed CIDR or domain opens a private network.
    rules.append(_rule("out", "DROP", dest=f"+{PRIVATE}"))
    if allowed:
        rules.append(_rule("out", "ACCEPT", dest=f"+{ALLOWED}"))
    if domains:
        rules.append(_rule("out", "ACCEPT", dest=f"+{DOMAINS}"))
    ipsets = {
        CONTROL: tuple(_network(c) for c in control_cidrs),
        ALLOWED: allowed,
        DOMAINS: resolved(domains, resolve),
        PRIVATE: tuple(_network(c, any_family=True) for c in private_cidrs),
        IPFILTER: (_network(address),),
    }
    return FirewallPlan(
        options={
            "enable": 1,
            "dhcp": 1,
            "ipfilter": 1,
            "macfilter": 1,
            "policy_in": "DROP",
            "policy_out": "ACCEPT" if policy.allow_internet else "DROP",
            "log_level_out": LOG_LEVEL,
        },
        ipsets=ipsets,
        rules=tuple(rules),
        comments={name: domains_comment(domains) if name == DOMAINS else COMMENT for name in ipsets},
    )


def apply_firewall(vm_api, plan: FirewallPlan) -> None:
    """Converge the VM's firewall on the plan: IP sets first, then rules, then the options.

    New rules go in on top before the old ones are removed, so there is never a moment without them.
    """
    firewall = vm_api.firewall
    existing = {s["name"]: s.get("comment", "") for s in firewall.ipset.get()}
    for name, cidrs in plan.ipsets.items():
        comment = plan.comments[name]
        ipset = firewall.ipset(name)
        if name not in existing:
            firewall.ipset.post(name=name, comment=comment)
        elif existing[name] != comment:
            # PVE's way to change only the comment: "rename" the set to its own name. What the resolver
            # answered under the former domains goes with them.
            firewall.ipset.post(name=name, rename=name, comment=comment)
        elif name == DOMAINS:
            # The same names: what the resolver answered for them stays until its time is up.
            present = ipset.get()
            converge_ipset(ipset, kept_entries(present, cidrs), present)
            continue
        converge_ipset(ipset, cidrs)
    if REFUSED not in existing:
        # Empty and in no rule: only its comment matters, the resolver's from now on (which makes it
        # itself for a VM whose firewall predates it, maybe just now).
        try:
            firewall.ipset.post(name=REFUSED, comment=refused_comment(int(time.time()), ()))
        except ResourceException as exc:
            if "already exist" not in pve_message(exc):
                raise
    current = firewall.rules.get()
    if [_comparable(r) for r in sorted(current, key=lambda r: r["pos"])] != list(plan.rules):
        for pos, rule in enumerate(plan.rules):
            firewall.rules.post(pos=pos, **rule)
        for pos in reversed(range(len(plan.rules), len(plan.rules) + len(current))):
            firewall.rules(pos).delete()
    firewall.options.put(**plan.options)


def converge_ipset(ipset_api, cidrs: Iterable[str], entries: list[dict] | None = None) -> bool:
    """Add the missing entries, then remove the others; True when anything changed. ``entries``: the
    set's entries as just read, if they were."""
    wanted = set(cidrs)
    present = {e["cidr"] for e in (ipset_api.get() if entries is None else entries)}
    for cidr in sorted(wanted - present):
        ipset_api.post(cidr=cidr)
    for cidr in sorted(present - wanted):
        ipset_api(quote(cidr, safe="")).delete()
    return wanted != present


def kept_entries(entries: Iterable[dict], cidrs: Iterable[str], now: float | None = None) -> tuple[str, ...]:
    """The addresses a domains set should hold: ``cidrs`` (resolved in advance) and the addresses the
    resolver answered whose time is not up yet."""
    now = time.time() if now is None else now
    kept = set(cidrs)
    for entry in entries:
        until = answered_until(entry.get("comment", ""))
        if until is not None and until > now:
            kept.add(entry["cidr"])
    return tuple(sorted(kept, key=ipaddress.IPv4Network))


def answered_comment(until: float) -> str:
    # Rounded up: never a moment shorter than the TTL.
    return f"{ANSWERED_COMMENT}{math.ceil(until)}"


def answered_until(comment: str) -> int | None:
    """Until when an entry the resolver added is allowed; None for an entry resolved in advance."""
    if not comment.startswith(ANSWERED_COMMENT):
        return None
    try:
        return int(comment.removeprefix(ANSWERED_COMMENT))
    except ValueError:
        return 0


def domains_comment(domains: Iterable[str]) -> str:
    return " ".join((DOMAINS_COMMENT, *domains))


def domains_of(comment: str) -> tuple[str, ...]:
    """The domains a domains IP set's comment names (none for any other comment)."""
    if not comment.startswith(DOMAINS_COMMENT):
        return ()
    return tuple(comment.removeprefix(DOMAINS_COMMENT).split())


def resolved(domains: Iterable[str], resolve: Resolver) -> tuple[str, ...]:
    """Every IPv4 address of the domains as /32 networks (wildcards have none: only the resolver knows
    theirs); a failed lookup fails it all, so a DNS outage never empties a set that is in use."""
    addresses = set()
    for domain in domains:
        if domain.startswith("*."):
            continue
        try:
            answer = tuple(resolve(domain))
        except OSError as exc:
            # EAI_AGAIN is the resolver's "try again later"; anything else is the name's own fault.
            error = TransientDriverError if getattr(exc, "errno", None) == socket.EAI_AGAIN else DriverError
            raise error(f"allowed domain {domain!r} does not resolve: {exc}") from exc
        addresses.update(_network(address) for address in answer)
    return tuple(sorted(addresses, key=ipaddress.IPv4Network))


def resolve_ipv4(domain: str) -> tuple[str, ...]:
    """The domain's A records, by the system's resolver."""
    answers = socket.getaddrinfo(domain, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    return tuple(answer[4][0] for answer in answers)


def _rule(direction: str, action: str, dport: str = "", proto: str = "tcp", **address: str) -> dict[str, str]:
    rule = {"type": direction, "action": action, "enable": "1", "comment": COMMENT, **address}
    if (direction, action) == ("out", "DROP"):
        rule["log"] = LOG_LEVEL  # a blocked attempt, counted from the firewall's log
    if dport:
        rule.update(proto=proto, dport=dport)
    return rule


def _comparable(rule: dict) -> dict[str, str]:
    return {k: str(rule[k]) for k in RULE_FIELDS if k in rule and rule[k] != ""}


def _domain(name: str) -> str:
    domain = name.strip().rstrip(".").lower()
    if not _DOMAIN.fullmatch(domain):
        raise DriverError(f"allowed domain {name!r} is not a domain name")
    return domain


def _network(cidr: str, any_family: bool = False) -> str:
    try:
        if any_family:
            return str(ipaddress.ip_network(cidr, strict=False))
        return str(ipaddress.IPv4Network(cidr, strict=False))
    except ValueError as exc:
        raise DriverError(f"allowed CIDR {cidr!r} is not an IPv4 network: {exc}") from exc
