"""Platform key hashing and at-rest encryption of BYOK secrets."""

import hashlib
import hmac
import secrets

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

TOKEN_PREFIX = "lb_"  # noqa: S105 (a label, not a secret)


def api_token_new() -> tuple[str, str]:
    """A fresh platform token and its lookup prefix."""
    prefix = secrets.token_hex(6)
    return f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}", prefix


def api_token_prefix(token: str) -> str | None:
    if not token.startswith(TOKEN_PREFIX):
        return None
    prefix, _, rest = token[len(TOKEN_PREFIX) :].partition("_")
    return prefix if prefix and rest else None


def api_token_hash(token: str) -> str:
    return hmac.new(settings.API_KEY_HMAC_SECRET.encode(), token.encode(), hashlib.sha256).hexdigest()


def _fernet() -> MultiFernet:
    return MultiFernet([Fernet(key) for key in settings.LLM_KEY_ENCRYPTION_KEYS])


def secret_encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode()


def secret_decrypt(ciphertext: str) -> str:
    try:
        return _fernet().decrypt(ciphertext.encode()).decode()
    except InvalidToken as exc:
        raise ValueError(
            "This secret was encrypted with a key no longer in LLM_KEY_ENCRYPTION_KEYS."
        ) from exc
