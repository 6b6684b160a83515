"""The Proxmox desktops' resolver, with real DNS packets on loopback.

The desktops' network is a loopback range here (``127.77.0.0/16``), so a test speaks for a VM by sending
from its address (``127.77.0.<VMID>``, bound on this host as every 127/8 address is). The names' real
answers come from a zone server the test runs on 127.0.0.1, never from the internet. The simulator
holds each VM's firewall, where the resolver adds what it answered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from dnslib import QTYPE, RCODE, DNSRecord
from dnslib.server import DNSServer
from dnslib.zoneresolver import ZoneResolver

from tests.drivers.test_proxmox_domains import Dns, rules_out
from tests.pve.support import CONTROL_CIDR, TEMPLATE, driver_for, make_spec, needs_schema
from workers.drivers.base import DriverError, NetworkPolicy
from workers.drivers.proxmox.resolver import ResolverService, _Quiet

pytestmark = needs_schema

SUBNET = "127.77.0.0/16"
ZONE = """
allowed.test.          120  IN A     203.0.113.11
www.allowed.test.      120  IN A     203.0.113.12
allowed.test.          120  IN AAAA  2001:db8::11
github.com.            600  IN A     203.0.113.20
api.github.com.        9000 IN A     203.0.113.21
codeload.github.com.   60   IN CNAME cdn.elsewhere.test.
cdn.elsewhere.test.    60   IN A     203.0.113.22
blocked.test.          120  IN A     203.0.113.66
short.allowed.test.    2    IN A     203.0.113.13
inside.allowed.test.   120  IN A     10.1.2.3
"""


class Recursive(ZoneResolver):
    """The zone, answered as a recursive resolver does: an alias followed to its addresses."""

    def resolve(self, request, handler):
        reply = super().resolve(request, handler)
        for record in list(reply.rr):
            if record.rtype == QTYPE.CNAME:
                target = DNSRecord.question(str(record.rdata), QTYPE.get(request.q.qtype))
                reply.rr += [r for r in super().resolve(target, handler).rr if r not in reply.rr]
        return reply


@pytest.fixture
def upstream():
    """The internet's DNS as far as these tests go: a zone server on loopback."""
    server = DNSServer(Recursive(ZONE), address="127.0.0.1", port=0, logger=_Quiet())
    server.start_thread()
    yield f"127.0.0.1:{server.server.server_address[1]}"
    server.stop()
    server.server.server_close()


@contextlib.contextmanager
def resolver_world(sim, upstream: str, dns: Dns, **options):
    """A driver whose desktops resolve through a resolver running on loopback, and that resolver."""
    defaults = {
        "subnet": SUBNET,
        "resolver_address": "127.0.0.1",
        "resolver_listen": "127.0.0.1:0",
        "resolver_upstreams": (upstream,),
        "resolver_policy_ttl": 0.0,
    }
    pve = driver_for(sim, resolve=dns, **defaults | options)
    service = ResolverService(pve.config).start()
    try:
        yield pve, service
    finally:
        service.stop()


@pytest.fixture
def world(sim, upstream):
    # The control plane's own lookups (in advance, for the names without a wildcard).
    dns = Dns({"allowed.test": ("203.0.113.10",), "github.com": ("203.0.113.20",)})
    with resolver_world(sim, upstream, dns, resolver_max_ttl=300, resolver_grace=0) as found:
        yield found


def provisioned(sim, pve, policy: NetworkPolicy):
    spec = make_spec()
    vm = sim.vms[int(pve.provision(spec).ref)]
    pve.apply_network_policy(spec.key, policy)
    return spec.key, vm


def ask(service, source: str, name: str, qtype: str = "A", tcp: bool = False) -> DNSRecord:
    """A query sent from ``source`` to the resolver, and its answer."""
    query = DNSRecord.question(name, qtype)
    packet = query.pack()
    kind = socket.SOCK_STREAM if tcp else socket.SOCK_DGRAM
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.settimeout(5)
        sock.bind((source, 0))
        if tcp:
            sock.connect(service.address)
            sock.sendall(len(packet).to_bytes(2, "big") + packet)
            length = int.from_bytes(_read(sock, 2), "big")
            data = _read(sock, length)
        else:
            sock.sendto(packet, service.address)
            data, _ = sock.recvfrom(4096)
    reply = DNSRecord.parse(data)
    assert reply.header.id == query.header.id
    return reply


