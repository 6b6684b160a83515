"""The LXC driver against the contract suite and real containers on this host.

Needs root, the host prerequisites (``image-build/host-setup.sh``) and the minimal golden image
(``image-build/build.sh minimal``). The tests use their own bridge, subnet, nftables table and
state directories, so they never touch the desktops of a control plane running on the same host.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from xml.etree import ElementTree

import paramiko
import pytest

from desktops.guest import VNC_PASSWORD_FILE, vnc_password, vnc_password_file
from tests.drivers.contract import DriverContract
from tests.support.internet import ALLOWED, BLOCKED, FOREIGN_RESOLVER, HOST_SIDE, INSIDE, NEVER, UPSTREAM
from tests.support.rfb import wait_for_a_drawn_screen
from workers.drivers.base import DriverError, InstanceSpec, InstanceState, NetworkPolicy
from workers.drivers.lxc import LxcConfig, LxcDriver, cgroups, network, resolver

IMAGES_DIR = Path(os.environ.get("LEBUREAU_IMAGES_DIR", "/var/lib/lebureau/images"))
TEST_ROOT = Path("/var/lib/lebureau/test")
SUBNET = "10.214.0.0/24"
GATEWAY = "10.214.0.1"
# The host port desktops may open (the control plane's callback API in production).
HOST_PORT = 18000
TOKEN = "bureau-test-token"
TEST_CONFIG = LxcConfig(
    images_dir=IMAGES_DIR,
    state_dir=TEST_ROOT / "desktops",
    lxc_path=TEST_ROOT / "lxc",
    lock_dir=TEST_ROOT / "locks",
    bridge="lbtest0",
    subnet=SUBNET,
    nft_table="lebureau_test",
    veth_prefix="lbt",
    host_tcp_ports=(HOST_PORT,),
    upstream_dns=(UPSTREAM,),
    host_limits=network.HostLimits(connections=200, dns_per_second=50, pings_per_second=10),
)

pytestmark = [
    pytest.mark.lxc,
    pytest.mark.skipif(
        not (IMAGES_DIR / "minimal" / "current" / "image.json").is_file(),
        reason=f"the minimal golden image is not built in {IMAGES_DIR}: run image-build/build.sh minimal",
    ),
]


@pytest.fixture(scope="session")
def lxc_driver(upstream):
    driver = LxcDriver(TEST_CONFIG)
    # Leftovers of an interrupted run would skew what the tests see of the host's network.
    for leftover in driver.list_instances():
        driver.destroy(leftover.key)
    for orphan in (TEST_ROOT / "desktops").glob("*/meta.json"):
        driver.destroy(orphan.parent.name)
    yield driver
    remove_network("lbtest0", "lebureau_test")


def remove_network(bridge: str, table: str) -> None:
    """The test bridge and firewall go with the tests; the driver makes them again when needed."""
    network.remove_tables(table)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)


@pytest.fixture(scope="session")
def client_key(tmp_path_factory):
    path = tmp_path_factory.mktemp("ssh") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return paramiko.Ed25519Key.from_private_key_file(str(path))


def _spec(client_key, **overrides) -> InstanceSpec:
    key = f"dsk_t{secrets.token_hex(6)}"
    values = {
        "key": key,
        "hostname": key,
        "vcpus": 1,
        "memory_mib": 512,
        "disk_gib": 2,
        "ssh_public_key": f"{client_key.get_name()} {client_key.get_base64()} lebureau-tests",
        "files": {"/etc/bureau/token": TOKEN, VNC_PASSWORD_FILE: vnc_password_file(key)},
    }
    values.update(overrides)
    return InstanceSpec(**values)


class TestLxcDriver(DriverContract):
    @pytest.fixture
    def driver(self, lxc_driver):
        return lxc_driver

    @pytest.fixture
    def spec(self, client_key):
        return _spec(client_key)


@pytest.fixture
def desktops(lxc_driver, client_key):
    """Provisions desktops on demand and destroys them all at the end of the test."""
    made = []

    def make(**overrides):
        spec = _spec(client_key, **overrides)
        made.append(spec.key)
        return spec, lxc_driver.provision(spec)

    yield make
    for key in made:
        lxc_driver.destroy(key)


def ssh(
    ip: str, client_key, command: str, user: str = "agent", timeout: float = 60, stdin: str = ""
) -> tuple[int, str, str]:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # noqa: S507 (fresh test desktops)
    client.connect(ip, username=user, pkey=client_key, timeout=10, allow_agent=False, look_for_keys=False)
    try:
        channel_in, stdout, stderr = client.exec_command(command, timeout=timeout)
        if stdin:
            channel_in.write(stdin)
        channel_in.channel.shutdown_write()
        code = stdout.channel.recv_exit_status()
        return code, stdout.read().decode(), stderr.read().decode()
    finally:
        client.close()


def banner(ip: str, port: int) -> bytes:
    with socket.create_connection((ip, port), timeout=3) as conn:
        conn.settimeout(3)
        return conn.recv(16)


def test_guest_helper_reports_the_desktop_and_its_token(desktops, client_key):
    spec, status = desktops()
    code, out, err = ssh(status.private_ip, client_key, "bureau status; stat -c '%U %a' /etc/bureau/token")
    assert code == 0, err
    assert f"desktop:  {spec.key}" in out
    assert f"hostname: {spec.hostname.replace('_', '-')}" in out
    assert "token:    present" in out
    assert "uptime:   00:00:" in out  # the desktop's own uptime, not the host's
    assert "agent 600" in out
    # The agent has passwordless sudo, and the control plane's key opens root too.
    assert ssh(status.private_ip, client_key, "sudo -n whoami") == (0, "root\n", "")
    assert ssh(status.private_ip, client_key, "cat /etc/bureau/token", user="root")[1] == TOKEN


def test_a_file_survives_stop_start_and_suspend_resume_but_not_destroy(lxc_driver, desktops, client_key):
    spec, status = desktops()
    ip = status.private_ip
    assert ssh(ip, client_key, "echo kept > ~/note.txt && sync")[0] == 0

    lxc_driver.stop(spec.key)
    lxc_driver.start(spec.key)
    assert ssh(ip, client_key, "cat ~/note.txt")[1] == "kept\n"

    lxc_driver.suspend(spec.key)
    with pytest.raises(OSError):
        banner(ip, 22)  # frozen: the connection is accepted by nobody
    lxc_driver.resume(spec.key)
    assert ssh(ip, client_key, "cat ~/note.txt")[1] == "kept\n"

    lxc_driver.destroy(spec.key)
    again = lxc_driver.provision(spec)
    code, _, err = ssh(again.private_ip, client_key, "cat ~/note.txt")
    assert code != 0 and "No such file" in err


PROBE = 'python3 -c "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)" {} {}'


@pytest.fixture
def host_listener(lxc_driver):
    """A TCP server on the host's bridge address, the port desktops are allowed to open."""
    network.ensure_bridge(TEST_CONFIG.bridge, TEST_CONFIG.subnet)
    server = socket.create_server((GATEWAY, HOST_PORT))
    server.settimeout(15)
    accepted = []

    def serve():
        with contextlib.suppress(OSError):
            conn, peer = server.accept()
            accepted.append(peer[0])
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield accepted
    server.close()
    thread.join(timeout=20)


