"""The control plane's SSH identity and its sessions into desktops, shared by every engine.

Which host key a desktop may present is the caller's business: the domain pins it and passes it in
(``desktops.guest``); an engine setting up a guest it has just built checks against what it knows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def control_plane_public_key(private_path: Path) -> str:
    """The public key authorised in every desktop; the pair is created on first use."""
    public_path = private_path.with_suffix(".pub")
    if not public_path.exists():
        private_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = Ed25519PrivateKey.generate()
        private_bytes = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        public_bytes = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        # Write the private half first and only then the public one, which marks the pair complete.
        private_path.touch(mode=0o600)
        private_path.write_bytes(private_bytes)
        public_path.write_text(public_bytes.decode() + " lebureau-control-plane\n")
    return public_path.read_text().strip()


def host_key_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


class _HostKeyCheck(paramiko.MissingHostKeyPolicy):
    """Accept the pinned key only; with none pinned yet, hand the presented one to ``on_first``."""

    def __init__(self, pinned: str, on_first: Callable[[str], None] | None):
        self.pinned, self.on_first = pinned, on_first

    def missing_host_key(self, client, hostname, key):
        presented = host_key_line(key)
        if self.pinned and presented != self.pinned:
            raise paramiko.SSHException(f"The SSH host key of {hostname} changed: refused.")
        if not self.pinned and self.on_first is not None:
            self.on_first(presented)


def connect(
    *,
    host: str,
    port: int,
    username: str,
    key_path: Path,
    pinned_host_key: str = "",
    on_first_host_key: Callable[[str], None] | None = None,
    timeout: float = 10,
) -> paramiko.SSHClient:
    """An SSH session into a desktop with the control plane's key."""
    control_plane_public_key(key_path)  # makes sure the pair exists
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(_HostKeyCheck(pinned_host_key, on_first_host_key))
    client.connect(
        host,
        port=port,
        username=username,
        pkey=paramiko.Ed25519Key.from_private_key_file(str(key_path)),
        timeout=timeout,
        banner_timeout=timeout,
        auth_timeout=timeout,
        allow_agent=False,
        look_for_keys=False,
    )
    return client
