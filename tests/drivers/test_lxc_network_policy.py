"""What the LXC engine's network policy refuses before touching the host."""

from __future__ import annotations

import pytest

from workers.drivers.base import DriverError, NetworkPolicy
from workers.drivers.lxc import LxcConfig, LxcDriver


def test_the_lxc_engine_refuses_domains_in_words(tmp_path):
    lxc = LxcDriver(
        LxcConfig(
            state_dir=tmp_path / "state",
            lxc_path=tmp_path / "lxc",
            lock_dir=tmp_path / "locks",
            dns_servers=(),
        )
    )
    with pytest.raises(DriverError, match="cannot allow domains by name"):
        lxc.apply_network_policy("dsk_any", NetworkPolicy(allowed_domains=("example.org",)))