def test_a_desktop_cannot_use_another_address(desktops, client_key, host_listener):
    _, status = desktops()
    spoofed = "10.214.0.250"
    code, _, err = ssh(status.private_ip, client_key, f"ip addr add {spoofed}/24 dev eth0", user="root")
    assert code == 0, err
    spoofing = (
        'python3 -c "import socket; '
        f"socket.create_connection(('{GATEWAY}', {HOST_PORT}), 3, source_address=('{spoofed}', 0))\""
    )
    dropped = spoofed_drops()
    assert ssh(status.private_ip, client_key, spoofing)[0] != 0, "a spoofed source address got through"
    assert spoofed_drops() > dropped, "the bridge's address binding did not drop the spoofed packets"
    assert ssh(status.private_ip, client_key, PROBE.format(GATEWAY, HOST_PORT))[0] == 0
    assert host_listener == [status.private_ip]


def spoofed_drops() -> int:
    listed = subprocess.run(
        ["nft", "list", "chain", "bridge", "lebureau_test", "prerouting"], capture_output=True, text=True
    ).stdout
    return sum(
        int(line.split("counter packets ")[1].split()[0])
        for line in listed.splitlines()
        if "@bindings" in line
    )


def test_start_recovers_after_a_host_reboot(lxc_driver, desktops, client_key):
    spec, status = desktops()
    assert ssh(status.private_ip, client_key, "echo kept > ~/note.txt && sync")[0] == 0
    # What a reboot loses: the container, the mounts, the bridge and the firewall.
    base = TEST_ROOT / "desktops" / spec.key
    subprocess.run(["lxc-stop", "-n", spec.key, "-P", str(TEST_ROOT / "lxc"), "-k"], check=True)
    subprocess.run(["umount", str(base / "rootfs")], check=True)
    subprocess.run(["umount", str(base / "disk")], check=True)
    subprocess.run(["ip", "link", "del", "lbtest0"], check=True)
    subprocess.run(["nft", "delete", "table", "inet", "lebureau_test"], check=True)
    assert lxc_driver.status(spec.key).state == InstanceState.STOPPED

    assert lxc_driver.start(spec.key).state == InstanceState.RUNNING
    assert ssh(status.private_ip, client_key, "cat ~/note.txt")[1] == "kept\n"
    rules = subprocess.run(["nft", "list", "set", "inet", "lebureau_test", "desktops"], capture_output=True)
    assert status.private_ip in rules.stdout.decode()


def test_image_metadata_of_a_desktop(lxc_driver, desktops):
    spec, _ = desktops()
    meta = lxc_driver.image_metadata(spec.key)
    assert meta["profile"] == "minimal"
    assert len(meta["packages_sha256"]) == 64


def test_concurrent_provisions_lease_distinct_addresses(lxc_driver, client_key):
    """Addresses come from the engine's own records under one host-wide lock: racing creates never share."""
    specs = [_spec(client_key) for _ in range(6)]
    with ThreadPoolExecutor(len(specs)) as pool:
        metas = list(pool.map(lxc_driver._new_meta, specs))
    try:
        addresses = [meta["ip"] for meta in metas]
        assert len(set(addresses)) == len(addresses)
        held = [m["ip"] for m in lxc_driver.store.all()]
        assert sorted(held) == sorted(set(held)), "two desktops of this host hold one address"
    finally:
        for spec in specs:
            lxc_driver.destroy(spec.key)


