"""A stateful Proxmox VE API simulator over real HTTPS on loopback, so proxmoxer runs unchanged.

What it is: every request is checked against the official API schema (``schema.py``), then served
from in-memory state: nodes with memory and CPU, VMs with configs and digests, ``lock: clone``
during a clone, UPID tasks that last a configurable time and can be made to fail, the guest agent
answering some time after start, firewall options, rules and IP sets, each node's firewall log (its
lines written as pvefw-logger writes them, for the packets a test says a VM sent and its firewall
dropped: ``drop_outbound``), ``vncproxy`` tickets and a
``vncwebsocket`` that upgrades to a real WebSocket carrying a small RFB server behind VNC
authentication (``console.py``), API token auth with privilege checks (PVE's own "and"/"or"/"perm"
rules from the schema). Errors have PVE's shape: the message in the HTTP reason phrase and in
``message``, per-parameter ``errors`` for a 400. Its own answers are checked against the schema's
documented return types too. As in PVE, a VM's power tasks take its config lock in turn, and what
a worker checks once forked (a start of a running VM) fails the task, not the request.

What it is not: there is no guest. Nothing boots, no disk is written, SSH into a VM is impossible;
the guest agent's address is invented, the console's screen is blank. Time-based states are
evaluated lazily on each request.
"""

from __future__ import annotations

import datetime
import hashlib
import http.server
import ipaddress
import itertools
import json
import re
import secrets
import socket
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.pve import console
from tests.pve.schema import Schema, SchemaError, return_errors

MIB = 1024 * 1024
GIB = 1024 * MIB
# Memory a node's host itself uses, as /cluster/resources reports it.
HOST_MEMORY = 2 * GIB
TOKEN_USER = "lebureau@pve"
TOKEN_ID = "driver"
# PVE accepts a VNC ticket for 40 s (``verify_vnc_ticket``); ``qm vncproxy`` expires the VM's VNC
# password 30 s after setting it.
VNC_TICKET_LIFETIME = 40.0
VNC_PASSWORD_LIFETIME = 30.0


@dataclass
class TaskTimes:
    """Seconds each kind of task (or guest milestone) takes; zero for tests, AgentLab's for the bench."""

    clone: float = 0.0
    start: float = 0.0
    shutdown: float = 0.0
    stop: float = 0.0
    suspend: float = 0.0
    resume: float = 0.0
    destroy: float = 0.0
    resize: float = 0.0
    agent: float = 0.0  # after the start task ends, the guest agent answers
    cloudinit: float = 0.0  # after the start task ends, cloud-init has finished

    @classmethod
    def agentlab(cls) -> TaskTimes:
        """AgentLab's published medians for a linked-clone VM."""
        return cls(clone=2.5, start=10.0, cloudinit=6.0, agent=3.0, shutdown=2.0, stop=0.5, destroy=1.0)


