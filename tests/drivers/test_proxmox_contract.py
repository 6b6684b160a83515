"""The Proxmox driver against the contract suite, over HTTPS to the PVE simulator."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import pytest
from proxmoxer import ResourceException

from tests.drivers.contract import DriverContract
from tests.pve.support import (
    CONTROL_CIDR,
    SCHEMA_VERSIONS,
    SSH_KEY,
    TEMPLATE,
    control_plane,
    driver_for,
    make_spec,
    needs_schema,
    simulator,
)
from workers.drivers.base import DriverError, InstanceState, NetworkPolicy
from workers.drivers.proxmox import ProxmoxDriver

pytestmark = needs_schema


@pytest.fixture(params=SCHEMA_VERSIONS)
def sim(request):
    sim = simulator(version=request.param)
    yield sim
    sim.stop()


@pytest.fixture
def pve(sim):
    return driver_for(sim)


class TestProxmoxDriver(DriverContract):
    @pytest.fixture
    def driver(self, pve):
        return pve

    @pytest.fixture
    def spec(self):
        return make_spec()


def test_provision_builds_the_vm_as_planned(sim, pve):
    spec = make_spec(vcpus=2, memory_mib=2048, disk_gib=20)
    status = pve.provision(spec)
    vm = sim.vms[int(status.ref)]
    config = vm.config
    assert config["name"] == spec.key.replace("_", "-")
    assert config["tags"] == f"lebureau;{spec.key}"
    assert (config["cores"], config["memory"]) == ("2", "2048")
    assert "size=20G" in config["scsi0"] and f"vm-{vm.vmid}-disk" in config["scsi0"]
    assert config["net0"] == "virtio,bridge=vmbr0,firewall=1"
    # The control plane gives the VM its address (the network's plus the VMID) and pins it.
    address = f"10.80.{vm.vmid // 256}.{vm.vmid % 256}"
    assert config["ciuser"] == "agent" and config["ipconfig0"] == f"ip={address}/16,gw=10.80.0.1"
    assert status.private_ip == address
    assert config["sshkeys"] == SSH_KEY.replace(" ", "%20")
    # The firewall was closed before the first boot, and the SSH step got the VM's address.
    assert vm.fw_options["enable"] == "1" and vm.fw_options["policy_in"] == "DROP"
    assert vm.fw_options["ipfilter"] == "1" and [e["cidr"] for e in vm.ipsets["ipfilter-net0"]] == [
        f"{address}/32"
    ]
    assert pve.guest_setup.calls == [(spec.key, status.private_ip, spec.files)]
    # A linked clone of the template, with every boolean sent as 1/0.
    clone = next(p for m, path, p in sim.requests if path.endswith(f"/qemu/{TEMPLATE}/clone"))
    assert clone["full"] == "0"
    pve.destroy(spec.key)
    destroy_params = next(p for m, path, p in sim.requests if m == "DELETE" and path.endswith(f"/{vm.vmid}"))
    assert destroy_params["purge"] == "1" and destroy_params["destroy-unreferenced-disks"] == "1"


def test_full_clone_when_configured(sim):
    pve = driver_for(sim, full_clone=True, clone_storage="local-lvm")
    pve.provision(make_spec())
    clone = next(p for m, path, p in sim.requests if path.endswith("/clone"))
    assert (clone["full"], clone["storage"]) == ("1", "local-lvm")


def test_network_policy_renders_the_vm_firewall(sim, pve):
    spec = make_spec()
    vm = sim.vms[int(pve.provision(spec).ref)]
    pve.apply_network_policy(spec.key, NetworkPolicy(allow_internet=False, allowed_cidrs=("203.0.113.7",)))
    assert vm.fw_options["policy_out"] == "DROP"
    assert vm.ipsets["lb-allowed"] == [{"cidr": "203.0.113.7/32"}]
    assert vm.ipsets["lb-control"] == [{"cidr": CONTROL_CIDR}]
    rules = [
        (r["type"], r["action"], r.get("dport", ""), r.get("source") or r.get("dest")) for r in vm.fw_rules
    ]
    # Private and link-local networks are dropped before anything allowed is accepted; the control
    # plane's own ports are not open to desktops.
    assert rules == [
        ("in", "ACCEPT", "22", "+lb-control"),
        ("in", "ACCEPT", "5900", "+lb-control"),
        ("out", "DROP", "", "+lb-control"),
        ("out", "DROP", "", "+lb-private"),
        ("out", "ACCEPT", "", "+lb-allowed"),
    ]
    private = [e["cidr"] for e in vm.ipsets["lb-private"]]
    assert {"169.254.0.0/16", "10.0.0.0/8", "fc00::/7", "fe80::/10"} <= set(private)
    pve.apply_network_policy(spec.key, NetworkPolicy())
    assert vm.fw_options["policy_out"] == "ACCEPT"
    assert vm.ipsets["lb-allowed"] == []
    assert [r["action"] for r in vm.fw_rules] == ["ACCEPT", "ACCEPT", "DROP", "DROP"]
    writes = len(sim.requests)
    pve.apply_network_policy(spec.key, NetworkPolicy())
    assert not [r for r in sim.requests[writes:] if r[0] in ("POST", "DELETE")], "an unchanged policy rewrote"


def test_a_desktop_reaches_the_guest_endpoint_and_nothing_else_of_the_control_plane(sim):
    """The attack: an open policy, a control plane on a public address, and a desktop trying its pages."""
    pve = driver_for(sim, control_cidrs=("198.51.100.10",), control_tcp_ports=(8001,))
    spec = make_spec()
    vm = sim.vms[int(pve.provision(spec).ref)]
    pve.apply_network_policy(spec.key, NetworkPolicy(allow_internet=True))
    out = [(r["action"], r.get("dport", ""), r.get("dest", "")) for r in vm.fw_rules if r["type"] == "out"]
    # PVE takes the first rule that matches: the guest endpoint's port, then nothing else of the
    # control plane, before the open policy lets the rest of the internet through.
    assert out[:2] == [("ACCEPT", "8001", "+lb-control"), ("DROP", "", "+lb-control")]
    assert vm.ipsets["lb-control"] == [{"cidr": "198.51.100.10/32"}]
    assert vm.fw_options["policy_out"] == "ACCEPT"


def test_the_guest_never_chooses_the_address_the_relays_dial(sim, pve):
    """Root in a VM controls its guest agent: it could report another desktop's address (or any
    address) so that the relays would dial there. The address is the control plane's, never the guest's."""
    victim, attacker = make_spec(), make_spec()
    victim_ip = pve.provision(victim).private_ip
    status = pve.provision(attacker)
    vmid = int(status.ref)
    sim.guest_claims(vmid, victim_ip, "127.0.0.1", "203.0.113.9")
    pve.stop(attacker.key)
    assert pve.start(attacker.key).private_ip == status.private_ip != victim_ip
    assert pve.status(attacker.key).private_ip == status.private_ip
    pve.suspend(attacker.key)
    assert pve.resume(attacker.key).private_ip == status.private_ip
    # And the VM's firewall lets it send from its own address only.
    assert [e["cidr"] for e in sim.vms[vmid].ipsets["ipfilter-net0"]] == [f"{status.private_ip}/32"]


def test_a_vmid_outside_the_desktops_network_is_refused_in_words(sim):
    pve = driver_for(sim, subnet="10.80.0.0/26")
    with pytest.raises(DriverError, match="widen PROXMOX_SUBNET"):
        pve.provision(make_spec())


def test_a_bad_allowed_cidr_is_refused(pve):
    spec = make_spec()
    pve.provision(spec)
    with pytest.raises(DriverError, match="not an IPv4 network"):
        pve.apply_network_policy(spec.key, NetworkPolicy(allowed_cidrs=("nope",)))


def test_console_ticket_opens_the_vnc_websocket(sim, pve):
    spec = make_spec()
    status = pve.provision(spec)
    console = pve.console(spec.key)
    assert console.url.startswith(
        f"wss://{sim.host}/api2/json/nodes/pve1/qemu/{status.ref}/vncwebsocket?port="
    )
    assert console.headers["Authorization"].startswith("PVEAPIToken=lebureau@pve!driver=")
    assert len(console.password) == 8 and console.verify == sim.ca_path
    # PVE checks the ticket against the port (on the websocket upgrade, and on a plain GET too).
    query = dict(parse_qsl(urlsplit(console.url).query))
    vncwebsocket = pve.api.nodes("pve1").qemu(status.ref).vncwebsocket
    assert vncwebsocket.get(**query) == {"port": query["port"]}
    with pytest.raises(ResourceException, match="invalid PVEVNC ticket"):
        vncwebsocket.get(port=query["port"], vncticket=query["vncticket"] + "x")
    pve.stop(spec.key)
    with pytest.raises(DriverError, match="not running"):
        pve.console(spec.key)


def test_start_after_stop_waits_for_the_agent(sim, pve):
    spec = make_spec()
    pve.provision(spec)
    stopped = pve.stop(spec.key)
    assert (stopped.state, stopped.private_ip) == (InstanceState.STOPPED, None)
    started = pve.start(spec.key)
    assert started.state == InstanceState.RUNNING and started.private_ip


def test_vms_of_others_are_not_desktops(sim, pve):
    sim.add_template(9100, "pve1", name="someone-elses")
    pve.api.nodes("pve1").qemu(9100).clone.post(newid=500, name="web", full=1)
    pve.api.nodes("pve1").qemu(500).config.put(tags="prod;web")
    spec = make_spec()
    pve.provision(spec)
    assert [i.key for i in pve.list_instances()] == [spec.key]


def test_the_environment_builds_the_driver(monkeypatch):
    monkeypatch.setenv("PROXMOX_TEMPLATES", "full=9000")
    monkeypatch.setenv("PROXMOX_CONTROL_CIDRS", "10.1.0.0/24")
    monkeypatch.setenv("PROXMOX_WARM_POOL", "full:2:4096:20=1")
    monkeypatch.setenv("PROXMOX_VERIFY_SSL", "/etc/ssl/pve-ca.pem")
    driver = ProxmoxDriver.from_env(control_plane())
    assert driver.config.warm_pool[0].tag == "lbp-full-2c-4096m-20g"
    assert driver.config.templates == {"full": 9000}
    assert driver.machines.ssh_public_key == SSH_KEY
    assert driver.pve.connection["verify_ssl"] == "/etc/ssl/pve-ca.pem"
    monkeypatch.setenv("PROXMOX_CONTROL_CIDRS", "")
    with pytest.raises(ValueError, match="PROXMOX_CONTROL_CIDRS"):
        ProxmoxDriver.from_env(control_plane())


def test_a_bad_hostname_is_refused_before_anything_is_made(sim, pve):
    with pytest.raises(DriverError, match="not a valid hostname"):
        pve.provision(make_spec(hostname="my desktop"))
    assert not [r for r in sim.requests if r[0] != "GET"]
