"""The LXC engine's disk measure, without containers: it reads a mounted disk and nothing else."""

import os

from workers.drivers.lxc import storage


def test_used_bytes_of_a_mounted_disk_and_unknown_once_unmounted(tmp_path, monkeypatch):
    disk = tmp_path / "disk"
    disk.mkdir()
    monkeypatch.setattr(storage, "mountpoints", lambda: {str(disk)})
    stat = os.statvfs(disk)
    assert 0 < storage.used_bytes(tmp_path) <= stat.f_blocks * stat.f_frsize
    # A stopped desktop's disk is unmounted: what is under the mount point is not its disk.
    monkeypatch.setattr(storage, "mountpoints", set)
    assert storage.used_bytes(tmp_path) is None