class ApiError(Exception):
    def __init__(self, status: int, message: str, errors: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.errors = status, message, errors


class AnswerLost(Exception):
    """The request was served, but its answer never reaches the client."""


@dataclass
class Vm:
    vmid: int
    node: str
    config: dict[str, str]
    status: str = "stopped"
    paused: bool = False
    started_at: float = 0.0
    ip: str = ""
    # What a guest whose root lies makes its agent report, instead of the address it really has.
    claimed_ips: tuple[str, ...] = ()
    ignores_shutdown: bool = False
    fw_options: dict[str, str] = field(default_factory=dict)
    fw_rules: list[dict[str, str]] = field(default_factory=list)
    ipsets: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    ipset_comments: dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        return _digest(self.config)

    @property
    def memory_mib(self) -> int:
        return int(self.config.get("memory", "512").split(",")[0].removeprefix("current="))

    @property
    def cores(self) -> int:
        return int(self.config.get("cores", "1"))


def _digest(value: object) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()  # noqa: S324 (PVE's choice)


@dataclass
class VncTicket:
    vmid: int
    port: int
    password: str
    issued_at: float


@dataclass
class Task:
    upid: str
    node: str
    kind: str
    user: str
    starttime: float
    ends_at: float
    exitstatus: str
    on_end: object  # callable(ok: bool), applied once when the task ends
    vmid: int
    locks_vm: bool  # the worker holds the VM's config lock from begins_at to ends_at
    begins_at: float
    check: object = None  # callable() -> str | None, run as the worker begins: why it dies, if it does
    done: bool = False


class Simulator:
    def __init__(
        self,
        nodes: dict[str, tuple[int, int]],
        times: TaskTimes | None = None,
        schema: Schema | None = None,
        token_secret: str | None = None,
    ):
        """``nodes``: name -> (memory in MiB, CPUs)."""
        self.nodes = {
            name: {"maxmem": mem * MIB, "maxcpu": cpus, "online": True} for name, (mem, cpus) in nodes.items()
        }
        self.times = times or TaskTimes()
        self.schema = schema or Schema()
        self.token_secret = token_secret or secrets.token_hex(16)
        self.privileges: set[str] | None = None  # None: every privilege
        self.lock = threading.RLock()
        self.vms: dict[int, Vm] = {}
        self.tasks: dict[str, Task] = {}
        self.requests: list[tuple[str, str, dict]] = []
        self._faults: list[tuple[str, re.Pattern, int, str]] = []
        self._lost: list[tuple[str, re.Pattern]] = []
        self._delays: list[tuple[str, re.Pattern, float]] = []
        self._stolen_ids = 0
        self._task_faults: dict[str, list[str]] = {}
        self._vnc_tickets: dict[str, VncTicket] = {}
        # Each node's /var/log/pve-firewall.log since its last rotation, line by line.
        self.firewall_logs: dict[str, list[str]] = {name: [] for name in nodes}
        self.vnc_ticket_lifetime = VNC_TICKET_LIFETIME
        self.vnc_password_lifetime = VNC_PASSWORD_LIFETIME
        self._pids = itertools.count(0x1000)
        self._ips = (str(ip) for ip in ipaddress.ip_network("10.220.0.0/16").hosts())
        self._server: http.server.ThreadingHTTPServer | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="pve-sim-")
        self.ca_path = str(Path(self._tmp.name) / "cert.pem")

    # -- test controls ------------------------------------------------------------------------

    def add_template(self, vmid: int, node: str, name: str = "bureau-template", disk_gib: int = 8) -> None:
        with self.lock:
            self.vms[vmid] = Vm(
                vmid,
                node,
                {
                    "name": name,
                    "template": "1",
                    "cores": "1",
                    "memory": "1024",
                    "agent": "1",
                    "scsi0": f"local-lvm:base-{vmid}-disk-0,size={disk_gib}G",
                    "ide2": "local-lvm:cloudinit,media=cdrom",
                    "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0",
                },
            )

    def fail_request(self, method: str, path_pattern: str, status: int, message: str, times: int = 1) -> None:
        """The next ``times`` matching requests fail with this status and message."""
        with self.lock:
            self._faults.extend([(method, re.compile(path_pattern), status, message)] * times)

    def lose_answers(self, method: str, path_pattern: str, times: int = 1) -> None:
        """The next ``times`` matching requests are served, then their connection closes unanswered."""
        with self.lock:
            self._lost.extend([(method, re.compile(path_pattern))] * times)

    def delay_requests(self, method: str, path_pattern: str, seconds: float) -> None:
        """Matching requests are answered this long after being served, so concurrent callers overlap."""
        with self.lock:
            self._delays.append((method, re.compile(path_pattern), seconds))

    def steal_next_ids(self, times: int = 1) -> None:
        """Another client takes each of the next ``times`` VMIDs right after ``nextid`` offers it."""
        with self.lock:
            self._stolen_ids += times

    def fail_task(self, kind: str, exitstatus: str) -> None:
        """The next task of this kind (``qmclone``, ``qmstart``…) ends with ``exitstatus``."""
        with self.lock:
            self._task_faults.setdefault(kind, []).append(exitstatus)

    def cloudinit_done_at(self, vmid: int) -> float:
        with self.lock:
            vm = self.vms[vmid]
            return vm.started_at + self.times.cloudinit

    def vm_by_name(self, name: str) -> Vm:
        with self.lock:
            return next(vm for vm in self.vms.values() if vm.config.get("name") == name)

    def guest_claims(self, vmid: int, *addresses: str) -> None:
        """Root in the VM makes its guest agent report these addresses as well as its own."""
        with self.lock:
            self.vms[vmid].claimed_ips = addresses

    def drop_outbound(
        self, vmid: int, dest: str, *, dport: int = 443, rule_dest: str = "", at: float | None = None
    ) -> bool:
        """The VM sent a TCP SYN to ``dest`` and its firewall dropped it: by its outbound policy, or by
        its DROP rule to ``rule_dest`` (an address or "+ipset"). Logged as PVE logs it, if the VM's
        firewall says to (the policy's ``log_level_out``, the rule's ``log``); True when it was."""
        with self.lock:
            vm = self.vms[vmid]
            if rule_dest:
                rule = next(
                    r
                    for r in vm.fw_rules
                    if (r["type"], r["action"], r.get("dest")) == ("out", "DROP", rule_dest)
                )
                level, message = rule.get("log", "nolog"), "DROP: "
            else:
                assert vm.fw_options.get("policy_out") == "DROP", f"VM {vmid}'s outbound policy drops nothing"
                level, message = vm.fw_options.get("log_level_out", "nolog"), "policy DROP: "
            if level == "nolog":
                return False
            self.firewall_logs[vm.node].append(firewall_log_line(vm, level, message, dest, dport, at))
            return True

    def log_firewall(self, node: str, line: str) -> None:
        """A line of the node's firewall log as it stands (another VM's, pvefw-logger's own)."""
        with self.lock:
            self.firewall_logs[node].append(line)

    # -- server -------------------------------------------------------------------------------

    def start(self) -> Simulator:
        _self_signed(Path(self._tmp.name))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca_path, str(Path(self._tmp.name) / "key.pem"))
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
        self._tmp.cleanup()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def token(self) -> tuple[str, str, str]:
        return TOKEN_USER, TOKEN_ID, self.token_secret

    # -- dispatch -----------------------------------------------------------------------------

    def handle(self, method: str, path: str, params: dict[str, str], auth: str) -> object:
        expected = f"PVEAPIToken={TOKEN_USER}!{TOKEN_ID}={self.token_secret}"
        if not auth.startswith("PVEAPIToken="):
            raise ApiError(401, "No ticket")
        if auth != expected:
            raise ApiError(401, "authentication failure")
        if not path.startswith("/api2/json/"):
            raise ApiError(501, f"Method '{method} {path}' not implemented")
        path = path.removeprefix("/api2/json")
        try:
            template, info, path_params = self.schema.endpoint(path, method)
        except SchemaError as exc:
            raise ApiError(exc.status, exc.message) from exc
        overlap = set(params) & set(path_params)
        if overlap:
            raise ApiError(
                400, "Parameter verification failed.", dict.fromkeys(overlap, "duplicate parameter")
            )
        params = {**params, **path_params}
        errors = self.schema.validate(info, params)
        if errors:
            raise ApiError(400, "Parameter verification failed.", errors)
        self._check_permission(info, params)
        with self.lock:
            self.requests.append((method, path, params))
            for fault in self._faults:
                if fault[0] == method and fault[1].search(path):
                    self._faults.remove(fault)
                    raise ApiError(fault[2], fault[3])
            self._tick()
            handler = ROUTES.get((method, template))
            if handler is None:
                raise ApiError(501, f"Method '{method} {path}' not implemented in the simulator")
            answer = handler(self, params)
            departures = return_errors(info.get("returns") or {}, answer)
            if departures:
                raise AssertionError(
                    f"the simulator's answer to {method} {template}: {'; '.join(departures)}"
                )
            delay = sum(d[2] for d in self._delays if d[0] == method and d[1].search(path))
            lost = next((lost for lost in self._lost if lost[0] == method and lost[1].search(path)), None)
            if lost:
                self._lost.remove(lost)
        time.sleep(delay)
        if lost:
            raise AnswerLost
        return answer

    def _check_permission(self, info: dict, params: dict[str, str]) -> None:
        check = (info.get("permissions") or {}).get("check")
        if self.privileges is not None and check:
            failed = self._failed_check(check, params)
            if failed:
                raise ApiError(403, f"Permission check failed ({failed})")

    def _failed_check(self, check: list, params: dict[str, str]) -> str | None:
        """The first unmet part of a PVE permission check ("and", "or", "perm"), None when it holds."""
        if check[0] in ("and", "or"):
            failures = [self._failed_check(part, params) for part in check[1:]]
            unmet = [f for f in failures if f]
            if check[0] == "and":
                return unmet[0] if unmet else None
            return None if len(unmet) < len(failures) else unmet[0]
        if check[0] != "perm":
            return None
        options = check[3:]
        if "require_param" in options and options[options.index("require_param") + 1] not in params:
            return "parameter missing"
        wanted = check[2]
        held = [p for p in wanted if p in self.privileges]
        if ("any" in options and held) or len(held) == len(wanted):
            return None
        where = re.sub(r"\{(\w+)\}", lambda m: params.get(m.group(1), m.group(0)), check[1])
        return f"{where}, {'|'.join(wanted)}"

    # -- tasks --------------------------------------------------------------------------------

    def _task(
        self, node: str, kind: str, vmid: int, duration: float, on_end, *, locks_vm=False, check=None
    ) -> str:
        now = time.time()
        user = f"{TOKEN_USER}!{TOKEN_ID}"
        upid = f"UPID:{node}:{next(self._pids):08X}:{int(now * 100):08X}:{int(now):08X}:{kind}:{vmid}:{user}:"
        faults = self._task_faults.get(kind)
        exitstatus = faults.pop(0) if faults else "OK"
        begins = now
        if locks_vm:
            # PVE's power workers take the VM's config lock (lock_config): each waits for the one before.
            holders = [t.ends_at for t in self.tasks.values() if t.locks_vm and t.vmid == vmid and not t.done]
            begins = max([now, *holders])
        self.tasks[upid] = Task(
            upid, node, kind, user, now, begins + duration, exitstatus, on_end, vmid, locks_vm, begins, check
        )
        self._tick()
        return upid

    def _tick(self) -> None:
        now = time.time()
        # In creation order, so a task that waited for a VM's lock sees what the one before it did.
        for task in self.tasks.values():
            if task.done:
                continue
            if task.check and task.begins_at <= now:
                failure, task.check = task.check(), None
                if failure:
                    task.exitstatus, task.ends_at = failure, task.begins_at
            if task.ends_at <= now:
                task.done = True
                task.on_end(task.exitstatus == "OK" or task.exitstatus.startswith("WARNINGS"))

    # -- helpers ------------------------------------------------------------------------------

    def _vm(self, params: dict[str, str]) -> Vm:
        vmid = int(params["vmid"])
        vm = self.vms.get(vmid)
        if vm is None or vm.node != params["node"]:
            raise ApiError(
                500, f"Configuration file 'nodes/{params['node']}/qemu-server/{vmid}.conf' does not exist"
            )
        return vm

    @staticmethod
    def _unlocked(vm: Vm) -> None:
        if "lock" in vm.config:
            raise ApiError(500, f"VM is locked ({vm.config['lock']})")

    def _running(self, vm: Vm) -> None:
        if vm.status != "running":
            raise ApiError(500, f"VM {vm.vmid} not running")