def test_desktops_provisioned_at_once_each_have_their_firewall_rules(lxc_driver, desktops):
    """Provisions at once share renders of the firewall (one that began after a desktop's record was
    written covers it): none may be left out of the rules that let it answer."""
    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(lambda _: desktops(), range(4)))
    # The bridge table binds each desktop's interface to its MAC and address.
    bindings = subprocess.run(
        ["nft", "list", "table", "bridge", TEST_CONFIG.nft_table], capture_output=True, text=True, check=True
    ).stdout
    for spec, status in made:
        meta = lxc_driver.store.read(spec.key)
        assert f'"{meta["veth"]}" . {meta["hwaddr"]} . {status.private_ip}' in bindings
        assert banner(status.private_ip, 22).startswith(b"SSH-")


def test_desktops_cannot_reach_each_other_but_the_host_reaches_both(desktops, client_key, host_listener):
    _, a = desktops()
    _, b = desktops()
    for ip in (a.private_ip, b.private_ip):
        assert banner(ip, 22).startswith(b"SSH-")
        assert banner(ip, 5900).startswith(b"RFB ")
    for port in (22, 5900):
        code, _, err = ssh(a.private_ip, client_key, PROBE.format(b.private_ip, port))
        assert code != 0, f"desktop A opened a TCP connection to desktop B's port {port}"
        assert "timed out" in err or "No route to host" in err, err
    # The same probe towards the host goes through: the failure above is the firewall, not the probe.
    code, _, err = ssh(a.private_ip, client_key, PROBE.format(GATEWAY, HOST_PORT))
    assert code == 0, err
    assert host_listener == [a.private_ip]
    # And a host port that is not open to desktops is not reachable either.
    assert ssh(a.private_ip, client_key, PROBE.format(GATEWAY, 22))[0] != 0


def test_writing_past_the_disk_cap_fails_inside_and_spares_the_host(desktops, client_key):
    _, status = desktops(disk_gib=1)
    host_free = shutil.disk_usage("/var/lib/lebureau").free
    code, _, err = ssh(
        status.private_ip, client_key, "dd if=/dev/zero of=~/big bs=1M count=1500 conv=fsync", timeout=120
    )
    assert code != 0
    assert "No space left on device" in err
    # The desktop's disk image is sparse and capped at 1 GiB, whatever the guest does.
    assert host_free - shutil.disk_usage("/var/lib/lebureau").free < 1.1 * 1024**3
    assert ssh(status.private_ip, client_key, "rm ~/big && echo ok")[1] == "ok\n"


def test_memory_and_cpu_caps_are_in_the_container_cgroup(desktops):
    spec, _ = desktops(memory_mib=768, vcpus=2)
    memory = Path(f"/sys/fs/cgroup/memory/lxc.payload.{spec.key}/memory.limit_in_bytes")
    if not memory.exists():
        pytest.skip("this host has no cgroup v1 memory hierarchy")
    assert int(memory.read_text()) == 768 * 1024 * 1024
    cpu = Path(f"/sys/fs/cgroup/cpu/lxc.payload.{spec.key}")
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == 200_000
    # A busy desktop yields a contended CPU to the host's processes (the control plane) at 4 to 1.
    assert int((cpu / "cpu.shares").read_text()) == 256


def test_the_memory_cap_holds_against_a_real_allocation(desktops, client_key):
    _, status = desktops(memory_mib=256)
    code, _, _ = ssh(status.private_ip, client_key, "python3 -c \"b = b'x' * (400 * 1024 * 1024)\"")
    assert code != 0, "a 256 MiB desktop allocated 400 MiB"
    assert ssh(status.private_ip, client_key, "python3 -c \"b = b'x' * (50 * 1024 * 1024)\"")[0] == 0


def test_containers_are_unprivileged(desktops, client_key):
    _, status = desktops()
    code, out, _ = ssh(status.private_ip, client_key, "cat /proc/self/uid_map", user="root")
    assert code == 0
    inside, outside, _count = out.split()
    assert (inside, outside) == ("0", "100000")


def test_network_policy_controls_egress_with_real_packets(
    lxc_driver, desktops, client_key, internet, host_listener
):
    outside = ALLOWED
    spec, status = desktops()

    def reaches_outside() -> bool:
        return ssh(status.private_ip, client_key, PROBE.format(outside, 8080))[0] == 0

    assert reaches_outside(), "with the default policy a desktop reaches the internet"
    lxc_driver.apply_network_policy(spec.key, NetworkPolicy(allow_internet=False))
    assert not reaches_outside()
    # The host keeps reaching the desktop, and the desktop its host port.
    assert banner(status.private_ip, 22).startswith(b"SSH-")
    assert ssh(status.private_ip, client_key, PROBE.format(GATEWAY, HOST_PORT))[0] == 0
    assert host_listener == [status.private_ip]
    lxc_driver.apply_network_policy(
        spec.key, NetworkPolicy(allow_internet=False, allowed_cidrs=(f"{outside}/32",))
    )
    assert reaches_outside(), "an allowed CIDR is reachable without the internet"
    lxc_driver.apply_network_policy(spec.key, NetworkPolicy())
    assert reaches_outside()