def _read(sock, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the resolver closed the connection"
        data += chunk
    return data


def addresses(reply: DNSRecord) -> list[str]:
    return sorted(str(r.rdata) for r in reply.rr if r.rtype == QTYPE.A)


def entries(vm) -> dict[str, str]:
    return {e["cidr"]: e.get("comment", "") for e in vm.ipsets["lb-domains"]}


def until(comment: str) -> int:
    assert comment.startswith("lebureau dns until "), comment
    return int(comment.removeprefix("lebureau dns until "))


def test_an_allowed_name_is_answered_and_its_address_joins_the_vms_set(sim, world):
    pve, service = world
    _, vm = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",)))
    assert pve.config.address_of(vm.vmid) == f"127.77.{vm.vmid // 256}.{vm.vmid % 256}"
    # Resolved in advance by the control plane, as before.
    assert entries(vm) == {"203.0.113.10/32": ""}

    asked_at = time.time()
    reply = ask(service, pve.config.address_of(vm.vmid), "allowed.test")
    assert reply.header.rcode == RCODE.NOERROR
    assert addresses(reply) == ["203.0.113.11"]
    assert reply.rr[0].ttl == 120
    # In the set before the answer left, good for the record's TTL.
    assert set(entries(vm)) == {"203.0.113.10/32", "203.0.113.11/32"}
    assert asked_at + 119 <= until(entries(vm)["203.0.113.11/32"]) <= time.time() + 121

    # A domain covers its subdomains; over TCP as over UDP.
    reply = ask(service, pve.config.address_of(vm.vmid), "WWW.Allowed.Test", tcp=True)
    assert addresses(reply) == ["203.0.113.12"]
    assert "203.0.113.12/32" in entries(vm)
    # Asked again, an address already there for long enough costs no write.
    writes = len(sim.requests)
    ask(service, pve.config.address_of(vm.vmid), "allowed.test")
    assert not [r for r in sim.requests[writes:] if r[0] != "GET"]


def test_a_wildcard_policy_is_enforced_through_the_resolver(sim, world):
    pve, service = world
    # Refused on Proxmox before the resolver: no lookup in advance lists a wildcard's names.
    _, vm = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("*.github.com",)))
    assert vm.ipset_comments["lb-domains"] == "lebureau domains: *.github.com"
    assert entries(vm) == {}
    assert ("ACCEPT", "+lb-domains") in rules_out(vm)
    source = pve.config.address_of(vm.vmid)

    reply = ask(service, source, "api.github.com")
    assert addresses(reply) == ["203.0.113.21"]
    # The TTL a desktop is told, and the address's time in the set, are capped.
    assert reply.rr[0].ttl == 300
    assert until(entries(vm)["203.0.113.21/32"]) <= time.time() + 301
    # A name of the wildcard that is another's alias: the addresses it leads to are the name's.
    reply = ask(service, source, "codeload.github.com", tcp=True)
    assert addresses(reply) == ["203.0.113.22"]
    assert set(entries(vm)) == {"203.0.113.21/32", "203.0.113.22/32"}
    # `*.github.com` is its subdomains only.
    assert ask(service, source, "github.com").header.rcode == RCODE.NXDOMAIN
    assert set(entries(vm)) == {"203.0.113.21/32", "203.0.113.22/32"}


def test_a_name_not_allowed_is_no_such_domain_and_opens_nothing(sim, world):
    pve, service = world
    _, vm = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",)))
    source = pve.config.address_of(vm.vmid)
    for name, tcp in (("blocked.test", False), ("blocked.test", True), ("allowed.test.blocked.test", False)):
        reply = ask(service, source, name, tcp=tcp)
        assert reply.header.rcode == RCODE.NXDOMAIN
        assert not reply.rr
    # No IPv6 leaves such a desktop: no AAAA answer either.
    reply = ask(service, source, "allowed.test", "AAAA")
    assert (reply.header.rcode, reply.rr) == (RCODE.NOERROR, [])
    # A name that resolves into a private network is answered, and opens nothing.
    assert addresses(ask(service, source, "inside.allowed.test")) == ["10.1.2.3"]
    assert entries(vm) == {"203.0.113.10/32": ""}

    # Deny-all: no name at all.
    _, denied = provisioned(sim, pve, NetworkPolicy(allow_internet=False))
    assert ask(service, pve.config.address_of(denied.vmid), "allowed.test").header.rcode == RCODE.NXDOMAIN
    assert entries(denied) == {}