def _cluster_resources(sim: Simulator, params):
    kind = params.get("type")
    out = []
    if kind in (None, "node"):
        for name, node in sim.nodes.items():
            running = [vm for vm in sim.vms.values() if vm.node == name and vm.status == "running"]
            out.append(
                {
                    "id": f"node/{name}",
                    "type": "node",
                    "node": name,
                    "status": "online" if node["online"] else "offline",
                    "maxmem": node["maxmem"],
                    "mem": HOST_MEMORY + sum(vm.memory_mib * MIB for vm in running),
                    "maxcpu": node["maxcpu"],
                    "cpu": 0.02,
                }
            )
    if kind in (None, "vm"):
        for vm in sim.vms.values():
            entry = {
                "id": f"qemu/{vm.vmid}",
                "type": "qemu",
                "vmid": vm.vmid,
                "node": vm.node,
                "name": vm.config.get("name", f"VM {vm.vmid}"),
                "status": vm.status,
                "maxmem": vm.memory_mib * MIB,
                "maxcpu": vm.cores,
                "template": int(vm.config.get("template", "0")),
            }
            for key in ("tags", "lock"):
                if key in vm.config:
                    entry[key] = vm.config[key]
            out.append(entry)
    return out


def _nextid(sim: Simulator, params):
    vmid = next(i for i in itertools.count(100) if i not in sim.vms)
    if sim._stolen_ids:
        sim._stolen_ids -= 1
        sim.vms[vmid] = Vm(vmid, next(iter(sim.nodes)), {"name": "someone-else", "memory": "512"})
    return str(vmid)


