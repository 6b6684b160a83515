"""The control plane's own SSH identity, used to reach every desktop."""

from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings

from desktops.models import Desktop


def control_plane_public_key() -> str:
    """The public key authorised in every desktop; the pair is created on first use."""
    private_path = Path(settings.CONTROL_PLANE_SSH_KEY)
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


class _PinnedHostKey(paramiko.MissingHostKeyPolicy):
    """Trust a desktop's host key on first contact, then insist on it (a changed key is refused)."""

    def __init__(self, desktop_id: str):
        self.desktop_id = desktop_id

    def missing_host_key(self, client, hostname, key):
        presented = f"{key.get_name()} {key.get_base64()}"
        pinned = Desktop.objects.filter(id=self.desktop_id).values_list("ssh_host_key", flat=True).first()
        if not pinned:
            Desktop.objects.filter(id=self.desktop_id, ssh_host_key="").update(ssh_host_key=presented)
        elif pinned != presented:
            raise paramiko.SSHException(f"The SSH host key of {self.desktop_id} changed: refused.")


def desktop_ssh_connect(*, desktop_id: str, host: str, username: str | None = None, timeout: float = 10):
    """An SSH session into a desktop with the control plane's key."""
    control_plane_public_key()  # makes sure the pair exists
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(_PinnedHostKey(desktop_id))
    client.connect(
        host,
        port=settings.DESKTOP_SSH_PORT,
        username=username or settings.DESKTOP_SSH_USER,
        pkey=paramiko.Ed25519Key.from_private_key_file(str(settings.CONTROL_PLANE_SSH_KEY)),
        timeout=timeout,
        banner_timeout=timeout,
        auth_timeout=timeout,
        allow_agent=False,
        look_for_keys=False,
    )
    return client
