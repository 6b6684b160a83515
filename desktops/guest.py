"""Reaching inside a desktop: over SSH, with its host key pinned on first contact and insisted on after
(the pinning is the domain's, the session the engines' shared SSH helper); and over VNC, with the
desktop's own passwords, which only the control plane can derive and which the relays use.
"""

from __future__ import annotations

import string
from pathlib import Path

import paramiko
from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES
from cryptography.hazmat.primitives.ciphers import Cipher, modes
from django.conf import settings
from django.utils.crypto import salted_hmac

from desktops.models import Desktop
from workers.drivers import ssh


def control_plane_key_path() -> Path:
    return Path(settings.CONTROL_PLANE_SSH_KEY)


def control_plane_public_key() -> str:
    return ssh.control_plane_public_key(control_plane_key_path())


def desktop_ssh_connect(
    *, desktop_id: str, host: str, username: str | None = None, timeout: float = 10
) -> paramiko.SSHClient:
    """An SSH session into a desktop with the control plane's key; a changed host key is refused."""
    pinned = Desktop.objects.filter(id=desktop_id).values_list("ssh_host_key", flat=True).first() or ""

    def pin(presented: str) -> None:
        Desktop.objects.filter(id=desktop_id, ssh_host_key="").update(ssh_host_key=presented)

    return ssh.connect(
        host=host,
        port=settings.DESKTOP_SSH_PORT,
        username=username or settings.DESKTOP_SSH_USER,
        key_path=control_plane_key_path(),
        pinned_host_key=pinned,
        on_first_host_key=pin,
        timeout=timeout,
    )


# Every terminal opened on a desktop attaches to one tmux session, on a tmux server of the terminals'
# own: a reload, a switch between watching and control, or a second person finds the same shell,
# its running programs and its screen. A viewer attaches read-only (tmux itself then ignores its
# keys, besides the relay dropping them). A desktop without tmux gives each terminal a shell of its own.
_TMUX = "tmux -L bureau"
_TERMINAL = {
    True: f"exec {_TMUX} new-session -A -s bureau",
    False: f"{_TMUX} new-session -d -s bureau 2>/dev/null; exec {_TMUX} attach-session -r -t bureau",
}


def terminal_command(*, control: bool) -> str:
    """The command a terminal of the desktop runs in its pseudo-terminal."""
    return f'command -v tmux >/dev/null || exec "${{SHELL:-/bin/sh}}" -l; {_TERMINAL[control]}'


# TigerVNC's fixed key for the password file (it obscures the passwords, it does not protect them).
VNC_FILE_KEY = bytes([23, 82, 107, 6, 35, 78, 88, 7])
VNC_PASSWORD_FILE = "/etc/bureau/vnc.passwd"  # noqa: S105 (a path, not a secret)
_VNC_ALPHABET = string.ascii_letters + string.digits


def vnc_des(key: bytes, data: bytes) -> bytes:
    """DES the way VNC uses it (RFC 6143 §7.2.2): the key is eight bytes, each with its bits reversed."""
    key = bytes(int(f"{b:08b}"[::-1], 2) for b in key[:8].ljust(8, b"\0"))
    # The same key three times makes triple DES plain DES.
    encryptor = Cipher(TripleDES(key * 3), modes.ECB()).encryptor()  # noqa: S305 (the protocol's choice)
    return encryptor.update(data) + encryptor.finalize()


def vnc_password(desktop_id: str, mode: str) -> bytes:
    """The desktop's VNC password for a relay of this mode; only the control plane can derive it.

    VNC authentication uses eight bytes; printable ones, because the server reads them as a C string.
    """
    digest = salted_hmac(f"lebureau.vnc.{mode}", desktop_id).digest()
    return "".join(_VNC_ALPHABET[b % len(_VNC_ALPHABET)] for b in digest[:8]).encode()


def vnc_password_file(desktop_id: str) -> bytes:
    """The desktop's VNC password file: the control password, then the view-only one (TigerVNC's format)."""
    return b"".join(vnc_des(VNC_FILE_KEY, vnc_password(desktop_id, mode)) for mode in ("control", "view"))