def _clone(sim: Simulator, params):
    source = sim._vm(params)
    newid = int(params["newid"])
    full = params.get("full") == "1"
    if source.config.get("template") != "1" and not full:
        raise ApiError(500, "Linked clone feature is not supported for drive 'scsi0'")
    target = params.get("target", source.node)
    if target not in sim.nodes:
        raise ApiError(500, f"no such cluster node '{target}'")
    if newid in sim.vms:
        raise ApiError(500, f"unable to create VM {newid}: config file already exists")
    config = {k: v for k, v in source.config.items() if k != "template"}
    config["scsi0"] = re.sub(r"^[^,]+", f"local-lvm:vm-{newid}-disk-0", config["scsi0"])
    config["name"] = params.get("name", f"Copy-of-VM-{source.config.get('name', source.vmid)}")
    config["lock"] = "clone"
    clone = sim.vms[newid] = Vm(newid, target, config)

    def end(ok: bool) -> None:
        if ok:
            clone.config.pop("lock", None)
        else:
            sim.vms.pop(newid, None)

    return sim._task(source.node, "qmclone", source.vmid, sim.times.clone, end)


def _get_config(sim: Simulator, params):
    vm = sim._vm(params)
    return {**vm.config, "digest": vm.digest}


def _put_config(sim: Simulator, params):
    vm = sim._vm(params)
    sim._unlocked(vm)
    if params.get("digest") and params["digest"] != vm.digest:
        raise ApiError(500, "detected modified configuration - file changed by other user? Try again.")
    changes = {k: v for k, v in params.items() if k not in ("node", "vmid", "digest", "delete", "skiplock")}
    for key in filter(None, re.split(r"[,; ]+", params.get("delete", ""))):
        vm.config.pop(key, None)
    vm.config.update(changes)
    return None