def test_a_bad_allowed_cidr_is_refused(lxc_driver, desktops):
    spec, _ = desktops()
    with pytest.raises(DriverError, match="not an IPv4 network"):
        lxc_driver.apply_network_policy(
            spec.key, NetworkPolicy(allow_internet=False, allowed_cidrs=("nope",))
        )


FETCH = (
    'python3 -c "import sys, urllib.request; '
    'print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode())" {}'
)
# A DNS query for one A record, sent to the server of the agent's choice: prints the answer's code
# (3 is "no such domain") and its addresses.
ASK = r"""
import socket, struct, sys
name, server = sys.argv[1], sys.argv[2]
query = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0)
query += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack("!HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.sendto(query, (server, 53))
answer = s.recv(4096)
records = range(len(query), len(answer) - 15, 16)  # each: name pointer, type, class, ttl, length, address
print(answer[3] & 0xF, *[socket.inet_ntoa(answer[i + 12 : i + 16]) for i in records])
"""


def fetched(ip: str, client_key, url: str) -> str | None:
    """What the desktop's agent gets from the URL, or None when it cannot reach it."""
    code, out, _ = ssh(ip, client_key, FETCH.format(url))
    return out.strip() if code == 0 else None


def test_an_allow_list_holds_for_packets_not_only_for_names(
    lxc_driver, desktops, client_key, internet, host_listener
):
    allowlist = NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",))
    spec, status = desktops(network_policy=allowlist)

    def fetch(url: str) -> str | None:
        return fetched(status.private_ip, client_key, url)

    def ask(name: str, server: str) -> str:
        return ssh(status.private_ip, client_key, f"python3 - {name} {server}", stdin=ASK)[1].strip()

    def reaches_the_guest_endpoint() -> bool:
        return ssh(status.private_ip, client_key, PROBE.format(GATEWAY, HOST_PORT))[0] == 0

    # From the first boot on: the allowed name, and nothing else by name or by address.
    assert fetch("http://allowed.test/") == f"stand-in {ALLOWED}"
    assert fetch("http://blocked.test/") is None
    assert fetch(f"http://{BLOCKED}/") is None, "a blocked host was reached by its address"
    refused = lxc_driver.blocked_egress(spec.key)
    addresses = {b.address: b for b in refused.addresses}
    assert addresses[BLOCKED].packets >= 1 and addresses[BLOCKED].seconds_ago < 60
    assert ALLOWED not in addresses
    assert refused.names == (("blocked.test", 1),)
    # Asking another resolver gets the desktop's own answers, root or not.
    assert ask("blocked.test", FOREIGN_RESOLVER) == "3"
    assert (
        ssh(
            status.private_ip,
            client_key,
            f"python3 - blocked.test {FOREIGN_RESOLVER}",
            user="root",
            stdin=ASK,
        )[1].strip()
        == "3"
    )
    assert ask("allowed.test", "192.0.2.53") == f"0 {ALLOWED}"
    assert reaches_the_guest_endpoint()

    lxc_driver.apply_network_policy(spec.key, NetworkPolicy())
    assert fetch("http://blocked.test/") == f"stand-in {BLOCKED}", "open lets everything through, at once"
    assert reaches_the_guest_endpoint()

    lxc_driver.apply_network_policy(spec.key, NetworkPolicy(allow_internet=False))
    assert fetch("http://allowed.test/") is None
    assert fetch(f"http://{ALLOWED}/") is None, "an address a former policy allowed stayed reachable"
    assert fetch(f"http://{BLOCKED}/") is None
    assert ask("allowed.test", FOREIGN_RESOLVER) == "3"
    assert reaches_the_guest_endpoint()

    # Back to the allow-list: an address is reachable once its name has been looked up, not before.
    lxc_driver.apply_network_policy(spec.key, allowlist)
    assert fetch(f"http://{ALLOWED}/") is None
    assert fetch("http://allowed.test/") == f"stand-in {ALLOWED}"
    assert fetch(f"http://{ALLOWED}/") == f"stand-in {ALLOWED}"
    assert lxc_driver.status(spec.key).state == InstanceState.RUNNING


def test_a_resolver_that_died_is_restarted_by_the_engines_maintenance(
    lxc_driver, desktops, client_key, internet
):
    spec, status = desktops(
        network_policy=NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",))
    )
    resolver.stop(lxc_driver.store.dir(spec.key))
    assert fetched(status.private_ip, client_key, "http://allowed.test/") is None
    assert lxc_driver.maintenance() == {"resolvers_restarted": [spec.key]}
    assert fetched(status.private_ip, client_key, "http://allowed.test/") == f"stand-in {ALLOWED}"
    assert lxc_driver.maintenance() == {}


