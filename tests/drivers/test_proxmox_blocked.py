"""What a Proxmox desktop was refused: the names the desktops' resolver refused it (real DNS packets on
loopback, as in ``test_proxmox_resolver``) and the packets its VM firewall dropped (the simulator's
firewall log, written as PVE writes it), as ``blocked_egress`` reports them."""

from __future__ import annotations

import dataclasses
import time

import pytest
from dnslib import RCODE

from desktops.egress_blocked import blocked_attempts_of, blocked_attempts_record
from desktops.engines import engine
from tests.drivers.test_proxmox_domains import Dns
from tests.drivers.test_proxmox_resolver import (  # noqa: F401 (upstream: a fixture)
    ask,
    provisioned,
    resolver_world,
    service_env,
    upstream,
)
from tests.factories import DesktopFactory
from tests.pve.support import driver_for, make_spec, needs_schema
from workers.drivers.base import BlockedEgress, NetworkPolicy
from workers.drivers.proxmox import blocked

pytestmark = needs_schema

ALLOW_LIST = NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",))


@pytest.fixture
def world(sim, upstream):  # noqa: F811 (the fixture imported above)
    dns = Dns({"allowed.test": ("203.0.113.10",)})
    with resolver_world(sim, upstream, dns, resolver_refused_interval=0.0) as found:
        yield found


def eventually(check, seconds: float = 5.0):
    """The refused names are written in the background: what ``check`` returns once it is truthy."""
    deadline = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < deadline, "not recorded in time"
        time.sleep(0.02)
    return found


def test_a_refused_name_is_reported_for_its_vm_and_not_another(sim, world):
    pve, service = world
    key, vm = provisioned(sim, pve, ALLOW_LIST)
    other_key, other = provisioned(sim, pve, ALLOW_LIST)
    source = pve.config.address_of(vm.vmid)
    for name, tcp in (("blocked.test", False), ("Blocked.Test", True), ("elsewhere.test", False)):
        assert ask(service, source, name, tcp=tcp).header.rcode == RCODE.NXDOMAIN
    # Allowed names are no blocked attempt.
    assert ask(service, source, "allowed.test").header.rcode == RCODE.NOERROR

    def refused(total: int) -> tuple:
        names = pve.blocked_egress(key).names
        return names if sum(n for _, n in names) == total else ()

    # Each name with its look-ups (their order, the latest first, below: these may share a second).
    assert sorted(eventually(lambda: refused(3))) == [("blocked.test", 2), ("elsewhere.test", 1)]
    assert pve.blocked_egress(other_key) == BlockedEgress(names=(), addresses=())
    # Kept on the VM's own firewall, which no rule uses: the workers read it on any host.
    record = vm.ipset_comments[blocked.REFUSED]
    assert record.startswith("lebureau refused since ") and vm.ipsets[blocked.REFUSED] == []
    assert not [r for r in vm.fw_rules if blocked.REFUSED in r.get("dest", "") + r.get("source", "")]
    assert blocked.refused_record(other.ipset_comments[blocked.REFUSED])[1] == []

    # Counted on: the same name again adds to its count, and is the latest.
    time.sleep(1.1)
    ask(service, source, "blocked.test")
    assert eventually(lambda: refused(4)) == (("blocked.test", 3), ("elsewhere.test", 1))
    # A policy applied again leaves the record alone.
    pve.apply_network_policy(key, ALLOW_LIST)
    assert pve.blocked_egress(key).names == (("blocked.test", 3), ("elsewhere.test", 1))


def test_a_desktop_cannot_forge_its_record_with_the_names_it_asks(sim, world):
    """The attack: root in the VM asks for names shaped like the record's entries, to inflate or fake
    its counts; they are kept as plain names, each counted once."""
    pve, service = world
    key, vm = provisioned(sim, pve, ALLOW_LIST)
    source = pve.config.address_of(vm.vmid)
    ask(service, source, "blocked.test")
    assert eventually(lambda: pve.blocked_egress(key).names) == (("blocked.test", 1),)
    time.sleep(1.1)
    ask(service, source, "blocked.test=999@9999999999")
    ask(service, source, "x y.test")  # the space comes escaped: "x\\032y.test"

    def names():
        found = pve.blocked_egress(key).names
        return found if len(found) == 3 else ()

    found = eventually(names)
    assert sorted(found[:2]) == [("blocked.test?999?9999999999", 1), ("x?032y.test", 1)]
    assert found[2] == ("blocked.test", 1)


def test_an_open_desktops_unknown_name_is_no_blocked_attempt(sim, world):
    pve, service = world
    key, vm = provisioned(sim, pve, NetworkPolicy())
    assert ask(service, pve.config.address_of(vm.vmid), "nowhere.test").header.rcode == RCODE.NXDOMAIN
    # Its answer came from upstream: nothing refused it, nothing to write.
    time.sleep(0.3)
    assert pve.blocked_egress(key).names == ()


