"""A desktop's disk on this host: a sparse ext4 image of the plan's size, the overlay on top of it.

- ``<dir>/disk.img``, loop-mounted on ``<dir>/disk/``: its ``upper/`` is the overlay's upper layer, so
  everything the desktop writes lands there and writing past the cap is ENOSPC inside, never a full
  host;
- ``<dir>/rootfs/``: the overlay (golden image below, ``upper/`` above) mounted by the host and handed
  to LXC as a plain directory.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from workers.drivers.base import DriverError, TransientDriverError
from workers.drivers.lxc.network import run


def run_checked(command: list[str], what: str) -> None:
    result = run(command)
    if result.returncode != 0:
        raise DriverError(f"{what}: {result.stderr.strip() or f'exit code {result.returncode}'}")


def mountpoints() -> set[str]:
    with open("/proc/self/mountinfo") as f:
        # Field 5 is the mount point, with spaces and the like escaped in octal.
        return {line.split()[4].encode().decode("unicode_escape") for line in f}


def ensure_disk(base: Path, disk_gib: int) -> None:
    image = base / "disk.img"
    if image.exists():
        return
    # Formatted under a temporary name, so a crash never leaves a half-made disk behind.
    tmp = image.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.truncate(disk_gib * 1024**3)
    options = "lazy_itable_init=1,lazy_journal_init=1,nodiscard"
    run_checked(
        ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", options, str(tmp)],
        f"could not format the disk of desktop {base.name}",
    )
    tmp.replace(image)


def mount(base: Path, image: str, id_base: int) -> None:
    disk, rootfs = base / "disk", base / "rootfs"
    disk.mkdir(exist_ok=True)
    rootfs.mkdir(exist_ok=True)
    mounted = mountpoints()
    if str(disk) not in mounted:
        run_checked(
            ["mount", "-o", "loop", str(base / "disk.img"), str(disk)],
            f"could not mount the disk of {base.name}",
        )
    for name in ("upper", "work"):
        (disk / name).mkdir(exist_ok=True)
    # The upper layer's root is the guest's "/", owned by the guest's (mapped) root.
    os.chown(disk / "upper", id_base, id_base)
    if str(rootfs) not in mounted:
        lower = Path(image) / "rootfs"
        if not lower.is_dir():
            raise DriverError(f"the image build {image} that desktop {base.name} was cloned from is gone")
        options = f"lowerdir={lower},upperdir={disk / 'upper'},workdir={disk / 'work'}"
        run_checked(
            ["mount", "-t", "overlay", "overlay", "-o", options, str(rootfs)],
            f"could not mount the root of {base.name}",
        )


def used_bytes(base: Path) -> int | None:
    """What the desktop has written to its disk; None while the disk is not mounted (a stopped desktop)."""
    disk = base / "disk"
    if str(disk) not in mountpoints():
        return None
    stat = os.statvfs(disk)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def unmount(base: Path, required: bool) -> None:
    for path in (base / "rootfs", base / "disk"):
        deadline = time.monotonic() + 5
        while str(path) in mountpoints():
            result = run(["umount", str(path)])
            if result.returncode == 0:
                break
            if time.monotonic() > deadline:
                if not required:
                    # Still busy: left mounted, and start() reuses the mount as it is.
                    return
                raise TransientDriverError(
                    f"the disk of desktop {base.name} is busy: {result.stderr.strip()}"
                )
            time.sleep(0.1)