def test_queries_from_no_desktop_or_another_are_refused_or_kept_to_their_own(sim, world):
    pve, service = world
    _, vm = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",)))
    _, other = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("github.com",)))
    free = max(sim.vms) + 7
    outsiders = (
        pve.config.address_of(free),  # an address of the desktops' network no VM has
        pve.config.address_of(TEMPLATE),  # a VM, but no desktop (the template)
        pve.config.gateway_address,
        "127.0.0.9",  # outside the desktops' network
    )
    for source in outsiders:
        for tcp in (False, True):
            reply = ask(service, source, "allowed.test", tcp=tcp)
            assert reply.header.rcode == RCODE.REFUSED, source
            assert not reply.rr
    # A VM that is no desktop of the engine's (no owner tag): refused too.
    stranger = sim.vms[other.vmid]
    tags = stranger.config["tags"]
    stranger.config["tags"] = "someone-else"
    try:
        assert ask(service, pve.config.address_of(stranger.vmid), "github.com").header.rcode == RCODE.REFUSED
    finally:
        stranger.config["tags"] = tags

    # One desktop's allowed names are its own: another asking for them gets nothing, and neither set
    # takes the other's answers.
    assert ask(service, pve.config.address_of(other.vmid), "allowed.test").header.rcode == RCODE.NXDOMAIN
    ask(service, pve.config.address_of(vm.vmid), "allowed.test")
    assert "203.0.113.11/32" in entries(vm)
    assert set(entries(other)) == {"203.0.113.20/32"}


def test_the_refresh_drops_answered_addresses_once_their_ttl_is_up(sim, world):
    pve, service = world
    key, vm = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",)))
    source = pve.config.address_of(vm.vmid)
    ask(service, source, "short.allowed.test")  # TTL 2 s
    ask(service, source, "allowed.test")  # TTL 120 s
    assert set(entries(vm)) == {"203.0.113.10/32", "203.0.113.11/32", "203.0.113.13/32"}
    assert pve.refresh_allowed_domains() == {}, "a refresh removed an address before its time"

    time.sleep(3.1)
    assert pve.maintenance() == {"allowed_domains": {key: ("203.0.113.10/32", "203.0.113.11/32")}}
    assert set(entries(vm)) == {"203.0.113.10/32", "203.0.113.11/32"}
    # Asked again, it is back.
    ask(service, source, "short.allowed.test")
    assert "203.0.113.13/32" in entries(vm)


def test_a_policy_change_forgets_what_the_former_names_opened(sim, world):
    pve, service = world
    key, vm = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",)))
    source = pve.config.address_of(vm.vmid)
    ask(service, source, "www.allowed.test")
    # The same policy again (a restart, a retried step): what was answered stays.
    pve.apply_network_policy(key, NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",)))
    assert set(entries(vm)) == {"203.0.113.10/32", "203.0.113.12/32"}

    pve.apply_network_policy(key, NetworkPolicy(allow_internet=False, allowed_domains=("*.github.com",)))
    assert entries(vm) == {}
    assert ask(service, source, "www.allowed.test").header.rcode == RCODE.NXDOMAIN
    assert entries(vm) == {}


def test_an_open_desktop_resolves_everything_and_its_dns_goes_to_the_resolver_alone(sim, world):
    pve, service = world
    _, vm = provisioned(sim, pve, NetworkPolicy())
    assert vm.config["nameserver"] == "127.0.0.1"
    reply = ask(service, pve.config.address_of(vm.vmid), "blocked.test")
    assert addresses(reply) == ["203.0.113.66"]
    assert entries(vm) == {}
    # DNS to our resolver first, then no DNS anywhere else, before any rule that lets packets out.
    out = [
        (r["action"], r.get("proto", ""), r.get("dport", ""), r.get("dest", ""))
        for r in vm.fw_rules
        if r["type"] == "out"
    ]
    assert out[:4] == [
        ("ACCEPT", "udp", "53", "127.0.0.1"),
        ("ACCEPT", "tcp", "53", "127.0.0.1"),
        ("DROP", "udp", "53", ""),
        ("DROP", "tcp", "53", ""),
    ]
    assert vm.fw_options["policy_out"] == "ACCEPT"


def test_without_an_upstream_answer_the_desktop_gets_a_failure_and_nothing_opens(sim, world):
    pve, service = world
    _, vm = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("*.github.com",)))
    # Where nothing listens: the port of a socket just closed.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    service.resolver.config = dataclasses.replace(
        pve.config, resolver_upstreams=(f"127.0.0.1:{port}",), resolver_upstream_timeout=0.5
    )
    assert ask(service, pve.config.address_of(vm.vmid), "api.github.com").header.rcode == RCODE.SERVFAIL
    assert entries(vm) == {}


