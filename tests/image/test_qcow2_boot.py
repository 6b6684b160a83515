"""The golden image's qcow2 disk (image-build/build-qcow2.sh) boots under QEMU and keeps the guest contract.

A copy-on-write overlay of the disk boots with a NoCloud seed, as a Proxmox VM from the template
would (the network config is the v1 form Proxmox writes); the test then reaches the guest's sshd
and VNC through QEMU's user-mode network on 127.0.0.1, and the guest agent through its socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

import paramiko
import pytest

from tests.support.services import free_port

IMAGES_DIR = Path(os.environ.get("LEBUREAU_IMAGES_DIR", "/var/lib/lebureau/images"))
PROFILE = os.environ.get("LEBUREAU_QCOW2_PROFILE", "minimal")
MAC = "52:54:00:12:34:56"
KVM_PROBE_SECONDS = 60  # a working KVM prints the kernel banner within seconds

pytestmark = pytest.mark.slow


def kvm_usable() -> bool:
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def disk() -> Path:
    meta_path = IMAGES_DIR / PROFILE / "current" / "image.json"
    qcow2 = json.loads(meta_path.read_text()).get("qcow2") if meta_path.is_file() else None
    path = meta_path.parent / qcow2["file"] if qcow2 else None
    if path is None or not path.is_file():
        pytest.skip(
            f"no qcow2 disk for the current {PROFILE} image in {IMAGES_DIR}: "
            f"run image-build/build-qcow2.sh {PROFILE}"
        )
    return path.resolve()


def seed_iso(directory: Path, public_key: str) -> Path:
    """A NoCloud seed like the one Proxmox attaches: user, key, hostname, DHCP on the NIC by MAC."""
    files = {
        "meta-data": f"instance-id: bureau-test-{uuid.uuid4().hex[:8]}\nlocal-hostname: bureau-vm-test\n",
        "user-data": f"#cloud-config\nssh_authorized_keys:\n  - {public_key}\n",
        "network-config": textwrap.dedent(f"""\
            version: 1
            config:
              - type: physical
                name: eth0
                mac_address: '{MAC}'
                subnets:
                  - type: dhcp4
            """),
    }
    for name, content in files.items():
        (directory / name).write_text(content)
    iso = directory / "seed.iso"
    subprocess.run(
        ["genisoimage", "-quiet", "-output", str(iso), "-volid", "cidata", "-joliet", "-rock", *files],
        cwd=directory,
        check=True,
    )
    return iso


def read_banner(port: int, size: int) -> bytes:
    """What the guest says first on a forwarded port (QEMU accepts and closes while nobody listens)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.settimeout(5)
            return sock.recv(size)
    except OSError:
        return b""


