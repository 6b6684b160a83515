"""The PVE API as the driver uses it: one client per process, refusals turned into driver errors,
tasks followed to their end, and the cluster's VMs found by their tags.

PVE answers most refusals with HTTP 500 and its message in the reason phrase. Locks, lock timeouts,
quorum loss, proxy errors (>= 502) and network failures are transient; every other refusal is
permanent and carries PVE's own words, since retrying "does not exist" only delays it. Every PVE task
is followed through its UPID, on the node the UPID names, and only ``OK`` or ``WARNINGS: n`` count as
success.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

import requests
from proxmoxer import ProxmoxAPI, ResourceException

from workers.drivers.base import DriverError, TransientDriverError, guest_hostname
from workers.drivers.proxmox.config import ProxmoxConfig

OWNER_TAG = "lebureau"
# The tag naming a desktop's workspace is this prefix and the workspace's id.
WORKSPACE_TAG = "lbws-"
_KEY = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
# PVE refusals worth retrying: someone else holds the VM, or the cluster is briefly unwell.
_TRANSIENT = re.compile(
    r"VM is locked|can't lock file|got timeout|timeout|no quorum|cluster not ready|"
    r"detected modified configuration|temporarily unavailable",
    re.IGNORECASE,
)


@dataclass
class PveVm:
    """A VM as /cluster/resources lists it, refreshed in place as the driver acts on it."""

    vmid: int
    node: str
    name: str
    status: str
    tags: tuple[str, ...]
    lock: str


class PveApi:
    def __init__(self, config: ProxmoxConfig):
        self.config = config
        self.connection = {
            "host": config.host,
            "user": config.token_user,
            "token_name": config.token_name,
            "token_value": config.token_secret,
            "verify_ssl": config.verify_ssl,
            "timeout": config.api_timeout,
        }
        self._client: tuple[int, ProxmoxAPI] | None = None

    @property
    def api(self) -> ProxmoxAPI:
        # One client per process: a forked Celery worker must not share its parent's connections.
        if self._client is None or self._client[0] != os.getpid():
            self._client = (os.getpid(), ProxmoxAPI(backend="https", service="PVE", **self.connection))
        return self._client[1]

    def vm(self, vm: PveVm):
        return self.api.nodes(vm.node).qemu(vm.vmid)

    def call(self, what: str, function, *args, **kwargs):
        """Run API calls, turning PVE's refusals into driver errors carrying PVE's message."""
        try:
            return function(*args, **kwargs)
        except ResourceException as exc:
            raise self.error(what, exc) from exc
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise TransientDriverError(f"Proxmox did not answer ({what}): {exc}") from exc

    @staticmethod
    def error(what: str, exc: ResourceException) -> DriverError:
        message = pve_message(exc)
        error = TransientDriverError if _transient(exc.status_code, message) else DriverError
        return error(f"Proxmox refused to {what}: {message}")

    def task(self, vm: PveVm, what: str, function, **params) -> None:
        upid = self.call(f"{what} VM {vm.vmid}", function, **params)
        self.wait_task(upid, f"{what} VM {vm.vmid}")

    def wait_task(
        self, upid: str, what: str, timeout: float | None = None, *, accept: re.Pattern | None = None
    ) -> str:
        """Follow a task to its end and return its exit status; ``accept`` matches failures that the
        caller counts as done."""
        node = upid.split(":")[1]
        deadline = time.monotonic() + (timeout or self.config.task_timeout)
        while True:
            task = self.call(f"follow the task of {what}", self.api.nodes(node).tasks(upid).status.get)
            if task["status"] == "stopped":
                exit_status = task.get("exitstatus", "")
                if exit_status == "OK" or exit_status.startswith("WARNINGS"):
                    return exit_status
                if accept and accept.search(exit_status):
                    return exit_status
                error = TransientDriverError if _TRANSIENT.search(exit_status) else DriverError
                raise error(f"Proxmox could not {what}: {exit_status}")
            if time.monotonic() > deadline:
                raise TransientDriverError(f"Proxmox is still working to {what} ({upid}); giving up waiting")
            time.sleep(self.config.poll_interval)

    # -- finding VMs --------------------------------------------------------------------------

    def vms(self) -> list[PveVm]:
        resources = self.call("list VMs", self.api.cluster.resources.get, type="vm")
        return [
            PveVm(
                vmid=int(r["vmid"]),
                node=r["node"],
                name=r.get("name", ""),
                status=r.get("status", "stopped"),
                tags=tuple(t for t in re.split(r"[;, ]+", r.get("tags", "")) if t),
                lock=r.get("lock", ""),
            )
            for r in resources
            if r.get("type") == "qemu" and not r.get("template")
        ]

    def find(self, key: str) -> PveVm | None:
        name = vm_name(key)
        matches = [vm for vm in self.vms() if key in vm.tags or vm.name == name]
        if len(matches) > 1:
            ids = ", ".join(str(vm.vmid) for vm in matches)
            raise DriverError(f"desktop {key} matches several VMs ({ids}): remove the strays by hand")
        return matches[0] if matches else None

    def existing(self, key: str, action: str) -> PveVm:
        vm = self.find(checked_key(key))
        if vm is None:
            raise DriverError(f"cannot {action} desktop {key}: it has no VM on the Proxmox cluster")
        return self.wait_unlocked(vm)

    def refresh(self, vm: PveVm) -> dict:
        return self.call(f"read the status of VM {vm.vmid}", self.vm(vm).status.current.get)

    def paused(self, vm: PveVm) -> bool:
        return self.refresh(vm).get("qmpstatus") in ("paused", "suspended")

    def wait_unlocked(self, vm: PveVm) -> PveVm:
        """A VM in the middle of a clone is waited for; any other lock is someone else's work: retry later."""
        deadline = time.monotonic() + self.config.task_timeout
        while vm.lock:
            if vm.lock != "clone" or time.monotonic() > deadline:
                raise TransientDriverError(f"VM {vm.vmid} is locked ({vm.lock}); retrying later")
            time.sleep(self.config.poll_interval)
            current = self.refresh(vm)
            vm.lock, vm.status = current.get("lock", ""), current["status"]
        vm.status = self.refresh(vm)["status"]
        return vm