def test_a_burst_of_refused_names_costs_few_writes_and_all_are_counted(sim, world):
    pve, service = world
    key, vm = provisioned(sim, pve, ALLOW_LIST)
    service.resolver.config = dataclasses.replace(pve.config, resolver_refused_interval=1.0)
    source = pve.config.address_of(vm.vmid)
    writes = len(sim.requests)
    for _ in range(20):
        ask(service, source, "blocked.test")
    assert eventually(lambda: dict(pve.blocked_egress(key).names).get("blocked.test") == 20, seconds=5)
    posts = [r for r in sim.requests[writes:] if r[0] == "POST" and r[1].endswith("/firewall/ipset")]
    assert 1 <= len(posts) <= 3


def test_what_waits_its_turn_is_written_when_the_resolver_stops(sim, world):
    pve, service = world
    key, vm = provisioned(sim, pve, ALLOW_LIST)
    service.resolver.config = dataclasses.replace(pve.config, resolver_refused_interval=3600)
    source = pve.config.address_of(vm.vmid)
    ask(service, source, "blocked.test")
    assert eventually(lambda: pve.blocked_egress(key).names) == (("blocked.test", 1),)
    ask(service, source, "blocked.test")
    time.sleep(0.3)
    assert pve.blocked_egress(key).names == (("blocked.test", 1),), "written before its turn"
    service.resolver.flush()  # as the service's stop does
    assert pve.blocked_egress(key).names == (("blocked.test", 2),)


def test_a_write_the_api_refused_is_counted_with_the_next_one(sim, world):
    pve, service = world
    key, vm = provisioned(sim, pve, ALLOW_LIST)
    source = pve.config.address_of(vm.vmid)
    sim.fail_request("POST", r"/firewall/ipset$", 500, "cluster not ready - no quorum?")
    before = len(sim.requests)
    ask(service, source, "blocked.test")
    eventually(
        lambda: [r for r in sim.requests[before:] if r[0] == "POST" and r[1].endswith("/firewall/ipset")]
    )
    time.sleep(0.2)  # the failed write's names put back
    assert pve.blocked_egress(key).names == ()
    ask(service, source, "blocked.test")
    assert eventually(lambda: pve.blocked_egress(key).names) == (("blocked.test", 2),)


def test_a_desktop_whose_firewall_predates_the_record_gets_one(sim, world):
    pve, service = world
    key, vm = provisioned(sim, pve, ALLOW_LIST)
    del vm.ipsets[blocked.REFUSED], vm.ipset_comments[blocked.REFUSED]
    assert pve.blocked_egress(key) == BlockedEgress(names=(), addresses=())
    ask(service, pve.config.address_of(vm.vmid), "blocked.test")
    assert eventually(lambda: pve.blocked_egress(key).names) == (("blocked.test", 1),)
    assert vm.ipset_comments[blocked.REFUSED].startswith("lebureau refused since 0: blocked.test=1@")


def test_dropped_packets_are_counted_per_destination_from_the_firewall_log(sim):
    pve = driver_for(sim, resolve=Dns({"allowed.test": ("203.0.113.10",)}))
    key, vm = provisioned(sim, pve, ALLOW_LIST)
    other_key, other = provisioned(sim, pve, ALLOW_LIST)
    # The firewall logs what it drops on the way out: by its policy, and by its DROP rules.
    assert vm.fw_options["log_level_out"] == "info"
    assert all(r.get("log") == "info" for r in vm.fw_rules if (r["type"], r["action"]) == ("out", "DROP"))

    now = time.time()
    for made in (vm, other):  # ten minutes ago: the log's lines since are theirs
        made.ipset_comments[blocked.REFUSED] = blocked.refused_comment(int(now) - 600, ())
    assert sim.drop_outbound(vm.vmid, "198.51.100.7", at=now - 120)
    for seconds_ago in (30, 20, 10):
        assert sim.drop_outbound(vm.vmid, "203.0.113.66", at=now - seconds_ago)
    assert sim.drop_outbound(vm.vmid, "10.1.2.3", rule_dest="+lb-private", at=now - 60)
    assert sim.drop_outbound(other.vmid, "203.0.113.99", at=now - 5)
    # What is no outbound drop of the VM's: the logger's own lines, what its firewall dropped coming in.
    dropped_for_other = sim.firewall_logs[vm.node][-1]
    _, rest = dropped_for_other.split(" ", 1)
    sim.log_firewall(vm.node, f"{vm.vmid} " + rest.replace(f"tap{other.vmid}i0-OUT", f"tap{vm.vmid}i0-IN"))
    sim.log_firewall(vm.node, "0 5 - 02/Dec/2026:00:00:01 +0000 starting pvefw logger")

    found = pve.blocked_egress(key)
    assert [(b.address, b.packets) for b in found.addresses] == [
        ("203.0.113.66", 3),
        ("10.1.2.3", 1),
        ("198.51.100.7", 1),
    ]
    assert 9 <= found.addresses[0].seconds_ago <= 15
    assert 115 <= found.addresses[2].seconds_ago <= 125
    assert [(b.address, b.packets) for b in pve.blocked_egress(other_key).addresses] == [("203.0.113.99", 1)]
    # PVE's own log line format, as its logger writes it.
    line = next(line for line in sim.firewall_logs[vm.node] if line.startswith(f"{vm.vmid} "))
    assert line.split()[1:3] == ["6", f"tap{vm.vmid}i0-OUT"]