def test_a_resolver_left_by_a_desktop_that_is_gone_gives_up_its_port(
    lxc_driver, desktops, client_key, internet
):
    """An engine stopped between starting a resolver and writing its pid left it running with the port
    that the next desktop given the same address needs: that desktop's resolver could not start."""
    spec, status = desktops(
        network_policy=NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",))
    )
    directory = lxc_driver.store.dir(spec.key)
    resolver.stop(directory)
    ghost = directory.parent / "dsk_ghost000000000000"
    ghost.mkdir()
    shutil.copy(directory / resolver.CONF, ghost / resolver.CONF)
    subprocess.run(["dnsmasq", f"--conf-file={ghost / resolver.CONF}"], check=True)
    shutil.rmtree(ghost)
    assert lxc_driver.maintenance() == {"resolvers_restarted": [spec.key]}
    assert fetched(status.private_ip, client_key, "http://allowed.test/") == f"stand-in {ALLOWED}"


def test_an_address_a_name_resolves_to_in_a_denied_network_stays_denied(
    lxc_driver, desktops, client_key, internet
):
    """A name may resolve to a private or metadata address (DNS rebinding): allowing the name opens none."""
    spec, status = desktops(
        network_policy=NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",))
    )
    meta = lxc_driver.store.read(spec.key)
    subprocess.run(
        ["nft", "add", "element", "inet", "lebureau_test_dns", f"allow_{meta['veth']}", f"{{ {NEVER[0]} }}"],
        check=True,
    )
    assert ssh(status.private_ip, client_key, PROBE.format(NEVER[0], 8080), user="root")[0] != 0


def test_bad_keys_and_missing_images_fail_permanently(lxc_driver, client_key):
    with pytest.raises(DriverError, match="not a valid desktop key") as raised:
        lxc_driver.status("../etc")
    assert not raised.value.transient
    with pytest.raises(DriverError, match="not built on this host") as raised:
        lxc_driver.provision(_spec(client_key, image_profile="nosuchprofile"))
    assert not raised.value.transient


def test_vnc_serves_a_screen_with_the_session_on_it(desktops):
    spec, status = desktops()
    width, height, drawn, colours = wait_for_a_drawn_screen(status.private_ip, vnc_password(spec.key, "view"))
    assert (width, height) == (1280, 800)
    assert drawn > 0.05, f"only {drawn:.1%} of the screen differs from the background: no session on it"
    assert colours >= 16, f"the screen has {colours} colours: no window with text on it"


FULL_IMAGE = pytest.mark.skipif(
    not (IMAGES_DIR / "full" / "current" / "image.json").is_file(),
    reason="the full golden image is not built: run image-build/build.sh full",
)


@FULL_IMAGE
def test_full_profile_has_the_agent_runtime_and_xfce(desktops, client_key):
    _, status = desktops(image_profile="full", memory_mib=2048, disk_gib=4)
    code, out, err = ssh(
        status.private_ip, client_key, "node --version && openclaw --version && which chromium"
    )
    assert code == 0, err
    version = out.splitlines()[0]
    assert int(version.lstrip("v").split(".")[0]) >= 24, version
    assert "OpenClaw" in out
    deadline = time.monotonic() + 30
    while ssh(status.private_ip, client_key, "pgrep -x xfce4-panel")[0] != 0:
        assert time.monotonic() < deadline, "the XFCE panel did not start"
        time.sleep(1)


# The panel's launchers, by desktop id, and how each one's window is recognised once it is mapped:
# (WM_CLASS, title) -> bool.
PANEL_APPS = {
    "xfce4-terminal.desktop": lambda wm_class, title: "xfce4-terminal" in wm_class,
    "chromium.desktop": lambda wm_class, title: "chromium" in wm_class.lower(),
    # code-server's workbench in a Chromium app window, once it has loaded (its title names it).
    "bureau-vscode.desktop": lambda wm_class, title: "code-server" in title,
    "libreoffice-writer.desktop": lambda wm_class, title: "libreoffice-writer" in wm_class,
    "libreoffice-calc.desktop": lambda wm_class, title: "libreoffice-calc" in wm_class,
}
PANEL_SETTINGS = "/etc/xdg/xfce4/xfconf/xfce-perchannel-xml/xfce4-panel.xml"
MAPPED_WINDOWS = r"""
for w in $(xprop -root _NET_CLIENT_LIST | grep -o '0x[0-9a-f]*'); do
    xwininfo -id "$w" | grep -q 'Map State: IsViewable' || continue
    printf '%s\t%s\t%s\n' "$w" "$(xprop -id "$w" WM_CLASS | cut -d= -f2)" \
        "$(xprop -id "$w" _NET_WM_NAME | cut -d= -f2-)"
done
"""
CODE_PORT = 13337


def mapped_windows(ip: str, client_key) -> dict[str, tuple[str, str]]:
    code, out, err = ssh(ip, client_key, "DISPLAY=:0 sh", stdin=MAPPED_WINDOWS)
    assert code == 0, err
    return {w: (wm_class, title) for w, wm_class, title in (line.split("\t") for line in out.splitlines())}


