"""The SSH step of the Proxmox driver, against a recording SSH client (there is no VM here)."""

from __future__ import annotations

import io

import paramiko
import pytest

from tests.pve.support import control_plane, make_spec
from workers.drivers.base import DriverError, TransientDriverError
from workers.drivers.proxmox import guest as proxmox_guest


class Channel:
    def __init__(self, code: int):
        self.code = code

    def recv_exit_status(self) -> int:
        return self.code

    def shutdown_write(self) -> None:
        pass


class Stdin(io.StringIO):
    channel = Channel(0)


class RecordingClient:
    def __init__(self, failing: str = ""):
        self.commands: list[tuple[str, str]] = []
        self.failing = failing
        self.closed = False

    def exec_command(self, command: str, timeout: float):
        stdin = Stdin()
        self.commands.append((command, stdin))
        stdout = io.BytesIO()
        stdout.channel = Channel(1 if self.failing and self.failing in command else 0)
        return stdin, stdout, io.BytesIO(b"permission denied")

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def client(monkeypatch):
    client = RecordingClient()
    monkeypatch.setattr("workers.drivers.ssh.connect", lambda **kwargs: client)
    return client


def test_waits_for_cloud_init_sets_the_hostname_and_writes_the_files(client):
    spec = make_spec(files={"/etc/bureau/token": "tok\n", "/etc/motd": "hello\n"})
    proxmox_guest.SshGuestSetup(control_plane())(spec, "10.220.0.9")
    commands = [(c, stdin.getvalue()) for c, stdin in client.commands]
    assert commands[0][0].startswith("cloud-init status --wait")
    assert commands[1][0] == f"sudo hostnamectl set-hostname {spec.key.replace('_', '-')}"
    assert commands[2:] == [
        ("sudo install -D -m 600 -o agent -g agent /dev/stdin /etc/bureau/desktop_id", f"{spec.key}\n"),
        ("sudo install -D -m 600 -o agent -g agent /dev/stdin /etc/bureau/token", "tok\n"),
        ("sudo install -D -m 644 -o root -g root /dev/stdin /etc/motd", "hello\n"),
    ]
    assert client.closed


@pytest.mark.parametrize("path", ["etc/passwd", "/etc/bureau/../../root/x"])
def test_a_path_outside_the_guest_is_refused_before_connecting(client, path):
    with pytest.raises(DriverError, match="must be absolute"):
        proxmox_guest.SshGuestSetup(control_plane())(make_spec(files={path: "x"}), "10.220.0.9")
    assert client.commands == []


def test_a_failing_command_is_reported(monkeypatch):
    client = RecordingClient(failing="hostnamectl")
    monkeypatch.setattr("workers.drivers.ssh.connect", lambda **kwargs: client)
    with pytest.raises(DriverError, match="could not set the hostname in the desktop: permission denied"):
        proxmox_guest.SshGuestSetup(control_plane())(make_spec(), "10.220.0.9")


def test_ssh_that_never_opens_is_transient(monkeypatch):
    def refuse(**kwargs):
        raise paramiko.SSHException("Error reading SSH protocol banner")

    monkeypatch.setattr("workers.drivers.ssh.connect", refuse)
    monkeypatch.setattr(proxmox_guest, "READY_TIMEOUT", 0)
    with pytest.raises(TransientDriverError, match=r"SSH to 10\.220\.0\.9 failed"):
        proxmox_guest.SshGuestSetup(control_plane())(make_spec(), "10.220.0.9")
