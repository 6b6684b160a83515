"""The control plane's own SSH identity, used to reach every desktop."""

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings


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