def test_a_reused_vmid_does_not_inherit_the_former_vms_drops(sim):
    pve = driver_for(sim, resolve=Dns({"allowed.test": ("203.0.113.10",)}))
    key, vm = provisioned(sim, pve, ALLOW_LIST)
    sim.drop_outbound(vm.vmid, "203.0.113.66", at=time.time() - 5)
    pve.stop(key)
    pve.destroy(key)
    time.sleep(1.1)  # the log's times are in seconds
    spec = make_spec()
    again = sim.vms[int(pve.provision(spec).ref)]
    assert again.vmid == vm.vmid
    pve.apply_network_policy(spec.key, ALLOW_LIST)
    assert pve.blocked_egress(spec.key) == BlockedEgress(names=(), addresses=())
    sim.drop_outbound(again.vmid, "198.51.100.7")
    assert [b.address for b in pve.blocked_egress(spec.key).addresses] == ["198.51.100.7"]


def test_the_log_is_read_to_its_end_page_by_page(sim, monkeypatch):
    monkeypatch.setattr(blocked, "LOG_PAGE", 2)
    pve = driver_for(sim, resolve=Dns({"allowed.test": ("203.0.113.10",)}))
    key, vm = provisioned(sim, pve, ALLOW_LIST)
    for i in range(5):
        sim.drop_outbound(vm.vmid, f"203.0.113.{i % 2 + 1}")
    assert {b.address: b.packets for b in pve.blocked_egress(key).addresses} == {
        "203.0.113.1": 3,
        "203.0.113.2": 2,
    }
    reads = [p for m, path, p in sim.requests if path.endswith("/firewall/log")]
    assert [(p["start"], p["limit"]) for p in reads] == [("0", "2"), ("2", "2"), ("4", "2")]


@pytest.mark.django_db
def test_the_domain_counts_a_proxmox_desktops_blocked_attempts_per_destination(sim, world, monkeypatch):
    """What the alerts' evaluation does for every running desktop, here on the Proxmox engine."""
    pve, service = world
    for name, value in service_env(sim, PROXMOX_RESOLVER_ADDRESS="127.0.0.1").items():
        monkeypatch.setenv(name, value)
    engine.cache_clear()
    try:
        desktop = DesktopFactory(driver="proxmox")
        spec = make_spec(key=desktop.id, hostname=desktop.id)
        vm = sim.vms[int(pve.provision(spec).ref)]
        pve.apply_network_policy(spec.key, ALLOW_LIST)
        assert blocked_attempts_record(desktop) == 0

        ask(service, pve.config.address_of(vm.vmid), "blocked.test")
        eventually(lambda: pve.blocked_egress(spec.key).names)
        sim.drop_outbound(vm.vmid, "203.0.113.66")
        sim.drop_outbound(vm.vmid, "203.0.113.66")
        assert blocked_attempts_record(desktop) == 3
        sim.drop_outbound(vm.vmid, "203.0.113.66")
        assert blocked_attempts_record(desktop) == 1
        counts = {(b.via, b.destination): b.attempts for b in blocked_attempts_of(desktop=desktop)}
        assert counts == {("name", "blocked.test"): 1, ("address", "203.0.113.66"): 3}
    finally:
        engine.cache_clear()


def test_a_desktop_with_nothing_blocked_reports_empty_lists_and_an_unknown_one_none(sim):
    pve = driver_for(sim, resolve=Dns())
    spec = make_spec()
    pve.provision(spec)
    assert pve.blocked_egress(spec.key) == BlockedEgress(names=(), addresses=())
    assert pve.blocked_egress("dsk_nosuchdesktop") is None


def test_the_record_keeps_the_latest_names_and_plain_ones_only():
    refused = {f"n{i}.test": (1, 1000 + i) for i in range(blocked.REFUSED_KEPT + 5)}
    names = blocked.recorded([], refused)
    assert len(names) == blocked.REFUSED_KEPT and names[0].name == f"n{blocked.REFUSED_KEPT + 4}.test"
    comment = blocked.refused_comment(1700000000, names)
    assert blocked.refused_record(comment) == (1700000000, names)
    assert blocked.refused_record("lebureau domains: allowed.test") is None
    assert blocked.clean_name("Evil name=1@2 x\nlebureau") == "evil?name?1?2?x?lebureau"
    assert len(blocked.clean_name("a" * 300)) == blocked.NAME_MAX
