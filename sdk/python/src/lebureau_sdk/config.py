"""Where the SDK and the CLI find the API and the key: arguments, then LEBUREAU_URL and LEBUREAU_API_KEY,
then the file `lebureau login` writes (~/.config/lebureau/config.json, readable by its owner only)."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_URL = "http://127.0.0.1:8000"


class NotConfigured(Exception):
    """No API key anywhere."""


def config_path() -> Path:
    home = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(home) / "lebureau" / "config.json"


def saved() -> dict:
    try:
        return json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {}


def save(base_url: str, api_key: str) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Readable by its owner alone before the key is written into it: created so, and an existing file
    # (whose mode os.open leaves as it was) made so.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump({"url": base_url, "api_key": api_key}, file)
    return path


def in_clear(url: str) -> bool:
    """Whether a key sent to the URL crosses a network unencrypted: plain http to another machine."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        return False
    host = parts.hostname or ""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name: another machine, as far as the CLI knows


def resolve(base_url: str | None, api_key: str | None) -> tuple[str, str]:
    stored = saved()
    url = base_url or os.environ.get("LEBUREAU_URL") or stored.get("url") or DEFAULT_URL
    key = api_key or os.environ.get("LEBUREAU_API_KEY") or stored.get("api_key")
    if not key:
        raise NotConfigured("No API key: pass api_key, set LEBUREAU_API_KEY, or run `lebureau login`.")
    return url.rstrip("/"), key
