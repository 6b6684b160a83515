"""The contract suite against the directory test double (keeps the suite itself honest)."""

import secrets

import pytest

from tests.drivers.contract import DriverContract
from tests.support.directory_driver import DirectoryDriver
from workers.drivers.base import InstanceSpec


class TestDirectoryDriver(DriverContract):
    @pytest.fixture
    def driver(self, tmp_path):
        return DirectoryDriver(tmp_path)

    @pytest.fixture
    def spec(self):
        key = f"dsk_t{secrets.token_hex(6)}"
        return InstanceSpec(
            key=key, hostname=key, vcpus=1, memory_mib=512, disk_gib=1, ssh_public_key="ssh-ed25519 AAAA"
        )