def test_an_address_the_api_would_not_take_is_not_handed_out(sim, world):
    pve, service = world
    _, vm = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("*.github.com",)))
    sim.fail_request("POST", r"/ipset/lb-domains$", 500, "cluster not ready - no quorum?")
    reply = ask(service, pve.config.address_of(vm.vmid), "api.github.com")
    assert (reply.header.rcode, reply.rr) == (RCODE.SERVFAIL, [])
    assert entries(vm) == {}
    # The next query, once the API takes it, gets its answer.
    assert addresses(ask(service, pve.config.address_of(vm.vmid), "api.github.com")) == ["203.0.113.21"]


def test_an_address_removed_meanwhile_is_put_back_when_asked_again(sim, world):
    pve, service = world
    key, vm = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",)))
    source = pve.config.address_of(vm.vmid)
    service.resolver.config = dataclasses.replace(pve.config, resolver_policy_ttl=3600)
    ask(service, source, "short.allowed.test")  # TTL 2 s
    time.sleep(3.1)
    assert pve.refresh_allowed_domains() == {key: ("203.0.113.10/32",)}
    # The resolver still believes it there, its time up: renewing finds it gone and adds it again.
    assert addresses(ask(service, source, "short.allowed.test")) == ["203.0.113.13"]
    assert "203.0.113.13/32" in entries(vm)


def test_without_a_resolver_a_wildcard_is_refused_with_the_reason(sim):
    pve = driver_for(sim, resolve=Dns())
    spec = make_spec()
    pve.provision(spec)
    with pytest.raises(
        DriverError, match=r"'\*\.github\.com' is a wildcard: it needs the desktops' resolver"
    ):
        pve.apply_network_policy(
            spec.key, NetworkPolicy(allow_internet=False, allowed_domains=("*.github.com",))
        )
    assert "nameserver" not in sim.vms[max(sim.vms)].config


def service_env(sim, **values: str) -> dict[str, str]:
    user, token_name, secret = sim.token
    return {
        **os.environ,
        "PROXMOX_HOST": sim.host,
        "PROXMOX_TOKEN_USER": user,
        "PROXMOX_TOKEN_NAME": token_name,
        "PROXMOX_TOKEN_SECRET": secret,
        "PROXMOX_VERIFY_SSL": str(sim.ca_path),
        "PROXMOX_CONTROL_CIDRS": CONTROL_CIDR,
        "PROXMOX_SUBNET": SUBNET,
        **values,
    }


def test_the_resolver_runs_as_the_procfiles_process(sim, upstream):
    """`make run` starts it as `dns`; it answers on UDP and TCP until told to stop."""
    command = next(line for line in Path("Procfile").read_text().splitlines() if line.startswith("dns:"))
    argv = [sys.executable, *command.split()[2:]]
    assert argv[1:] == ["-m", "workers.drivers.proxmox.resolver"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = service_env(
        sim,
        PROXMOX_RESOLVER_ADDRESS="127.0.0.1",
        PROXMOX_RESOLVER_LISTEN=f"127.0.0.1:{port}",
        PROXMOX_RESOLVER_UPSTREAMS=upstream,
    )
    pve = driver_for(sim, resolve=Dns(), subnet=SUBNET, resolver_address="127.0.0.1")
    _, vm = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("*.github.com",)))
    service = SimpleNamespace(address=("127.0.0.1", port))
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                reply = ask(service, pve.config.address_of(vm.vmid), "api.github.com", tcp=True)
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "the resolver did not start"
                time.sleep(0.2)
        assert addresses(reply) == ["203.0.113.21"]
        assert addresses(ask(service, pve.config.address_of(vm.vmid), "api.github.com")) == ["203.0.113.21"]
        assert "203.0.113.21/32" in entries(vm)
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=10)
    assert process.returncode == 0, output
    assert f"answers on 127.0.0.1:{port}" in output