def vm_name(key: str) -> str:
    """The VM's name, which cloud-init also makes the guest's first hostname."""
    return guest_hostname(key)


def workspace_tag(workspace: str) -> str:
    return WORKSPACE_TAG + workspace


def desktop_tags(key: str, workspace: str) -> tuple[str, ...]:
    """Our owner tag, the desktop's key and, when known, its workspace."""
    if not workspace:
        return (OWNER_TAG, key)
    if not _KEY.fullmatch(workspace):
        raise DriverError(
            f"{workspace!r} is not a valid workspace id (lowercase letters, digits, '_' and '-')"
        )
    return (OWNER_TAG, key, workspace_tag(workspace))


def key_of(vm: PveVm) -> str:
    """The desktop key among a VM's tags; VMs without our owner tag (or pool members) have none."""
    if OWNER_TAG not in vm.tags:
        return ""
    return next((t for t in vm.tags if t != OWNER_TAG and not t.startswith(WORKSPACE_TAG)), "")


def checked_key(key: str) -> str:
    # Keys become PVE tags and VM names: lowercase letters, digits, '_' and '-'.
    if not _KEY.fullmatch(key or ""):
        raise DriverError(f"{key!r} is not a valid desktop key (lowercase letters, digits, '_' and '-')")
    return key


def pve_message(exc: ResourceException) -> str:
    message = (exc.content or exc.status_message or "").strip()
    if exc.errors:
        details = exc.errors if isinstance(exc.errors, dict) else {"": exc.errors}
        message += " " + "; ".join(f"{k}: {v}".strip(": ") for k, v in details.items())
    return message


def _transient(status: int, message: str) -> bool:
    return status >= 502 or status == 429 or (status == 500 and bool(_TRANSIENT.search(message)))
