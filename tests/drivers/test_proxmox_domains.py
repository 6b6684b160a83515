"""Allowed domains: resolved into a VM firewall IP set, kept fresh by the periodic refresh."""

from __future__ import annotations

import socket

import pytest

from tests.pve.support import driver_for, make_spec, needs_schema
from workers.drivers.base import DriverError, NetworkPolicy, TransientDriverError

pytestmark = needs_schema


class Dns:
    """A resolver with answers the test sets; a name it does not know fails like an unknown name."""

    def __init__(self, answers: dict[str, tuple[str, ...]] | None = None):
        self.answers = answers or {}
        self.failing: int | None = None

    def __call__(self, domain: str) -> tuple[str, ...]:
        if self.failing is not None:
            raise socket.gaierror(self.failing, "lookup failed")
        if domain not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.answers[domain]


def provisioned(sim, pve, policy: NetworkPolicy | None = None):
    spec = make_spec()
    vm = sim.vms[int(pve.provision(spec).ref)]
    if policy is not None:
        pve.apply_network_policy(spec.key, policy)
    return spec.key, vm


def cidrs(vm) -> list[str]:
    return sorted(e["cidr"] for e in vm.ipsets["lb-domains"])


def rules_out(vm) -> list[tuple[str, str]]:
    return [(r["action"], r["dest"]) for r in vm.fw_rules if r["type"] == "out" and r.get("dest")]


def test_a_domain_is_allowed_by_its_addresses_from_the_system_resolver(sim):
    pve = driver_for(sim)
    _, vm = provisioned(sim, pve, NetworkPolicy(allow_internet=False, allowed_domains=("LocalHost.",)))
    assert vm.ipsets["lb-domains"] == [{"cidr": "127.0.0.1/32"}]
    assert vm.ipset_comments["lb-domains"] == "lebureau domains: localhost"
    assert rules_out(vm) == [("DROP", "+lb-control"), ("DROP", "+lb-private"), ("ACCEPT", "+lb-domains")]
    assert vm.fw_options["policy_out"] == "DROP"


def test_the_refresh_adds_new_addresses_and_removes_stale_ones(sim):
    dns = Dns({"api.example.com": ("203.0.113.10", "203.0.113.11"), "cdn.example.net": ("198.51.100.7",)})
    pve = driver_for(sim, resolve=dns)
    both, vm = provisioned(sim, pve, NetworkPolicy(allowed_domains=("api.example.com", "cdn.example.net")))
    one, other_vm = provisioned(sim, pve, NetworkPolicy(allowed_domains=("cdn.example.net",)))
    _, plain_vm = provisioned(sim, pve)
    assert cidrs(vm) == ["198.51.100.7/32", "203.0.113.10/32", "203.0.113.11/32"]
    writes = len(sim.requests)
    assert pve.refresh_allowed_domains() == {}
    assert not [r for r in sim.requests[writes:] if r[0] != "GET"], "an unchanged answer rewrote a set"

    dns.answers["api.example.com"] = ("203.0.113.11", "203.0.113.12")
    dns.answers["cdn.example.net"] = ("198.51.100.7", "198.51.100.7")
    assert pve.refresh_allowed_domains() == {both: ("198.51.100.7/32", "203.0.113.11/32", "203.0.113.12/32")}
    assert cidrs(vm) == ["198.51.100.7/32", "203.0.113.11/32", "203.0.113.12/32"]
    assert cidrs(other_vm) == ["198.51.100.7/32"]
    assert cidrs(plain_vm) == []

    dns.answers["cdn.example.net"] = ("198.51.100.8",)
    assert set(pve.refresh_allowed_domains()) == {both, one}
    assert cidrs(other_vm) == ["198.51.100.8/32"]


def test_a_failed_lookup_leaves_the_set_as_it_was(sim):
    dns = Dns({"api.example.com": ("203.0.113.10",)})
    pve = driver_for(sim, resolve=dns)
    _, vm = provisioned(sim, pve, NetworkPolicy(allowed_domains=("api.example.com",)))
    dns.failing = socket.EAI_AGAIN
    assert pve.refresh_allowed_domains() == {}
    assert vm.ipsets["lb-domains"] == [{"cidr": "203.0.113.10/32"}]


def test_a_policy_without_domains_empties_the_set_and_the_refresh_leaves_it_alone(sim):
    dns = Dns({"api.example.com": ("203.0.113.10",)})
    pve = driver_for(sim, resolve=dns)
    key, vm = provisioned(sim, pve, NetworkPolicy(allowed_domains=("api.example.com",)))
    pve.apply_network_policy(key, NetworkPolicy(allowed_cidrs=("192.0.2.0/24",)))
    assert vm.ipsets["lb-domains"] == []
    assert vm.ipset_comments["lb-domains"] == "lebureau domains:"
    assert ("ACCEPT", "+lb-domains") not in rules_out(vm)
    assert pve.refresh_allowed_domains() == {}
    assert vm.ipsets["lb-domains"] == []


def test_bad_or_unknown_domains_are_refused_and_a_dns_outage_is_transient(sim):
    dns = Dns()
    pve = driver_for(sim, resolve=dns)
    key, vm = provisioned(sim, pve)
    with pytest.raises(DriverError, match="is not a domain name"):
        pve.apply_network_policy(key, NetworkPolicy(allowed_domains=("not a name",)))
    with pytest.raises(DriverError, match=r"'nowhere\.invalid' does not resolve") as raised:
        pve.apply_network_policy(key, NetworkPolicy(allowed_domains=("nowhere.invalid",)))
    assert not raised.value.transient
    dns.failing = socket.EAI_AGAIN
    with pytest.raises(TransientDriverError, match="does not resolve"):
        pve.apply_network_policy(key, NetworkPolicy(allowed_domains=("api.example.com",)))
    assert vm.ipsets["lb-domains"] == []


def test_the_engines_maintenance_refreshes_the_domains_once_per_interval(sim, settings):
    assert settings.CELERY_BEAT_SCHEDULE["engine-maintenance"]["task"] == "workers.tasks.engine_maintenance"
    dns = Dns({"api.example.com": ("203.0.113.10",)})
    pve = driver_for(sim, resolve=dns, domain_refresh_interval=3600)
    key, vm = provisioned(sim, pve, NetworkPolicy(allowed_domains=("api.example.com",)))
    dns.answers["api.example.com"] = ("203.0.113.20",)
    assert pve.maintenance() == {"allowed_domains": {key: ("203.0.113.20/32",)}}
    dns.answers["api.example.com"] = ("203.0.113.30",)
    assert pve.maintenance() == {}, "refreshed again before its interval had passed"
    assert cidrs(vm) == ["203.0.113.20/32"]