def wait_until(what: str, check, deadline: float, qemu: subprocess.Popen):
    while True:
        result = check()
        if result:
            return result
        if qemu.poll() is not None:
            raise AssertionError(f"QEMU exited with {qemu.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(2)


def ssh_connect(port: int, user: str, key: paramiko.PKey) -> paramiko.SSHClient | None:
    client = paramiko.SSHClient()
    # A VM booted for this test: its host key was made seconds ago, nothing to compare it with.
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # noqa: S507
    try:
        client.connect(
            "127.0.0.1",
            port=port,
            username=user,
            pkey=key,
            timeout=10,
            banner_timeout=20,
            auth_timeout=20,
            allow_agent=False,
            look_for_keys=False,
        )
        return client
    except (paramiko.SSHException, OSError, EOFError):
        # Also "authentication failed" while cloud-init has not yet written the key.
        client.close()
        return None


def run(client: paramiko.SSHClient, command: str) -> tuple[int, str]:
    _, stdout, stderr = client.exec_command(command, timeout=60)
    out = stdout.read().decode() + stderr.read().decode()
    return stdout.channel.recv_exit_status(), out


def guest_agent(path: Path, command: str) -> dict | None:
    """One QGA command over its virtio-serial socket, after a guest-sync to drop stale replies."""
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(str(path))
            reader = sock.makefile("rb")
            token = int(time.time())
            sock.sendall(json.dumps({"execute": "guest-sync", "arguments": {"id": token}}).encode())
            while json.loads(reader.readline()).get("return") != token:
                pass
            sock.sendall(json.dumps({"execute": command}).encode())
            return json.loads(reader.readline())
    except (OSError, ValueError):
        return None


def kernel_starts(qemu: subprocess.Popen, serial: Path, deadline: float) -> bool:
    while time.monotonic() < deadline and qemu.poll() is None:
        if serial.exists() and b"Linux version" in serial.read_bytes():
            return True
        time.sleep(1)
    return False


def start_qemu(args: list[str]) -> subprocess.Popen:
    qemu = subprocess.Popen(["qemu-system-x86_64", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        qemu.wait(timeout=3)  # an accelerator that fails does so at once
    return qemu


def test_qcow2_boots_with_ssh_vnc_and_guest_agent(disk, tmp_path):
    for tool in ("qemu-system-x86_64", "qemu-img", "genisoimage"):
        assert shutil.which(tool), f"{tool} is missing: image-build/build-qcow2.sh installs it"
    overlay = tmp_path / "overlay.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(disk), str(overlay)], check=True
    )
    key = paramiko.ECDSAKey.generate()
    seed = seed_iso(tmp_path, f"{key.get_name()} {key.get_base64()} bureau-test")
    ssh_port, vnc_port = free_port(), free_port()
    serial, qga = tmp_path / "serial.log", tmp_path / "qga.sock"
    machine = [
        "-m", "2048", "-smp", "2", "-display", "none", "-nodefaults",
        "-drive", f"file={overlay},if=virtio,format=qcow2",
        "-drive", f"file={seed},media=cdrom,if=ide,format=raw",
        "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{ssh_port}-:22,hostfwd=tcp:127.0.0.1:{vnc_port}-:5900",
        "-device", f"virtio-net-pci,netdev=n0,mac={MAC}",
        "-device", "virtio-serial",
        "-chardev", f"socket,id=qga0,path={qga},server=on,wait=off",
        "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
        "-serial", f"file:{serial}",
    ]  # fmt: skip
    accel = os.environ.get("LEBUREAU_QEMU_ACCEL") or ("kvm" if kvm_usable() else "tcg")
    qemu = None
    if accel == "kvm":
        # Nested KVM may refuse the host's IA32_ARCH_CAPABILITIES MSR ("failed to set MSR 0x10a"), or
        # (seen in a Firecracker VM) run GRUB and then hang: no kernel banner in time means TCG.
        qemu = start_qemu(["-accel", "kvm", "-cpu", "host,-arch-capabilities", *machine])
        if not kernel_starts(qemu, serial, time.monotonic() + KVM_PROBE_SECONDS):
            qemu.kill()
            output = qemu.communicate()[0].decode(errors="replace").strip()
            print(f"KVM does not boot the kernel here, falling back to TCG: {output or 'no kernel banner'}")
            accel = "tcg"
    if accel != "kvm":
        qemu = start_qemu(["-accel", "tcg", "-cpu", "max", *machine])
    started = time.monotonic()
    deadline = started + (600 if accel == "kvm" else 1800)  # TCG on two cores: minutes
    try:
        wait_until("sshd's banner", lambda: read_banner(ssh_port, 64).startswith(b"SSH-2.0-"), deadline, qemu)
        print(f"sshd answered after {time.monotonic() - started:.0f} s ({accel.upper()})")
        agent = wait_until(
            "an SSH login as agent", lambda: ssh_connect(ssh_port, "agent", key), deadline, qemu
        )
        code, out = run(agent, "bureau status")
        assert code == 0, out
        assert "profile:  " + PROFILE in out
        assert "hostname: bureau-vm-test" in out  # cloud-init applied the seed's meta-data
        root = wait_until("an SSH login as root", lambda: ssh_connect(ssh_port, "root", key), deadline, qemu)
        code, out = run(root, "systemctl is-active qemu-guest-agent")
        assert (code, out.strip()) == (0, "active"), out
        code, out = run(root, "findmnt -n -o SOURCE,OPTIONS / && cat /proc/cmdline")
        assert code == 0 and "rw" in out.split()[1] and "console=ttyS0" in out, out
        code, out = run(
            root, "cloud-init status --wait --long || grep -E 'WARNING|ERROR' /var/log/cloud-init.log"
        )
        assert code == 0 and "status: done" in out, out
        # Every unit of the image came up (nothing container-only left failing in a VM).
        code, out = run(root, "systemctl is-system-running --wait || systemctl --failed --no-legend")
        assert out.startswith("running"), out
        assert wait_until(
            "the RFB banner on 5900",
            lambda: read_banner(vnc_port, 12).startswith(b"RFB 003.00"),
            deadline,
            qemu,
        )
        interfaces = guest_agent(qga, "guest-network-get-interfaces")
        # The Proxmox driver reads the VM's IP from the guest agent.
        assert interfaces and "10.0.2.15" in json.dumps(interfaces), interfaces
        print(f"guest ready after {time.monotonic() - started:.0f} s")
        agent.close()
        root.close()
    except BaseException:
        log = serial.read_text(errors="replace") if serial.exists() else "(no serial output)"
        print(f"---- serial console ({serial}) ----\n{log[-20000:]}")
        if qemu.poll() is not None:
            print(f"---- QEMU output ----\n{qemu.stdout.read().decode(errors='replace')}")
        raise
    finally:
        qemu.kill()
        qemu.wait()
