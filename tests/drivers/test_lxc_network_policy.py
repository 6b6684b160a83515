"""What the LXC engine's network policy refuses before touching the host, and what its resolvers are told."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.drivers.base import DriverError, NetworkPolicy
from workers.drivers.lxc import LxcConfig, LxcDriver
from workers.drivers.lxc.resolver import LOG, refused_names, render_conf, trim_log


@pytest.fixture
def lxc(tmp_path):
    return LxcDriver(
        LxcConfig(
            state_dir=tmp_path / "state",
            lxc_path=tmp_path / "lxc",
            lock_dir=tmp_path / "locks",
            upstream_dns=("192.0.2.53",),
        )
    )


@pytest.mark.parametrize(
    "domain",
    [
        "evil.example/#/192.0.2.1",  # would answer every name with an address of the attacker's
        "ok.example\nserver=192.0.2.1",  # would add a line to the resolver's configuration
        "ok.example/4#inet#filter#input",
        "not a name",
        "*.*.example.org",
    ],
)
def test_a_name_that_could_rewrite_the_resolvers_configuration_is_refused(lxc, domain):
    with pytest.raises(DriverError, match="is not a domain name"):
        lxc.apply_network_policy("dsk_any", NetworkPolicy(allow_internet=False, allowed_domains=(domain,)))


def conf(**policy) -> str:
    fields = {"allow_internet": False, "domains": ()} | policy
    return render_conf(
        listen="10.9.0.1",
        port=30005,
        upstreams=("192.0.2.53", "198.51.100.53"),
        nftset="inet#lebureau_dns#allow_lbv1",
        pid_file=Path("/run/x.pid"),
        log_file=Path("/run/x.log"),
        **fields,
    )


def test_an_open_desktops_resolver_forwards_every_name():
    lines = conf(allow_internet=True).splitlines()
    assert "server=192.0.2.53" in lines and "server=198.51.100.53" in lines
    assert not any(line.startswith(("address=", "nftset=")) for line in lines)


def test_an_allow_list_forwards_only_its_names_and_puts_their_addresses_in_the_desktops_set():
    lines = conf(domains=("allowed.test", "*.github.com")).splitlines()
    assert "address=/#/" in lines  # every other name: no such domain
    assert "server=/allowed.test/*.github.com/192.0.2.53" in lines
    assert "nftset=/allowed.test/*.github.com/4#inet#lebureau_dns#allow_lbv1" in lines
    assert not any(line.startswith("server=1") for line in lines)


def test_deny_all_answers_no_name():
    lines = conf().splitlines()
    assert "address=/#/" in lines
    assert not any(line.startswith(("server=", "nftset=")) for line in lines)


LOG_LINES = """Dec  1 13:20:30 dnsmasq[27512]: started, version 2.90 cache disabled
Dec  1 13:20:31 dnsmasq[27512]: query[A] blocked.test from 10.9.0.5
Dec  1 13:20:31 dnsmasq[27512]: config blocked.test is NXDOMAIN
Dec  1 13:20:31 dnsmasq[27512]: query[AAAA] blocked.test from 10.9.0.5
Dec  1 13:20:31 dnsmasq[27512]: config blocked.test is NXDOMAIN
Dec  1 13:20:31 dnsmasq[27512]: query[A] allowed.test from 10.9.0.5
Dec  1 13:20:31 dnsmasq[27512]: forwarded allowed.test to 192.0.2.53
Dec  1 13:20:31 dnsmasq[27512]: reply allowed.test is 203.0.113.80
Dec  1 13:20:32 dnsmasq[27512]: query[A] exfil.example.org from 10.9.0.5
Dec  1 13:20:32 dnsmasq[27512]: config exfil.example.org is NXDOMAIN
Dec  1 13:20:33 dnsmasq[27512]: query[A] blocked.test from 10.9.0.5
Dec  1 13:20:33 dnsmasq[27512]: config blocked.test is NXDOMAIN
"""


def test_the_names_a_resolver_refused_are_counted_once_per_look_up_the_latest_first(tmp_path):
    (tmp_path / LOG).write_text(LOG_LINES)
    assert refused_names(tmp_path) == [("blocked.test", 2), ("exfil.example.org", 1)]
    assert refused_names(tmp_path / "none") == []


def test_a_long_resolver_log_keeps_its_end(tmp_path, monkeypatch):
    monkeypatch.setattr("workers.drivers.lxc.resolver.LOG_KEPT", len(LOG_LINES))
    (tmp_path / LOG).write_text("x" * 5 * len(LOG_LINES) + LOG_LINES)
    trim_log(tmp_path)
    assert (tmp_path / LOG).read_text() == LOG_LINES