def _resize(sim: Simulator, params):
    vm = sim._vm(params)
    sim._unlocked(vm)
    disk = vm.config.get(params["disk"])
    if disk is None:
        raise ApiError(500, f"disk '{params['disk']}' does not exist")
    current = int(re.search(r"size=(\d+)G", disk).group(1))
    size = params["size"]
    wanted = current + int(size[1:].rstrip("G")) if size.startswith("+") else int(size.rstrip("G"))
    if wanted < current:
        raise ApiError(500, "shrinking disks is not supported")
    vm.config[params["disk"]] = re.sub(r"size=\d+G", f"size={wanted}G", disk)
    return sim._task(vm.node, "resize", vm.vmid, sim.times.resize, lambda ok: None)


def _power(kind: str, duration: str, check, effect, worker_check=None):
    """A power action as a task: ``check`` raises PVE's refusal, ``worker_check(sim, vm)`` returns what
    the forked worker dies of (or None), ``effect`` applies at the end."""

    def handler(sim: Simulator, params):
        vm = sim._vm(params)
        sim._unlocked(vm)
        check(sim, vm)
        ignored = kind == "qmshutdown" and vm.ignores_shutdown
        if ignored:
            sim._task_faults.setdefault(kind, []).insert(0, "VM quit/powerdown failed - got timeout")
        seconds = float(params.get("timeout", 0)) if ignored else getattr(sim.times, duration)
        return sim._task(
            vm.node,
            kind,
            vm.vmid,
            seconds,
            lambda ok: ok and effect(sim, vm),
            locks_vm=True,
            check=worker_check and (lambda: worker_check(sim, vm)),
        )

    return handler


def _already_running(sim, vm) -> str | None:
    # PVE's start API forks its worker first; vm_start finds the VM running there and dies.
    return f"VM {vm.vmid} already running" if vm.status == "running" else None


def _started(sim, vm):
    vm.status, vm.paused, vm.started_at = "running", False, time.time()
    # cloud-init's static address when the VM has one ("ip=10.80.0.123/16,gw=…"), else DHCP's.
    static = re.match(r"ip=([0-9.]+)/", vm.config.get("ipconfig0", ""))
    vm.ip = static.group(1) if static else vm.ip or next(sim._ips)


def _stopped(sim, vm):
    vm.status, vm.paused = "stopped", False


def _status_current(sim: Simulator, params):
    vm = sim._vm(params)
    current = {
        "vmid": vm.vmid,
        "name": vm.config.get("name", ""),
        "status": vm.status,
        "qmpstatus": "paused" if vm.paused else vm.status,
        "cpus": vm.cores,
        "maxmem": vm.memory_mib * MIB,
        "agent": int(vm.config.get("agent", "0").split(",")[0]),
        "ha": {"managed": 0},
        "uptime": int(time.time() - vm.started_at) if vm.status == "running" else 0,
    }
    for key in ("tags", "lock"):
        if key in vm.config:
            current[key] = vm.config[key]
    return current


def _destroy(sim: Simulator, params):
    vm = sim._vm(params)
    sim._unlocked(vm)
    if vm.status == "running":
        raise ApiError(500, f"VM {vm.vmid} is running - destroy failed")
    return sim._task(vm.node, "qmdestroy", vm.vmid, sim.times.destroy, lambda ok: ok and sim.vms.pop(vm.vmid))


def _agent_interfaces(sim: Simulator, params):
    vm = sim._vm(params)
    sim._running(vm)
    if vm.paused or time.time() < vm.started_at + sim.times.agent:
        raise ApiError(500, "QEMU guest agent is not running")
    return {
        "result": [
            {
                "name": "lo",
                "ip-addresses": [{"ip-address-type": "ipv4", "ip-address": "127.0.0.1", "prefix": 8}],
            },
            {
                "name": "eth0",
                "hardware-address": "bc:24:11:00:00:01",
                "ip-addresses": [
                    {"ip-address-type": "ipv6", "ip-address": "fe80::be24:11ff:fe00:1", "prefix": 64},
                    *({"ip-address-type": "ipv4", "ip-address": ip, "prefix": 16} for ip in vm.claimed_ips),
                    {"ip-address-type": "ipv4", "ip-address": vm.ip, "prefix": 16},
                ],
            },
        ]
    }