def test_without_its_address_the_resolvers_process_idles(sim):
    """Off on an engine without it (the LXC one's hosts), yet running: `make run` stops every process
    once one ends."""
    env = service_env(sim, PROXMOX_RESOLVER_ADDRESS="")
    argv = [sys.executable, "-m", "workers.drivers.proxmox.resolver"]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(1.5)
        assert process.poll() is None
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=10)
    assert "the Proxmox desktops' resolver is off" in output


def test_a_silent_tcp_connection_holds_up_no_one_and_is_closed(sim, world, monkeypatch):
    monkeypatch.setattr("workers.drivers.proxmox.resolver.TCP_IDLE", 0.5)
    pve, service = world
    _, vm = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",)))
    source = pve.config.address_of(vm.vmid)
    with socket.create_connection(service.address, timeout=5, source_address=(source, 0)) as silent:
        assert addresses(ask(service, source, "allowed.test", tcp=True)) == ["203.0.113.11"]
        assert silent.recv(1) == b"", "the resolver kept a silent connection open"


def test_a_vm_made_before_the_resolver_gets_it_as_nameserver_with_its_next_policy(sim, world):
    pve, _ = world
    before = driver_for(sim, resolve=Dns(), subnet=SUBNET)
    spec = make_spec()
    vm = sim.vms[int(before.provision(spec).ref)]
    assert "nameserver" not in vm.config
    pve.apply_network_policy(spec.key, NetworkPolicy(allow_internet=False, allowed_domains=("*.github.com",)))
    assert vm.config["nameserver"] == "127.0.0.1"
    writes = len(sim.requests)
    pve.apply_network_policy(spec.key, NetworkPolicy(allow_internet=False, allowed_domains=("*.github.com",)))
    assert not [
        r for r in sim.requests[writes:] if r[:2] == ("PUT", f"/nodes/{vm.node}/qemu/{vm.vmid}/config")
    ]


# One resolver serves every tenant: what one VM asks is bounded


def test_a_vm_flooding_the_resolver_is_refused_past_its_rate_and_another_is_still_answered(sim, upstream):
    dns = Dns({"allowed.test": ("203.0.113.10",)})
    with resolver_world(sim, upstream, dns, resolver_queries_per_second=5) as (pve, service):
        policy = NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",))
        (_, flooder), (_, other) = provisioned(sim, pve, policy), provisioned(sim, pve, policy)
        codes = [
            ask(service, pve.config.address_of(flooder.vmid), "allowed.test").header.rcode for _ in range(40)
        ]
        # The burst (twice the rate) and what the rate adds meanwhile; then refused, not answered.
        assert 10 <= codes.count(RCODE.NOERROR) <= 15 and codes.count(RCODE.REFUSED) >= 25, codes
        assert addresses(ask(service, pve.config.address_of(other.vmid), "allowed.test")) == ["203.0.113.11"]


def test_a_wildcards_names_cannot_grow_a_vms_set_without_end(sim, upstream):
    """Each new address of a wildcard's names was one more entry (and one more API write), for ever."""
    with resolver_world(sim, upstream, Dns({}), resolver_max_addresses=1) as (pve, service):
        _, vm = provisioned(
            sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("*.allowed.test",))
        )
        source = pve.config.address_of(vm.vmid)
        assert addresses(ask(service, source, "www.allowed.test")) == ["203.0.113.12"]
        assert ask(service, source, "short.allowed.test").header.rcode == RCODE.SERVFAIL
        assert set(entries(vm)) == {"203.0.113.12/32"}


def test_silent_connections_hold_a_bounded_number_of_the_resolvers_threads(sim, upstream, monkeypatch):
    """dnslib's servers start a thread for every query, so silent TCP connections were a thread each."""
    monkeypatch.setattr("workers.drivers.proxmox.resolver.TCP_IDLE", 3)
    dns = Dns({"allowed.test": ("203.0.113.10",)})
    with resolver_world(sim, upstream, dns, resolver_threads=2) as (pve, service):
        _, vm = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",)))
        source = pve.config.address_of(vm.vmid)
        before = threading.active_count()
        silent = [socket.create_connection(service.address, timeout=5) for _ in range(20)]
        try:
            time.sleep(0.5)
            assert threading.active_count() - before <= 2
            # Over UDP, the desktop is still answered (the TCP threads are all taken).
            assert addresses(ask(service, source, "allowed.test")) == ["203.0.113.11"]
        finally:
            for connection in silent:
                connection.close()