def panel_launchers(ip: str, client_key) -> dict[str, str]:
    """Desktop id -> the command its launcher on the running panel starts.

    The panel's settings in the image name the launchers' desktop ids; the running panel copies
    each into its launcher's own directory, the file it starts the application from."""
    code, out, err = ssh(ip, client_key, f"cat {PANEL_SETTINGS}")
    assert code == 0, err
    plugins = ElementTree.fromstring(out).find("property[@name='plugins']")  # noqa: S314 (our image's file)
    launchers = {
        plugin.get("name").removeprefix("plugin-"): plugin.find("property[@name='items']/value").get("value")
        for plugin in plugins
        if plugin.get("value") == "launcher"
    }
    commands = {}
    deadline = time.monotonic() + 60
    for plugin_id, desktop_id in launchers.items():
        while True:
            copy = f"~/.config/xfce4/panel/launcher-{plugin_id}/*"
            code, out, _ = ssh(ip, client_key, f"grep -h -m1 '^Exec=' {copy}")
            if code == 0:
                break
            assert time.monotonic() < deadline, f"the panel did not load its launcher of {desktop_id}"
            time.sleep(1)
        # Field codes (%U: the files to open) are the launcher's to fill: none here.
        argv = [arg for arg in shlex.split(out.strip().removeprefix("Exec=")) if not arg.startswith("%")]
        commands[desktop_id] = shlex.join(argv)
    return commands


@FULL_IMAGE
def test_full_profile_panel_launchers_open_their_applications(desktops, client_key):
    _, status = desktops(image_profile="full", memory_mib=3072, disk_gib=4)
    ip = status.private_ip
    launchers = panel_launchers(ip, client_key)
    assert set(launchers) == set(PANEL_APPS)
    # VS Code costs nothing until it is used: code-server is not started at boot.
    assert ssh(ip, client_key, "pgrep -f 'code-serve[r]'")[0] != 0

    for desktop_id, recognise in PANEL_APPS.items():
        before = mapped_windows(ip, client_key)
        # As the panel does: in the agent's session, on its display, detached from this shell.
        start = f"cd; DISPLAY=:0 setsid {launchers[desktop_id]} >/tmp/launcher.log 2>&1 </dev/null &"
        assert ssh(ip, client_key, start)[0] == 0
        deadline = time.monotonic() + 120
        while True:
            new = {w: seen for w, seen in mapped_windows(ip, client_key).items() if w not in before}
            if any(recognise(*seen) for seen in new.values()):
                break
            if time.monotonic() > deadline:
                log = ssh(ip, client_key, "cat /tmp/launcher.log")[1]
                pytest.fail(f"{desktop_id} mapped no window of its own: new windows {new}, log:\n{log}")
            time.sleep(1)

    # code-server answers on the loopback, and only there: it has no password.
    probe = f"curl -fsS http://127.0.0.1:{CODE_PORT}/healthz"
    code, out, err = ssh(ip, client_key, probe)
    assert code == 0 and "alive" in out, err
    sockets = ssh(ip, client_key, f"ss -Hltn 'sport = :{CODE_PORT}'")[1].splitlines()
    assert [line.split()[3] for line in sockets] == [f"127.0.0.1:{CODE_PORT}"], sockets
    with pytest.raises(OSError):
        socket.create_connection((ip, CODE_PORT), 3)


@FULL_IMAGE
def test_full_profile_has_the_developer_tools(desktops, client_key):
    _, status = desktops(image_profile="full", memory_mib=2048, disk_gib=4)
    tools = (
        "set -e; cd; python3 -m venv venv && venv/bin/pip --version && pip3 --version"
        " && venv/bin/python -c 'import sys; print(sys.prefix)'"
        " && node --version && npm --version && npx --version"
        " && mkdir app && cd app && npm init -y >/dev/null && node -p 'require(\"./package.json\").name'"
        " && git --version && gcc --version && make --version"
    )
    code, out, err = ssh(status.private_ip, client_key, tools)
    assert code == 0, err
    assert "/home/agent/venv" in out
    assert "\napp\n" in out
    for tool in ("pip ", "git version", "gcc ", "GNU Make"):
        assert tool in out, out


# Isolation: what a desktop's root must never reach, whatever the desktop's egress policy


def test_link_local_metadata_and_private_networks_stay_out_of_reach_in_every_policy(
    lxc_driver, desktops, client_key, internet
):
    outside = ALLOWED
    spec, status = desktops()

    def reaches(address: str) -> bool:
        return ssh(status.private_ip, client_key, PROBE.format(address, 8080), user="root")[0] == 0

    for address in NEVER:
        assert socket.create_connection((address, 8080), 3), f"the host does not reach {address}"
    policies = [
        NetworkPolicy(),
        NetworkPolicy(allow_internet=False, allowed_cidrs=tuple(f"{a}/32" for a in (outside, *NEVER))),
    ]
    for policy in policies:
        lxc_driver.apply_network_policy(spec.key, policy)
        assert reaches(outside), "the probe works: the same desktop reaches the stand-in for the internet"
        reached = [address for address in NEVER if reaches(address)]
        assert not reached, f"a desktop reached {reached} with {policy}"


def test_the_control_planes_web_port_is_closed_to_desktops(desktops, client_key):
    """Desktops once reached the control plane's pages, API and admin on the host's web port."""
    _, status = desktops()
    with socket.create_server((GATEWAY, 8000)) as pages:
        pages.settimeout(5)
        assert ssh(status.private_ip, client_key, PROBE.format(GATEWAY, 8000), user="root")[0] != 0


