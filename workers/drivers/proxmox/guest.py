"""The SSH step after a Proxmox VM boots: wait for cloud-init, set the hostname, write the files.

This is the default ``guest_setup`` of the Proxmox driver. It needs a real guest, so the simulator
tests replace it with a recorder; it is exercised only against a real cluster.
"""

from __future__ import annotations

import shlex
import time

import paramiko

from workers.drivers import ssh
from workers.drivers.base import ControlPlane, DriverError, InstanceSpec, TransientDriverError, guest_hostname

AGENT_HOME = "/home/agent"
# sshd answers only once cloud-init has installed the key; a real first boot takes well under this.
READY_TIMEOUT = 300.0


class SshGuestSetup:
    """Logs into the new guest as the control plane (its host key is new: whatever it presents)."""

    def __init__(self, control_plane: ControlPlane):
        self.control_plane = control_plane

    def __call__(self, spec: InstanceSpec, ip: str) -> None:
        connect = lambda: ssh.connect(  # noqa: E731
            host=ip, port=22, username=self.control_plane.ssh_user, key_path=self.control_plane.ssh_key_path
        )
        guest_setup(spec, ip, connect)


def guest_setup(spec: InstanceSpec, ip: str, connect) -> None:
    hostname = guest_hostname(spec.hostname)
    files = {"/etc/bureau/desktop_id": f"{spec.key}\n", **spec.files}
    for path in files:
        if not path.startswith("/") or ".." in path.split("/"):
            raise DriverError(f"guest file path {path!r} must be absolute and inside the guest")
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        try:
            client = connect()
            break
        except (OSError, paramiko.SSHException) as exc:
            if time.monotonic() > deadline:
                raise TransientDriverError(
                    f"desktop {spec.key} booted but SSH to {ip} failed: {exc}"
                ) from exc
            time.sleep(2)
    try:
        _run(client, "cloud-init status --wait >/dev/null || test $? -eq 2", "wait for cloud-init")
        _run(client, f"sudo hostnamectl set-hostname {shlex.quote(hostname)}", "set the hostname")
        for path, content in files.items():
            # The bureau helper's files belong to the agent who runs it; root reads everything.
            owner = "agent" if path.startswith((f"{AGENT_HOME}/", "/etc/bureau/")) else "root"
            mode = "600" if owner == "agent" or path.startswith("/root/") else "644"
            command = f"sudo install -D -m {mode} -o {owner} -g {owner} /dev/stdin {shlex.quote(path)}"
            _run(client, command, f"write {path}", stdin=content)
    finally:
        client.close()


def _run(client: paramiko.SSHClient, command: str, what: str, stdin: str | bytes = "") -> None:
    channel_in, stdout, stderr = client.exec_command(command, timeout=600)
    if stdin:
        channel_in.write(stdin)
    channel_in.channel.shutdown_write()
    if stdout.channel.recv_exit_status() != 0:
        raise DriverError(f"could not {what} in the desktop: {stderr.read().decode().strip()}")
