"""A TEST DOUBLE of a compute engine, for exercising the lifecycle without LXC or Proxmox.

Each instance is a JSON file in a directory shared by the test process and the
Celery worker. Faults are injected per hostname with a file in `faults/`:
{"step": "provision", "transient": true, "times": 2, "message": "…", "delay": 0.5}.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

from workers.drivers.base import (
    BlockedDestination,
    BlockedEgress,
    ComputeDriver,
    ControlPlane,
    DriverError,
    InstanceSpec,
    InstanceState,
    InstanceStatus,
    InstanceUsage,
    NetworkPolicy,
    Progress,
    ProvisionStep,
    TransientDriverError,
    no_progress,
)


class DirectoryDriver(ComputeDriver):
    name = "directory"

    def __init__(self, root: str | Path):
        self.root = Path(root)
        (self.root / "instances").mkdir(parents=True, exist_ok=True)
        (self.root / "faults").mkdir(exist_ok=True)

    @classmethod
    def from_env(cls, control_plane: ControlPlane) -> DirectoryDriver:
        return cls(os.environ["TEST_DRIVER_DIR"])

    @property
    def instance_id(self) -> str:
        return f"directory:{self.root}"

    # Test helpers

    def inject_fault(
        self, hostname: str, step: str, *, transient=False, times=1, message="injected", delay=0.0
    ):
        fault = {"step": step, "transient": transient, "times": times, "message": message, "delay": delay}
        (self.root / "faults" / f"{hostname}.json").write_text(json.dumps(fault))

    def plant(self, key: str, state: InstanceState = InstanceState.RUNNING) -> None:
        """Create an instance behind the control plane's back (an orphan, for reconcile tests)."""
        self._save(key, {"hostname": key, "state": state, "ip": self._ip(key), "policy": None})

    def power_off(self, key: str) -> None:
        """Stop the instance behind the control plane's back, as a restart of its host does."""
        data = self._require(key)
        data["state"] = InstanceState.STOPPED
        self._save(key, data)

    def vanish(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def set_disk_usage(self, key: str, used: int | None) -> None:
        """What `disk_usage` answers for the instance (None: cannot tell, as an unmounted disk)."""
        data = self._require(key)
        data["disk_bytes"] = used
        self._save(key, data)

    def set_usage(self, key: str, memory_bytes: int, cpu_seconds: float) -> None:
        """What `usage` answers for the instance: memory in use, CPU time since it started."""
        data = self._require(key)
        data["usage"] = [memory_bytes, cpu_seconds]
        self._save(key, data)

    def set_blocked(self, key: str, names: dict[str, int], addresses: dict[str, int]) -> None:
        """What `blocked_egress` answers: the engine's counters of refused look-ups and dropped packets."""
        data = self._require(key)
        data["blocked"] = [names, addresses]
        self._save(key, data)

    # The interface

    def provision(self, spec: InstanceSpec, progress: Progress = no_progress) -> InstanceStatus:
        for step in ProvisionStep:
            progress(step)
        self._maybe_fail(spec.hostname, "provision")
        if (data := self._load(spec.key)) is None:
            data = {
                "hostname": spec.hostname,
                "state": InstanceState.RUNNING,
                "ip": self._ip(spec.key),
                "policy": None,
                # What a fresh overlay holds: the image is below it, the desktop's writes in it.
                "disk_bytes": 64 * 1024**2,
            }
            self._save(spec.key, data)
        return self._status(spec.key, data)

    def start(self, key: str) -> InstanceStatus:
        return self._set(key, "start", InstanceState.RUNNING)

    def stop(self, key: str) -> InstanceStatus:
        return self._set(key, "stop", InstanceState.STOPPED)

    def suspend(self, key: str) -> InstanceStatus:
        return self._set(key, "suspend", InstanceState.SUSPENDED)

    def resume(self, key: str) -> InstanceStatus:
        return self._set(key, "resume", InstanceState.RUNNING)

    def destroy(self, key: str) -> None:
        if (data := self._load(key)) is not None:
            self._maybe_fail(data["hostname"], "destroy")
        self._path(key).unlink(missing_ok=True)

    def status(self, key: str) -> InstanceStatus:
        data = self._load(key)
        return InstanceStatus(key, InstanceState.ABSENT) if data is None else self._status(key, data)

    def list_instances(self) -> list[InstanceStatus]:
        return [self.status(path.stem) for path in sorted((self.root / "instances").glob("*.json"))]

    def disk_usage(self, key: str) -> int | None:
        data = self._load(key)
        return None if data is None else data.get("disk_bytes")

    def usage(self, key: str) -> InstanceUsage | None:
        data = self._load(key)
        return InstanceUsage(*data["usage"]) if data and data.get("usage") else None

    def blocked_egress(self, key: str) -> BlockedEgress | None:
        data = self._load(key)
        if data is None or "blocked" not in data:
            return None
        names, addresses = data["blocked"]
        return BlockedEgress(
            names=tuple(names.items()),
            addresses=tuple(BlockedDestination(a, packets, 0) for a, packets in addresses.items()),
        )

    def apply_network_policy(self, key: str, policy: NetworkPolicy) -> None:
        data = self._require(key)
        data["policy"] = {
            "allow_internet": policy.allow_internet,
            "allowed_cidrs": list(policy.allowed_cidrs),
        }
        self._save(key, data)

    # Internals

    def _set(self, key: str, step: str, state: InstanceState) -> InstanceStatus:
        data = self._require(key)
        self._maybe_fail(data["hostname"], step)
        data["state"] = state
        self._save(key, data)
        return self._status(key, data)

    def _require(self, key: str) -> dict:
        if (data := self._load(key)) is None:
            raise DriverError(f"No instance {key} exists.")
        return data

    def _status(self, key: str, data: dict) -> InstanceStatus:
        return InstanceStatus(key, InstanceState(data["state"]), data["ip"], ref=f"dir-{key}")

    @staticmethod
    def _ip(key: str) -> str:
        # An address from the documentation range: a label only, never contacted.
        return f"192.0.2.{int(hashlib.sha256(key.encode()).hexdigest(), 16) % 250 + 1}"

    def _path(self, key: str) -> Path:
        return self.root / "instances" / f"{key}.json"

    def _load(self, key: str) -> dict | None:
        try:
            return json.loads(self._path(key).read_text())
        except FileNotFoundError:
            return None

    def _save(self, key: str, data: dict) -> None:
        tmp = self._path(key).with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self._path(key))

    @contextmanager
    def _locked(self):
        with open(self.root / "faults.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _maybe_fail(self, hostname: str, step: str) -> None:
        path = self.root / "faults" / f"{hostname}.json"
        with self._locked():
            if not path.exists():
                return
            fault = json.loads(path.read_text())
            if fault["step"] != step or fault["times"] == 0:
                return
            fault["times"] -= 1
            path.write_text(json.dumps(fault))
        time.sleep(fault["delay"])
        if fault["message"] is None:
            return
        raise (TransientDriverError if fault["transient"] else DriverError)(fault["message"])