def _task_status(sim: Simulator, params):
    task = sim.tasks.get(params["upid"])
    if task is None or task.node != params["node"]:
        raise ApiError(500, f"no such task '{params['upid']}'")
    status = {
        "upid": task.upid,
        "node": task.node,
        "type": task.kind,
        "user": task.user,
        "starttime": int(task.starttime),
        "pid": int(task.upid.split(":")[2], 16),
        "pstart": int(task.upid.split(":")[3], 16),
        "id": task.upid.split(":")[6],
        "status": "stopped" if task.done else "running",
    }
    if task.done:
        status["exitstatus"] = task.exitstatus
    return status


def _fw_options_get(sim, params):
    # Stored as the request's strings; PVE answers its flags as booleans (0/1).
    return {k: int(v) if v in ("0", "1") else v for k, v in sim._vm(params).fw_options.items()}


def _fw_options_put(sim, params):
    vm = sim._vm(params)
    vm.fw_options.update({k: v for k, v in params.items() if k not in ("node", "vmid", "digest", "delete")})


# pvefw-logger's levels (syslog's), as a line's second field.
LOG_LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warning": 4, "notice": 5, "info": 6, "debug": 7}


def firewall_log_line(vm: Vm, level: str, message: str, dest: str, dport: int, at: float | None) -> str:
    """What pvefw-logger writes for a VM's outbound TCP SYN its firewall dropped. The format is its own
    (pve-firewall ``src/pvefw-logger.c``: ``<VMID> <LOGLEVEL> <CHAIN> <TIME> <TIMEZONE> <MSG>``, the time
    in the node's zone); the message starts with the NFLOG prefix pve-firewall gives the rule
    (``Firewall.pm``: "policy DROP: ", "DROP: "), then the packet as the logger prints it. The VM's tap
    is bridged through its firewall bridge, so the packet goes in and out of ``fwbr<VMID>i0``."""
    when = datetime.datetime.fromtimestamp(time.time() if at is None else at).astimezone()
    stamp = f"{when.day:02d}/{when:%b}/{when.year}:{when:%H:%M:%S} {when:%z}"
    source = re.match(r"ip=([0-9.]+)/", vm.config.get("ipconfig0", ""))
    port, seq = secrets.randbelow(28000) + 32768, secrets.randbelow(2**32)
    return (
        f"{vm.vmid} {LOG_LEVELS[level]} tap{vm.vmid}i0-OUT {stamp} {message}"
        f"IN=fwbr{vm.vmid}i0 OUT=fwbr{vm.vmid}i0 PHYSIN=tap{vm.vmid}i0 PHYSOUT=fwln{vm.vmid}i0 "
        f"MAC=ff:ff:ff:ff:ff:ff:bc:24:11:00:00:01:08:00 "
        f"SRC={source.group(1) if source else vm.ip} DST={dest} "
        f"LEN=60 TOS=0x00 PREC=0x00 TTL=64 ID={secrets.randbelow(65536)} DF PROTO=TCP "
        f"SPT={port} DPT={dport} SEQ={seq} ACK=0 WINDOW=64240 SYN "
    )


def _fw_log(sim: Simulator, params):
    """As PVE's ``dump_fw_logfile``: the VM's lines (those starting with its VMID), numbered from 1;
    ``start`` skips, ``limit`` takes (50 by default, 0 for all); ``since``/``until`` by each line's time
    (PVE then reads the rotated files too: here there are none). No line at all reads "no content"."""
    vm = sim._vm(params)
    since, until = int(params.get("since", 0)), int(params.get("until", 0))
    start, limit = int(params.get("start", 0)), int(params.get("limit", 50))
    lines = []
    for line in sim.firewall_logs[vm.node]:
        if not line.startswith(f"{vm.vmid} "):
            continue
        if since or until:
            words = line.split(" ")
            at = datetime.datetime.strptime(f"{words[3]} {words[4]}", "%d/%b/%Y:%H:%M:%S %z").timestamp()
            if (since and at < since) or (until and at > until):
                continue
        lines.append(line)
    numbered = [{"n": n, "t": t} for n, t in enumerate(lines, 1)][start:]
    if not lines:
        return [{"n": 1, "t": "no content"}]
    return numbered if limit == 0 else numbered[:limit]


def _fw_rules_get(sim, params):
    return [{**rule, "pos": pos} for pos, rule in enumerate(sim._vm(params).fw_rules)]