# A desktop with a resolver that answers one name.
ALLOW_LISTED = NetworkPolicy(allow_internet=False, allowed_domains=("allowed.test",))
NEIGHBOUR = """
import socket, sys
from dnslib import DNSRecord
gateway, lan_side, port, dns_port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
reached = []
for address in (gateway, lan_side):
    try:
        socket.create_connection((address, port), 2).close()
        reached.append(f"tcp {address}:{port}")
    except OSError:
        pass
try:
    DNSRecord.question("allowed.test").send(gateway, dns_port, timeout=2)
    reached.append(f"dns {gateway}:{dns_port}")
except OSError:
    pass
print(" ".join(reached))
"""


def test_a_neighbour_routing_through_another_interface_reaches_nothing_meant_for_desktops(
    lxc_driver, desktops, internet
):
    """A LAN neighbour with a route to the bridge through this host once reached the desktops' resolvers
    and the port meant for desktops alone (the guest endpoint listens on every address by default)."""
    _, status = desktops(network_policy=ALLOW_LISTED)
    dns_port = network.resolver_port(TEST_CONFIG.subnet, status.private_ip, TEST_CONFIG.resolver_port_base)
    probe = [sys.executable, "-c", NEIGHBOUR, GATEWAY, HOST_SIDE, str(HOST_PORT), str(dns_port)]
    with socket.create_server(("0.0.0.0", HOST_PORT)):  # noqa: S104 (as the guest endpoint does by default)
        # The probe works: from the host itself, all three answer.
        from_the_host = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.split()
        expected = [f"{GATEWAY}:{HOST_PORT}", f"{HOST_SIDE}:{HOST_PORT}", f"{GATEWAY}:{dns_port}"]
        assert from_the_host == ["tcp", expected[0], "tcp", expected[1], "dns", expected[2]]
        neighbour = subprocess.run([*INSIDE, *probe], capture_output=True, text=True, check=True)
    assert neighbour.stdout.strip() == "", f"the neighbour reached {neighbour.stdout}"


FLOOD = r"""
import os, select, socket, struct, sys, time
gateway, port = sys.argv[1], int(sys.argv[2])

def flood(sock, packet, to, is_answer):
    # 1,000 packets in about a second from one port pair (one flow), the answers read as they come.
    answers = 0
    for _ in range(1000):
        sock.sendto(packet, to)
        time.sleep(0.001)
        while select.select([sock], [], [], 0)[0]:
            answers += is_answer(sock.recv(4096))
    end = time.monotonic() + 1
    while time.monotonic() < end:
        if select.select([sock], [], [], 0.1)[0]:
            answers += is_answer(sock.recv(4096))
    return answers

query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07allowed\x04test\x00\x00\x01\x00\x01"
print("dns", flood(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), query, (gateway, 53), lambda _: 1))
echo = struct.pack("!BBHHH", 8, 0, 0, 77, 1)
total = sum(struct.unpack("!4H", echo))
echo = struct.pack("!BBHHH", 8, 0, ~((total & 0xFFFF) + (total >> 16)) & 0xFFFF, 77, 1)
icmp = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
print("pings", flood(icmp, echo, (gateway, 0), lambda reply: reply[20] == 0))
# Last: the connections it holds open keep new ones out for as long as they stay.
def connect(n):
    opened = []
    for _ in range(n):
        conn = socket.socket()
        conn.setblocking(False)
        conn.connect_ex((gateway, port))
        opened.append(conn)
    time.sleep(3)
    done = select.select([], opened, [], 0)[1]  # the others still wait for an answer to their SYN
    return opened, sum(c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for c in done)

held, count = connect(250)
print("connections", count)
# Then the host's firewall is rewritten (its tenant makes another desktop), and it tries again.
open("/tmp/full", "w").close()
deadline = time.monotonic() + 60
while not os.path.exists("/tmp/rewritten") and time.monotonic() < deadline:
    time.sleep(0.2)
print("after_rewrite", connect(50)[1])
"""


def test_a_desktop_cannot_fill_the_hosts_connection_table_nor_flood_its_dns_and_pings(
    desktops, client_key, internet
):
    """Its DNS and pings to the host were accepted without limit, and its connections counted against
    the host's one table (shared by every desktop and the host) without a share of their own; and once
    limited, the counts started again whenever the firewall was rewritten."""
    _, status = desktops(network_policy=ALLOW_LISTED)
    limits = TEST_CONFIG.host_limits
    ip = status.private_ip
    with (
        socket.create_server((GATEWAY, HOST_PORT), backlog=512),  # completes connections, never accepts
        ThreadPoolExecutor(1) as pool,
    ):
        flood = pool.submit(ssh, ip, client_key, f"python3 - {GATEWAY} {HOST_PORT}", "root", 120, FLOOD)
        while ssh(ip, client_key, "test -f /tmp/full", "root")[0] != 0:
            assert not flood.done(), flood.result()
            time.sleep(0.5)
        desktops()
        ssh(ip, client_key, "touch /tmp/rewritten", "root")
        code, out, err = flood.result()
    assert code == 0, err
    got = {name: int(count) for name, count in (line.split() for line in out.splitlines())}
    # Without the limits, all 250 connections open and about 1,000 queries and pings are answered.
    assert limits.connections - 10 <= got["connections"] <= limits.connections, got
    # With the counts in the rewritten tables, another 50 open.
    assert got["connections"] + got["after_rewrite"] <= limits.connections, got
    # At most the burst (twice the rate) and the rate for the 2 to 3 s of the flood.
    assert 0 < got["dns"] <= 2 * limits.dns_per_second + 3 * limits.dns_per_second, got
    assert 0 < got["pings"] <= 2 * limits.pings_per_second + 3 * limits.pings_per_second, got


