"""The LXC driver against the contract suite and real containers on this host.

Needs root, the host prerequisites (``image-build/host-setup.sh``) and the minimal golden image
(``image-build/build.sh minimal``). The tests use their own bridge, subnet, nftables table and
state directories, so they never touch the desktops of a control plane running on the same host.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import paramiko
import pytest

from tests.drivers.contract import DriverContract
from workers.drivers.base import InstanceSpec, InstanceState, NetworkPolicy
from workers.drivers.lxc import LxcDriver

IMAGES_DIR = Path(os.environ.get("LEBUREAU_IMAGES_DIR", "/var/lib/lebureau/images"))
TEST_ROOT = Path("/var/lib/lebureau/test")
SUBNET = "10.214.0.0/24"
GATEWAY = "10.214.0.1"
# The host port desktops may open (the control plane's callback API in production).
HOST_PORT = 18000
TOKEN = "bureau-test-token"

pytestmark = [
    pytest.mark.lxc,
    pytest.mark.skipif(
        not (IMAGES_DIR / "minimal" / "current" / "image.json").is_file(),
        reason=f"the minimal golden image is not built in {IMAGES_DIR}: run image-build/build.sh minimal",
    ),
]


class MemoryAllocator:
    """The allocator the control plane backs with its database, kept in memory for the tests."""

    def __init__(self, subnet: str):
        self.free = [str(ip) for ip in list(ipaddress.ip_network(subnet).hosts())[1:]]
        self.given: dict[str, str] = {}

    def allocate(self, key: str) -> str:
        if key not in self.given:
            self.given[key] = self.free.pop(0)
        return self.given[key]

    def release(self, key: str) -> None:
        if key in self.given:
            self.free.append(self.given.pop(key))


@pytest.fixture(scope="session")
def lxc_driver():
    driver = LxcDriver(
        ip_allocator=MemoryAllocator(SUBNET),
        images_dir=str(IMAGES_DIR),
        state_dir=str(TEST_ROOT / "desktops"),
        lxc_path=str(TEST_ROOT / "lxc"),
        lock_dir=str(TEST_ROOT / "locks"),
        bridge="lbtest0",
        subnet=SUBNET,
        nft_table="lebureau_test",
        host_tcp_ports=(HOST_PORT,),
    )
    # Leftovers of an interrupted run would hold addresses this fresh allocator hands out again.
    for leftover in driver.list_instances():
        driver.destroy(leftover.key)
    for orphan in (TEST_ROOT / "desktops").glob("*/meta.json"):
        driver.destroy(orphan.parent.name)
    return driver


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
        "files": {"/etc/bureau/token": TOKEN},
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


def ssh(ip: str, client_key, command: str, user: str = "agent", timeout: float = 60) -> tuple[int, str, str]:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # noqa: S507 (fresh test desktops)
    client.connect(ip, username=user, pkey=client_key, timeout=10, allow_agent=False, look_for_keys=False)
    try:
        _, stdout, stderr = client.exec_command(command, timeout=timeout)
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
def host_listener():
    """A TCP server on the host's bridge address, the port desktops are allowed to open."""
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
    quota = Path(f"/sys/fs/cgroup/cpu/lxc.payload.{spec.key}/cpu.cfs_quota_us")
    assert int(quota.read_text()) == 200_000


def test_containers_are_unprivileged(desktops, client_key):
    _, status = desktops()
    code, out, _ = ssh(status.private_ip, client_key, "cat /proc/self/uid_map", user="root")
    assert code == 0
    inside, outside, _count = out.split()
    assert (inside, outside) == ("0", "100000")


def test_internet_policy_keeps_the_host_reachable(lxc_driver, desktops, client_key):
    spec, status = desktops()
    lxc_driver.apply_network_policy(spec.key, NetworkPolicy(allow_internet=False))
    assert banner(status.private_ip, 22).startswith(b"SSH-")
    assert lxc_driver.status(spec.key).state == InstanceState.RUNNING


def test_vnc_serves_a_screen_with_the_session_on_it(desktops):
    _, status = desktops()
    # VNC answers as soon as Xvnc listens; the terminal window follows within a few seconds.
    deadline = time.monotonic() + 30
    while True:
        width, height, pixels = grab_framebuffer(status.private_ip)
        colours = Counter(pixels[i : i + 4] for i in range(0, len(pixels), 4))
        background = colours.most_common(1)[0][1]
        drawn = 1 - background / (width * height)
        # A blank screen (or one with only the pointer on it) is one colour; a terminal covers a lot.
        if (drawn > 0.05 and len(colours) >= 16) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert (width, height) == (1280, 800)
    assert drawn > 0.05, f"only {drawn:.1%} of the screen differs from the background: no session on it"
    assert len(colours) >= 16, f"the screen has {len(colours)} colours: no window with text on it"


def grab_framebuffer(ip: str) -> tuple[int, int, bytes]:
    """A minimal RFB 3.8 client: no authentication, 32-bit true colour, one Raw full-screen update."""
    with socket.create_connection((ip, 5900), timeout=10) as conn:
        conn.settimeout(10)

        def read(n: int) -> bytes:
            data = b""
            while len(data) < n:
                chunk = conn.recv(n - len(data))
                if not chunk:
                    raise ConnectionError("the VNC server closed the connection")
                data += chunk
            return data

        version = read(12)
        assert version.startswith(b"RFB 003.00"), version
        conn.sendall(b"RFB 003.008\n")
        types = read(read(1)[0])
        assert 1 in types, f"security type None not offered: {list(types)}"
        conn.sendall(b"\x01")
        assert struct.unpack(">I", read(4))[0] == 0, "security handshake failed"
        conn.sendall(b"\x01")  # ClientInit: shared, so the operator's viewer stays connected
        width, height = struct.unpack(">HH", read(4))
        read(16)  # the server's pixel format, replaced just below
        read(struct.unpack(">I", read(4))[0])  # desktop name
        pixel_format = struct.pack(">BBBBHHHBBBxxx", 32, 24, 0, 1, 255, 255, 255, 16, 8, 0)
        conn.sendall(b"\x00xxx" + pixel_format)  # SetPixelFormat
        conn.sendall(struct.pack(">BxHi", 2, 1, 0))  # SetEncodings: Raw only
        conn.sendall(struct.pack(">BBHHHH", 3, 0, 0, 0, width, height))  # FramebufferUpdateRequest
        framebuffer = bytearray(width * height * 4)
        message_type = read(1)[0]
        assert message_type == 0, f"expected a FramebufferUpdate, got message type {message_type}"
        read(1)
        for _ in range(struct.unpack(">H", read(2))[0]):
            x, y, w, h, encoding = struct.unpack(">HHHHi", read(12))
            assert encoding == 0, f"expected Raw encoding, got {encoding}"
            data = read(w * h * 4)
            for row in range(h):
                start = ((y + row) * width + x) * 4
                framebuffer[start : start + w * 4] = data[row * w * 4 : (row + 1) * w * 4]
        return width, height, bytes(framebuffer)