def _fw_rules_post(sim, params):
    vm = sim._vm(params)
    rule = {k: v for k, v in params.items() if k not in ("node", "vmid", "digest", "pos")}
    vm.fw_rules.insert(int(params.get("pos", 0)), rule)


def _fw_rule_delete(sim, params):
    vm = sim._vm(params)
    pos = int(params["pos"])
    if pos >= len(vm.fw_rules):
        raise ApiError(500, "no rule at specified position")
    del vm.fw_rules[pos]


def _ipsets_get(sim, params):
    vm = sim._vm(params)
    listed = []
    for name, entries in vm.ipsets.items():
        comment = {"comment": vm.ipset_comments[name]} if name in vm.ipset_comments else {}
        listed.append({"name": name, "digest": _digest(entries), **comment})
    return listed


def _ipset_create(sim, params):
    """Create a set, or with ``rename`` (the current name) rename it and/or change its comment."""
    vm = sim._vm(params)
    name, old = params["name"], params.get("rename")
    if old:
        if old not in vm.ipsets:
            raise ApiError(400, "Parameter verification failed.", {"name": f"IPSet '{old}' does not exists"})
        if name in vm.ipsets and name != old:
            raise ApiError(
                400, "Parameter verification failed.", {"name": f"IPSet '{name}' does already exist"}
            )
        vm.ipsets[name] = vm.ipsets.pop(old)
        if old in vm.ipset_comments:
            vm.ipset_comments[name] = vm.ipset_comments.pop(old)
    elif name in vm.ipsets:
        raise ApiError(400, "Parameter verification failed.", {"name": f"IPSet '{name}' already exists"})
    else:
        vm.ipsets[name] = []
    if "comment" in params:
        vm.ipset_comments[name] = params["comment"]


def _ipset_entries(sim, params) -> list[dict[str, str]]:
    entries = sim._vm(params).ipsets.get(params["name"])
    if entries is None:
        raise ApiError(500, f"no such IPSet '{params['name']}'")
    return entries


def _ipset_get(sim, params):
    entries = _ipset_entries(sim, params)
    return [{**entry, "digest": _digest(entries)} for entry in entries]


def _ipset_add(sim, params):
    entries = _ipset_entries(sim, params)
    cidr = params["cidr"]
    if any(e["cidr"] == cidr for e in entries):
        raise ApiError(500, f"address '{cidr}' already exists")
    entries.append({"cidr": cidr, **({"comment": params["comment"]} if "comment" in params else {})})


def _ipset_update_entry(sim, params):
    entries = _ipset_entries(sim, params)
    entry = next((e for e in entries if e["cidr"] == params["cidr"]), None)
    if entry is None:
        raise ApiError(500, f"no such IP address '{params['cidr']}'")
    if "comment" in params:
        entry["comment"] = params["comment"]


def _ipset_delete_entry(sim, params):
    entries = _ipset_entries(sim, params)
    entries[:] = [e for e in entries if e["cidr"] != params["cidr"]]


def _ipset_delete(sim, params):
    vm = sim._vm(params)
    if _ipset_entries(sim, params) and params.get("force") != "1":
        raise ApiError(500, "IPSet is not empty")
    del vm.ipsets[params["name"]]
    vm.ipset_comments.pop(params["name"], None)


def _vncproxy(sim: Simulator, params):
    vm = sim._vm(params)
    sim._running(vm)
    now = time.time()
    ticket = f"PVEVNC:{int(now):08X}::{secrets.token_urlsafe(24)}"
    port = 5900 + len(sim._vnc_tickets) % 100
    # The VNC password is the ticket itself unless PVE is asked to generate one (8 printable chars).
    generated = params.get("generate-password") == "1"
    password = "".join(secrets.choice(console.PRINTABLE) for _ in range(8)) if generated else ticket
    sim._vnc_tickets[ticket] = VncTicket(vm.vmid, port, password, now)
    answer = {
        "port": port,
        "ticket": ticket,
        "user": f"{TOKEN_USER}!{TOKEN_ID}",
        "cert": "-----BEGIN CERTIFICATE-----\n(simulated)\n-----END CERTIFICATE-----\n",
        "upid": sim._task(vm.node, "vncproxy", vm.vmid, 0, lambda ok: None),
    }
    return {**answer, "password": password} if generated else answer


def _vncwebsocket(sim: Simulator, params):
    vm = sim._vm(params)
    vnc = sim._vnc_tickets.get(params["vncticket"])
    fresh = vnc is not None and time.time() < vnc.issued_at + sim.vnc_ticket_lifetime
    if not fresh or (vnc.vmid, vnc.port) != (vm.vmid, int(params["port"])):
        raise ApiError(401, "permission denied - invalid PVEVNC ticket")
    return {"port": params["port"]}


