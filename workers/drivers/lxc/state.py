"""What the LXC engine keeps of each desktop on this host, and the locks that serialise work on it.

``<state_dir>/<key>/meta.json`` holds what the driver knows of a desktop: its address, image build,
interface names and egress policy. It is the engine's only record, so its address leases are the
addresses the ``meta.json`` files hold: nothing else can drift from them.

A desktop taken from the warm pool keeps the container it was booted as (a running container cannot
be renamed): ``<state_dir>/<key>`` is then a link to that container's directory, whose record names
the desktop's key and the ``container``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import time
from pathlib import Path

from workers.drivers.base import DriverError

# The lock that every change of the host's network (addresses, bridge, firewall) takes.
NETWORK_LOCK = ".network"
# When the last render of the firewall that succeeded began: this boot's id and its monotonic clock.
NETWORK_SYNCED = "network.synced"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def checked_key(key: str) -> str:
    # Keys become container names, paths and lock files: refuse anything that could escape them.
    if (
        not key
        or len(key) > 64
        or not all(c.isascii() and (c.isalnum() or c in "_-") for c in key)
        or key[0] in "-_"
    ):
        raise DriverError(f"{key!r} is not a valid desktop key (letters, digits, '_' and '-', at most 64)")
    return key


class DesktopStore:
    def __init__(self, state_dir: Path, lxc_path: Path, lock_dir: Path):
        self.state_dir, self.lxc_path, self.lock_dir = state_dir, lxc_path, lock_dir
        for directory in (state_dir, lxc_path, lock_dir):
            directory.mkdir(parents=True, exist_ok=True)

    def dir(self, key: str) -> Path:
        path = self.state_dir / key
        # The real path: mounts are listed under it.
        return path.resolve() if path.is_symlink() else path

    def container(self, key: str) -> str:
        """The name of the desktop's container: its key, unless it came from the warm pool."""
        return (self.read(key) or {}).get("container", key)

    def alias(self, key: str, container: str) -> None:
        """Make ``key`` name the desktop that runs as ``container``."""
        link = self.state_dir / key
        tmp = self.state_dir / f".{key}.link"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(container)
        tmp.replace(link)

    def forget(self, key: str) -> None:
        """Remove the desktop's record, and its key's link if it had one."""
        path = self.state_dir / key
        real = self.dir(key)
        if path.is_symlink():
            path.unlink()
        if real.exists():
            shutil.rmtree(real)

    def config_path(self, key: str) -> Path:
        """The container's LXC configuration: its presence is the container's existence."""
        return self.lxc_path / self.container(key) / "config"

    def read(self, key: str) -> dict | None:
        try:
            return json.loads((self.dir(key) / "meta.json").read_text())
        except FileNotFoundError:
            return None

    def write(self, key: str, meta: dict) -> None:
        self.dir(key).mkdir(parents=True, exist_ok=True)
        path = self.dir(key) / "meta.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=2))
        tmp.replace(path)

    def all(self) -> list[dict]:
        metas = []
        # Each once: under its container's directory, not again under a pool desktop's link.
        for path in self.state_dir.glob("*/meta.json"):
            if path.parent.is_symlink():
                continue
            # A desktop being destroyed at the same moment is simply not counted.
            with contextlib.suppress(OSError, ValueError):
                metas.append(json.loads(path.read_text()))
        return metas

    def existing(self, key: str, action: str) -> dict:
        meta = self.read(key)
        if meta is None or not self.config_path(key).exists():
            raise DriverError(f"cannot {action} desktop {key}: it does not exist on this host")
        return meta

    @staticmethod
    def clock() -> float:
        # The same in every process of the host; never compared across a reboot (see BOOT_ID).
        return time.monotonic()

    def network_synced_since(self, moment: float) -> bool:
        """Whether a render of the firewall that began after `moment` (of this boot) succeeded."""
        try:
            boot, began = (self.lock_dir / NETWORK_SYNCED).read_text().split()
            return boot == BOOT_ID and float(began) > moment
        except (OSError, ValueError):
            return False

    def network_synced(self, began: float) -> None:
        (self.lock_dir / NETWORK_SYNCED).write_text(f"{BOOT_ID} {began!r}")

    @contextlib.contextmanager
    def locked(self, name: str, wait: bool = True):
        """An exclusive lock across processes: per desktop key, or NETWORK_LOCK for the host's network.
        Without ``wait``, yields False at once if another holds it."""
        with open(self.lock_dir / f"{name}.lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
