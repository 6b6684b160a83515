"""The golden image: its metadata, the guest contract files, and the bureau helper."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGES_DIR = Path(os.environ.get("LEBUREAU_IMAGES_DIR", "/var/lib/lebureau/images"))
ID_BASE = 100000


def test_bureau_status_reports_the_desktop(tmp_path):
    (tmp_path / "desktop_id").write_text("dsk_ab12\n")
    (tmp_path / "profile").write_text("minimal\n")
    (tmp_path / "token").write_text("secret")
    result = subprocess.run(
        [sys.executable, str(REPO / "image-build" / "guest" / "bureau"), "status"],
        capture_output=True,
        text=True,
        env={**os.environ, "BUREAU_CONFIG_DIR": str(tmp_path)},
        check=True,
    )
    lines = dict(line.split(":", 1) for line in result.stdout.splitlines())
    assert lines["desktop"].strip() == "dsk_ab12"
    assert lines["profile"].strip() == "minimal"
    assert lines["token"].strip() == "present"
    assert lines["hostname"].strip()
    assert lines["uptime"].strip().count(":") == 2
    assert "secret" not in result.stdout


def test_bureau_status_without_a_token(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "image-build" / "guest" / "bureau"), "status"],
        capture_output=True,
        text=True,
        env={**os.environ, "BUREAU_CONFIG_DIR": str(tmp_path)},
        check=True,
    )
    assert "token:    missing" in result.stdout
    assert "not provisioned" in result.stdout


@pytest.fixture(scope="module")
def image():
    current = IMAGES_DIR / "minimal" / "current"
    if not (current / "image.json").is_file():
        pytest.skip(
            f"the minimal golden image is not built in {IMAGES_DIR}: run image-build/build.sh minimal"
        )
    return current.resolve()


def test_metadata_records_profile_date_and_package_hash(image):
    meta = json.loads((image / "image.json").read_text())
    assert meta["profile"] == "minimal"
    assert meta["build_id"] == image.name
    assert meta["built_at"].endswith("Z")
    packages = (image / "packages.txt").read_bytes()
    assert meta["packages_sha256"] == hashlib.sha256(packages).hexdigest()
    names = {line.split("=")[0] for line in packages.decode().splitlines()}
    assert {
        "openssh-server",
        "tigervnc-standalone-server",
        "openbox",
        "xterm",
        "python3",
        "sudo",
        "tmux",
    } <= names
    # The guest can read which build it runs.
    # The VM disk's entry is added to the record after the root filesystem (and its copy) is made.
    meta.pop("qcow2", None)
    assert json.loads((image / "rootfs" / "etc" / "bureau" / "image.json").read_text()) == meta


def test_rootfs_is_shifted_for_unprivileged_containers(image):
    rootfs = image / "rootfs"
    for path in ("etc/passwd", "usr/bin/sudo", "root"):
        info = (rootfs / path).lstat()
        assert (info.st_uid, info.st_gid) == (ID_BASE, ID_BASE), path
    sudo = (rootfs / "usr/bin/sudo").stat()
    assert sudo.st_mode & stat.S_ISUID, "shifting ownership must keep sudo setuid"
    agent_home = (rootfs / "home/agent").stat()
    assert agent_home.st_uid == ID_BASE + 1000


def test_guest_contract_files(image):
    rootfs = image / "rootfs"
    for path in (
        "usr/bin/Xvnc",
        "usr/sbin/sshd",
        "usr/bin/xterm",
        "usr/bin/openbox",
        "usr/bin/tmux",
        "usr/local/bin/bureau",
    ):
        # lexists: absolute symlinks (alternatives, systemd wants) point into the guest, not the host.
        assert os.path.lexists(rootfs / path), path
    wants = rootfs / "etc/systemd/system/multi-user.target.wants/bureau-vnc.service"
    assert os.readlink(wants) == "/etc/systemd/system/bureau-vnc.service"
    assert (rootfs / "etc/sudoers.d/agent").read_text().strip() == "agent ALL=(ALL) NOPASSWD:ALL"
    # Host keys are made per desktop at provision: an image with keys would share them.
    assert not list((rootfs / "etc/ssh").glob("ssh_host_*"))
    assert "PasswordAuthentication no" in (rootfs / "etc/ssh/sshd_config.d/bureau.conf").read_text()
