"""Shared pieces of the Proxmox driver tests: a running simulator and a driver wired to it."""

from __future__ import annotations

import functools
import secrets
import tempfile
import threading
from pathlib import Path

import pytest

from tests.pve.schema import SCHEMA_DIR, SCHEMA_FILE, Schema
from tests.pve.simulator import Simulator, TaskTimes
from workers.drivers.base import ControlPlane, InstanceSpec
from workers.drivers.proxmox import ProxmoxConfig, ProxmoxDriver

needs_schema = pytest.mark.skipif(
    not SCHEMA_FILE.is_file(),
    reason=f"the PVE API schema is not at {SCHEMA_FILE} (GPL/AGPL, kept beside the clone in ../shared/)",
)
TEMPLATE = 9000
CONTROL_CIDR = "10.10.0.5/32"
# Seconds a power task lasts when a test needs a retry, or another worker, to read the VM before the
# task ends: long enough for a busy machine.
SLOW_TASK = 1.0
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOv0Q0bVGbL7nJc3lYQ0T6SaoJ1NGQ3z0Dmp7Kx8t9bE lebureau-tests"


# Clusters run PVE 8 or 9: the contract suite runs against both schemas.
SCHEMA_VERSIONS = ("v8", "v9")


@functools.cache
def schema(version: str = "v9") -> Schema:
    path = SCHEMA_DIR / f"apidata-{version}.json"
    if not path.is_file():
        pytest.skip(f"the PVE {version} API schema is not at {path}")
    return Schema(path)


def simulator(
    nodes: dict[str, tuple[int, int]] | None = None, times: TaskTimes | None = None, version: str = "v9"
) -> Simulator:
    sim = Simulator(nodes or {"pve1": (65536, 16)}, times=times, schema=schema(version)).start()
    sim.add_template(TEMPLATE, next(iter(sim.nodes)))
    return sim


class GuestRecorder:
    """Stands for the SSH step: the simulator has no guest, so record what would be written."""

    def __init__(self):
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self.lock = threading.Lock()

    def __call__(self, spec: InstanceSpec, ip: str) -> None:
        with self.lock:
            self.calls.append((spec.key, ip, dict(spec.files)))


def control_plane() -> ControlPlane:
    """A control plane whose public key is SSH_KEY (the simulator never checks the private half)."""
    key = Path(tempfile.mkdtemp(prefix="pve-control-")) / "id_ed25519"
    key.with_suffix(".pub").write_text(SSH_KEY + "\n")
    return ControlPlane(ssh_key_path=key)


def driver_for(sim: Simulator, *, guest_setup=None, resolve=None, **overrides) -> ProxmoxDriver:
    """A driver on the simulator; ``overrides`` are ProxmoxConfig fields."""
    user, token_name, secret = sim.token
    options = {
        "host": sim.host,
        "token_user": user,
        "token_name": token_name,
        "token_secret": secret,
        "verify_ssl": sim.ca_path,
        "templates": {"minimal": TEMPLATE},
        "control_cidrs": (CONTROL_CIDR,),
        "poll_interval": 0.005,
        "agent_timeout": 5.0,
        "task_timeout": 10.0,
        "shutdown_timeout": 0,
        **overrides,
    }
    extra = {"resolve": resolve} if resolve is not None else {}
    return ProxmoxDriver(
        ProxmoxConfig(**options), control_plane(), guest_setup=guest_setup or GuestRecorder(), **extra
    )


def make_spec(**overrides) -> InstanceSpec:
    key = f"dsk_t{secrets.token_hex(6)}"
    values = {
        "key": key,
        "hostname": key,
        "vcpus": 1,
        "memory_mib": 1024,
        "disk_gib": 10,
        "ssh_public_key": SSH_KEY,
        "image_profile": "minimal",
        "files": {"/etc/bureau/token": "secret-token\n"},
    }
    values.update(overrides)
    return InstanceSpec(**values)
