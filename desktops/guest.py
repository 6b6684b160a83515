"""Reaching inside a desktop over SSH, with its host key pinned on first contact and insisted on after.

The pinning is the domain's (the key lives on the desktop's row); the session itself is the engines'
shared SSH helper.
"""

from __future__ import annotations

from pathlib import Path

import paramiko
from django.conf import settings

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
