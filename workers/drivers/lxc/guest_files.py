"""What a desktop's root filesystem gets at provision, written from the host before its first boot."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

from workers.drivers.base import DriverError, InstanceSpec, guest_hostname
from workers.drivers.lxc.storage import run_checked

AGENT_UID = 1000
AGENT_HOME = "/home/agent"


def seed(root: Path, spec: InstanceSpec, *, nameserver: str, id_base: int) -> None:
    """Machine id, SSH host key and resolver, then what ``assign`` writes."""
    with tempfile.TemporaryDirectory() as tmp:
        keyfile = os.path.join(tmp, "key")
        comment = f"root@{guest_hostname(spec.hostname)}"
        run_checked(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", keyfile],
            "could not generate the desktop's SSH host key",
        )
        host_key, host_key_pub = Path(keyfile).read_text(), Path(keyfile + ".pub").read_text()
    files: list[tuple[str, str | bytes, int, int]] = [
        # The desktop's resolver; DNS sent anywhere else gets its answers too.
        ("/etc/resolv.conf", f"nameserver {nameserver}\n", 0o644, 0),
        ("/etc/machine-id", secrets.token_hex(16) + "\n", 0o444, 0),
        ("/etc/ssh/ssh_host_ed25519_key", host_key, 0o600, 0),
        ("/etc/ssh/ssh_host_ed25519_key.pub", host_key_pub, 0o644, 0),
    ]
    for path, content, mode, owner in files:
        put(root, path, content, mode, id_base + owner)
    assign(root, spec, id_base=id_base)


def assign(root: Path, spec: InstanceSpec, *, id_base: int) -> None:
    """What makes the guest this desktop: its name and key, the control plane's key, ``spec.files``.
    Written again over those of a warm pool desktop when a create takes it."""
    hostname = guest_hostname(spec.hostname)
    files: list[tuple[str, str | bytes, int, int]] = [
        ("/etc/hostname", f"{hostname}\n", 0o644, 0),
        ("/etc/hosts", f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n::1\tlocalhost\n", 0o644, 0),
        ("/root/.ssh/authorized_keys", spec.ssh_public_key.strip() + "\n", 0o600, 0),
        (f"{AGENT_HOME}/.ssh/authorized_keys", spec.ssh_public_key.strip() + "\n", 0o600, AGENT_UID),
        ("/etc/bureau/desktop_id", f"{spec.key}\n", 0o644, 0),
    ]
    for path, content in spec.files.items():
        # The bureau helper's files (its token) belong to the agent who runs it; root reads all.
        owner = AGENT_UID if path.startswith((f"{AGENT_HOME}/", "/etc/bureau/")) else 0
        mode = 0o600 if owner or path.startswith("/root/") else 0o644
        files.append((path, content, mode, owner))
    for path, content, mode, owner in files:
        put(root, path, content, mode, id_base + owner)


def put(root: Path, guest_path: str, content: str | bytes, mode: int, host_uid: int) -> None:
    """Write a file into the guest from the host without ever following a symlink out of it."""
    parts = Path(guest_path).parts
    if not guest_path.startswith("/") or ".." in parts or len(parts) < 2:
        raise DriverError(f"guest file path {guest_path!r} must be absolute and inside the guest")
    directory = root
    for part in parts[1:-1]:
        directory = directory / part
        if directory.is_symlink():
            raise DriverError(
                f"cannot write {guest_path} into the guest: {directory.relative_to(root)} is a symlink"
            )
        if not directory.exists():
            directory.mkdir(mode=0o755)
            os.chown(directory, host_uid, host_uid)
    target = directory / parts[-1]
    if target.is_symlink():
        target.unlink()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)
        os.fchown(f.fileno(), host_uid, host_uid)
        os.fchmod(f.fileno(), mode)