HOLD_TCP_LOOKUPS = r"""
import socket, sys, time
held = [socket.create_connection((sys.argv[1], 53), timeout=5) for _ in range(30)]
print("held", len(held), flush=True)
time.sleep(20)
"""


def test_a_desktops_resolver_takes_no_more_of_the_host_than_its_own_limits(lxc_driver, desktops, client_key):
    """Its resolver is a host process: it ran outside every cgroup, so what a desktop made it do (each
    TCP look-up it holds open is a process of its own) counted against the host alone."""
    spec, status = desktops(network_policy=ALLOW_LISTED)
    directory = lxc_driver.store.dir(spec.key)
    group = resolver.cgroup_of(directory)
    with ThreadPoolExecutor(1) as pool:
        holding = pool.submit(
            ssh, status.private_ip, client_key, f"python3 - {GATEWAY}", "root", 60, HOLD_TCP_LOOKUPS
        )
        deadline = time.monotonic() + 30
        while len(processes := _resolver_processes(directory)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(processes) > 1, "the resolver forked no child for the look-ups held open"
        for pid in processes:
            cgroup = Path(f"/proc/{pid}/cgroup").read_text()
            for controller in ("memory", "cpu", "pids"):
                assert f":{controller}:/{group}\n" in cgroup, (pid, cgroup)
        holding.result()
    root = Path("/sys/fs/cgroup")
    assert (
        int((root / "memory" / group / "memory.limit_in_bytes").read_text()) == resolver.LIMITS.memory_bytes
    )
    assert int((root / "cpu" / group / "cpu.cfs_quota_us").read_text()) == 10_000  # a tenth of a core
    assert int((root / "pids" / group / "pids.max").read_text()) == resolver.LIMITS.pids
    memory, _ = cgroups.usage(group)
    assert 0 < memory <= resolver.LIMITS.memory_bytes
    lxc_driver.stop(spec.key)
    assert not (root / "memory" / group).exists() and not (root / "pids" / group).exists()


def _resolver_processes(directory: Path) -> list[int]:
    """A desktop's resolver and the children it forked (with its command line)."""
    return [pid for pid, conf in resolver._resolvers().items() if conf == directory / resolver.CONF]


SPOOFER = r"""
import socket, struct, sys
def checksum(data):
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF
def udp(src, dst, payload):
    body = struct.pack("!HHHH", 4000, int(sys.argv[3]), 8 + len(payload), 0) + payload
    head = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(body), 1, 0, 64, 17, 0,
                       socket.inet_aton(src), socket.inet_aton(dst))
    return head[:10] + struct.pack("!H", checksum(head)) + head[12:] + body
me, gateway, mac = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[4].replace(":", ""))
host_mac = bytes.fromhex(sys.argv[5].replace(":", ""))
forged_mac = bytes.fromhex("00163e777777")
vlan = b"\x81\x00\x00\x05"
frames = [
    host_mac + mac + b"\x08\x00" + udp(me, gateway, b"honest"),
    host_mac + mac + b"\x08\x00" + udp("10.214.0.250", gateway, b"forged-ip"),
    host_mac + mac + vlan + b"\x08\x00" + udp("10.214.0.250", gateway, b"tagged-forged-ip"),
    host_mac + mac + vlan + b"\x08\x00" + udp(me, gateway, b"tagged"),
    host_mac + forged_mac + b"\x08\x00" + udp(me, gateway, b"forged-mac"),
]
raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
raw.bind(("eth0", 0))
for frame in frames:
    raw.send(frame)
"""


def test_forged_frames_never_cross_the_bridge_nor_teach_it_a_mac(lxc_driver, desktops, client_key):
    """Frames with another address, another MAC, or a VLAN tag (which once slipped past the address
    check) are dropped where they enter the bridge, before it learns anything from them."""
    spec, status = desktops()
    mac = lxc_driver.store.read(spec.key)["hwaddr"]
    host_mac = Path("/sys/class/net/lbtest0/address").read_text().strip()
    received = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        # DHCP's port: one of the few the host takes from desktops (no DHCP server runs on this bridge).
        listener.bind((GATEWAY, 67))
        listener.settimeout(1)
        port = 67
        command = f"python3 - {status.private_ip} {GATEWAY} {port} {mac} {host_mac}"
        code, _, err = ssh(status.private_ip, client_key, command, user="root", stdin=SPOOFER)
        assert code == 0, err
        with contextlib.suppress(TimeoutError):
            while True:
                received.append(listener.recv(100))
    assert received == [b"honest"], "only the honest frame may reach the host"
    learnt = subprocess.run(["bridge", "fdb", "show", "br", "lbtest0"], capture_output=True, text=True).stdout
    assert "00:16:3e:77:77:77" not in learnt