def _any_state(sim, vm):
    return None


VM = "/nodes/{node}/qemu/{vmid}"
FW = f"{VM}/firewall"
ROUTES = {
    ("GET", "/cluster/resources"): _cluster_resources,
    ("GET", "/cluster/nextid"): _nextid,
    ("POST", f"{VM}/clone"): _clone,
    ("GET", f"{VM}/config"): _get_config,
    ("PUT", f"{VM}/config"): _put_config,
    ("PUT", f"{VM}/resize"): _resize,
    ("POST", f"{VM}/status/start"): _power("qmstart", "start", _any_state, _started, _already_running),
    ("POST", f"{VM}/status/shutdown"): _power(
        "qmshutdown", "shutdown", lambda s, vm: s._running(vm), _stopped
    ),
    ("POST", f"{VM}/status/stop"): _power("qmstop", "stop", _any_state, _stopped),
    ("POST", f"{VM}/status/suspend"): _power(
        "qmsuspend", "suspend", lambda s, vm: s._running(vm), lambda s, vm: setattr(vm, "paused", True)
    ),
    ("POST", f"{VM}/status/resume"): _power(
        "qmresume", "resume", lambda s, vm: s._running(vm), lambda s, vm: setattr(vm, "paused", False)
    ),
    ("GET", f"{VM}/status/current"): _status_current,
    ("DELETE", VM): _destroy,
    ("GET", f"{VM}/agent/network-get-interfaces"): _agent_interfaces,
    ("GET", "/nodes/{node}/tasks/{upid}/status"): _task_status,
    ("GET", f"{FW}/options"): _fw_options_get,
    ("PUT", f"{FW}/options"): _fw_options_put,
    ("GET", f"{FW}/log"): _fw_log,
    ("GET", f"{FW}/rules"): _fw_rules_get,
    ("POST", f"{FW}/rules"): _fw_rules_post,
    ("DELETE", f"{FW}/rules/{{pos}}"): _fw_rule_delete,
    ("GET", f"{FW}/ipset"): _ipsets_get,
    ("POST", f"{FW}/ipset"): _ipset_create,
    ("GET", f"{FW}/ipset/{{name}}"): _ipset_get,
    ("POST", f"{FW}/ipset/{{name}}"): _ipset_add,
    ("DELETE", f"{FW}/ipset/{{name}}"): _ipset_delete,
    ("PUT", f"{FW}/ipset/{{name}}/{{cidr}}"): _ipset_update_entry,
    ("DELETE", f"{FW}/ipset/{{name}}/{{cidr}}"): _ipset_delete_entry,
    ("POST", f"{VM}/vncproxy"): _vncproxy,
    ("GET", f"{VM}/vncwebsocket"): _vncwebsocket,
}


def _handler(sim: Simulator):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            super().setup()
            # Headers and body go out in two writes: without this, Nagle and delayed ACKs add 40 ms each.
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _serve(self):
            url = urlsplit(self.path)
            params = dict(parse_qsl(url.query, keep_blank_values=True))
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                params.update(parse_qsl(self.rfile.read(length).decode(), keep_blank_values=True))
            try:
                data = sim.handle(self.command, url.path, params, self.headers.get("Authorization", ""))
                status, body, reason = 200, {"data": data}, "OK"
                # As pveproxy: a successful GET of a path ending in "websocket" may upgrade.
                if self.headers.get("Upgrade") and self.command == "GET" and url.path.endswith("websocket"):
                    refused = console.refusal(self.headers)
                    if refused:
                        raise ApiError(500, refused)
                    vnc = sim._vnc_tickets[params["vncticket"]]
                    password_expires = vnc.issued_at + sim.vnc_password_lifetime
                    self.close_connection = True
                    console.serve(self, vnc.password, password_expires, f"VM {vnc.vmid}")
                    return
            except AnswerLost:
                self.close_connection = True
                return
            except ApiError as exc:
                status, reason = exc.status, exc.message
                body = {"data": None, "message": exc.message + "\n"}
                if exc.errors:
                    body["errors"] = exc.errors
            except Exception as exc:  # a simulator bug must fail the test loudly, not hang it
                status, reason = 500, f"simulator error: {type(exc).__name__}: {exc}"
                body = {"data": None, "message": reason}
            payload = json.dumps(body).encode()
            self.send_response(status, reason)
            self.send_header("Content-Type", "application/json;charset=UTF-8")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format, *args):
            pass

    return Handler


def _self_signed(directory: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pve-simulator")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
