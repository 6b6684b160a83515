"""The Proxmox desktops' resolver: answers a desktop the names its policy allows, and lets it reach them.

A PVE firewall cannot follow DNS by itself, and dnsmasq cannot write into PVE's IP sets, so this
small service of the engine does what each LXC desktop's dnsmasq does (``lxc/resolver``):

- **Where it runs**: beside the control plane (``make run`` starts it as the ``dns`` process), on an
  address of a host the desktops' network reaches, ``PROXMOX_RESOLVER_ADDRESS``, UDP and TCP port 53
  (``PROXMOX_RESOLVER_LISTEN`` binds elsewhere). It needs the engine's API token, nothing else.
- **How a VM learns it**: the driver gives it to each VM as its cloud-init ``nameserver``, and the VM
  firewall lets DNS out to that address alone: DNS to any other resolver is dropped in every policy.
- **Who is asking**: a query's source address, which the VM firewall pins (``ipfilter``) to the one
  the control plane gave the VM: ``PROXMOX_SUBNET``'s address plus the VMID. That VM must be one of
  the engine's desktops; anyone else, or an address outside the subnet, is refused.
- **What it answers**: the policy is read from the VM's own firewall (as the periodic refresh does):
  the internet open, every name is forwarded to ``PROXMOX_RESOLVER_UPSTREAMS``; otherwise only the
  names the domains set's comment allows (``example.com`` and its subdomains, ``*.example.com`` its
  subdomains only), every other name is "no such domain". The IPv4 addresses of an allowed answer are
  added to the VM's domains set through the PVE API before the answer leaves, each with the time it is
  good for (the record's TTL, at most ``PROXMOX_RESOLVER_MAX_TTL``, plus a grace) in its comment; the
  engine's periodic refresh removes them once that has passed. No AAAA answer is given where the
  internet is closed: the firewall lets no IPv6 out.

- **What it refused**: each name answered "no such domain" because the policy does not allow it is
  counted for that VM, and written (with the earlier ones, the last ``blocked.REFUSED_KEPT``) into the
  VM's own firewall, where the engine reads it back on any host (``blocked``): at once, then at most once
  per ``PROXMOX_RESOLVER_REFUSED_INTERVAL`` per VM, in the background, so a burst costs few writes and
  no answer waits for them.

The API takes an address at once, but the node's firewall service loads the changed set on its next
update, seconds later: a first connection may need its SYN's retries. An answer whose addresses the
API would not take is SERVFAIL, never an address the desktop could not reach.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import signal
import socket
import socketserver
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import quote

from dnslib import EDNS0, QTYPE, RCODE, DNSError, DNSHeader, DNSQuestion, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSServer

from workers.drivers.base import DriverError
from workers.drivers.proxmox.api import PveApi, key_of
from workers.drivers.proxmox.blocked import (
    REFUSED,
    REFUSED_KEPT,
    clean_name,
    recorded,
    refused_comment,
    refused_record,
)
from workers.drivers.proxmox.config import ProxmoxConfig
from workers.drivers.proxmox.firewall import DOMAINS, answered_comment, answered_until, domains_of

logger = logging.getLogger(__name__)

# A UDP answer to a query without EDNS fits in this (RFC 1035); a longer one is truncated and the
# stub asks again over TCP.
PLAIN_UDP = 512
EDNS_UDP = 1232
# Seconds a TCP connection may take to bring its query.
TCP_IDLE = 5.0


@dataclass
class Desktop:
    """What the resolver read of one desktop VM, trusted for ``resolver_policy_ttl`` seconds."""

    vmid: int
    node: str
    key: str
    allow_internet: bool
    domains: tuple[str, ...]
    # The domains set's entries: until when each answered address is allowed (None: resolved in advance).
    entries: dict[str, int | None]
    read_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)


def allows(domains: tuple[str, ...], name: str) -> bool:
    """Whether an allowed domain covers the name: ``example.com`` itself and its subdomains,
    ``*.example.com`` its subdomains only."""
    for domain in domains:
        if domain.startswith("*."):
            if name.endswith(domain[1:]):
                return True
        elif name == domain or name.endswith("." + domain):
            return True
    return False


class DesktopResolver(BaseResolver):
    def __init__(self, config: ProxmoxConfig, pve: PveApi | None = None, clock=time.time):
        self.config = config
        self.pve = pve or PveApi(config)
        self.clock = clock
        self.private = tuple(ipaddress.ip_network(c, strict=False) for c in config.private_cidrs)
        self._desktops: dict[int, Desktop] = {}
        self._listed: tuple[float, list] | None = None
        self._lock = threading.Lock()
        # The names refused each VM not written yet (vmid -> name -> (look-ups, the last's time)), the
        # VM's node, when each VM's were last written (monotonic), and the writes waiting their turn.
        self._refused: dict[int, dict[str, tuple[int, int]]] = {}
        self._nodes: dict[int, str] = {}
        self._refused_written: dict[int, float] = {}
        self._writes: dict[int, threading.Timer] = {}
        # One write at a time: each reads the record, adds to it and puts it back.
        self._record_lock = threading.Lock()
        # Each asker's allowance of queries (a token bucket: tokens, when last filled, monotonic).
        self._allowance: dict[str, tuple[float, float]] = {}

    # -- dnslib's entry point ------------------------------------------------------------------

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        # How long a UDP answer may be, for the handler that sends it: the asker's EDNS size, if any.
        edns = next((r for r in request.ar if r.rtype == QTYPE.OPT), None)
        handler.udplen = min(max(edns.rclass, PLAIN_UDP), EDNS_UDP) if edns else PLAIN_UDP
        reply = self.answer(request, handler.client_address[0])
        if edns:
            reply.add_ar(EDNS0(udp_len=EDNS_UDP))
        return reply

    def answer(self, request: DNSRecord, source: str) -> DNSRecord:
        """The answer to a query from ``source``."""
        reply = request.reply()
        if len(request.questions) != 1 or request.header.opcode != 0:
            return _rcode(reply, RCODE.REFUSED)
        if not self._within_rate(source):
            return _rcode(reply, RCODE.REFUSED)
        vmid = self.config.vmid_at(source)
        try:
            desktop = self.desktop(vmid) if vmid is not None else None
        except DriverError as exc:
            logger.warning("could not read the policy of VM %s: %s", vmid, exc.message)
            return _rcode(reply, RCODE.SERVFAIL)
        if desktop is None:
            logger.info("refused a query from %s: no desktop has that address", source)
            return _rcode(reply, RCODE.REFUSED)
        name = str(request.q.qname).rstrip(".").lower()
        if not desktop.allow_internet:
            if not allows(desktop.domains, name):
                logger.info("no such domain for %s: %s is not allowed", desktop.key, name)
                self.refused(desktop, name)
                return _rcode(reply, RCODE.NXDOMAIN)
            if request.q.qtype == QTYPE.AAAA:
                return reply
        upstream = self.forward(request)
        if upstream is None:
            return _rcode(reply, RCODE.SERVFAIL)
        reply.header.rcode = upstream.header.rcode
        ttl_max = self.config.resolver_max_ttl
        for section, add in ((upstream.rr, reply.add_answer), (upstream.auth, reply.add_auth)):
            for record in section:
                record.ttl = min(record.ttl, ttl_max)
                add(record)
        if not desktop.allow_internet:
            answered = {
                str(r.rdata): r.ttl
                for r in upstream.rr
                if r.rtype == QTYPE.A and not self._private(str(r.rdata))
            }
            try:
                self.admit(desktop, answered)
            except DriverError as exc:
                # An address the desktop could not reach would only look like a broken site.
                logger.warning("could not allow %s to %s: %s", name, desktop.key, exc.message)
                return _rcode(request.reply(), RCODE.SERVFAIL)
        return reply

    def _within_rate(self, source: str) -> bool:
        """Whether `source` may ask one more query now: RESOLVER_QUERIES_PER_SECOND, bursts of twice that."""
        rate = self.config.resolver_queries_per_second
        now = time.monotonic()
        with self._lock:
            tokens, filled = self._allowance.get(source, (2 * rate, now))
            tokens = min(2 * rate, tokens + (now - filled) * rate)
            allowed = tokens >= 1
            self._allowance[source] = (tokens - 1 if allowed else tokens, now)
        return allowed

    # -- the desktops and their sets --------------------------------------------------------------

    def desktop(self, vmid: int) -> Desktop | None:
        """The desktop VM with this VMID as its firewall says now (read again once stale)."""
        now = time.monotonic()
        with self._lock:
            known = self._desktops.get(vmid)
            if known is not None and now - known.read_at < self.config.resolver_policy_ttl:
                return known
        vm = next((v for v in self._vms(now) if v.vmid == vmid), None)
        key = key_of(vm) if vm is not None else ""
        if not key:
            return None
        firewall = self.pve.vm(vm).firewall
        sets = self.pve.call(f"list the IP sets of VM {vmid}", firewall.ipset.get)
        comment = next((s.get("comment", "") for s in sets if s["name"] == DOMAINS), None)
        if comment is None:
            return None  # not given its firewall yet
        options = self.pve.call(f"read the firewall of VM {vmid}", firewall.options.get)
        entries = self.pve.call(f"read the domains of VM {vmid}", firewall.ipset(DOMAINS).get)
        desktop = Desktop(
            vmid=vmid,
            node=vm.node,
            key=key,
            allow_internet=options.get("policy_out", "ACCEPT") == "ACCEPT",
            domains=domains_of(comment),
            entries={e["cidr"]: answered_until(e.get("comment", "")) for e in entries},
            read_at=now,
        )
        with self._lock:
            self._desktops[vmid] = desktop
        return desktop

    def _vms(self, now: float) -> list:
        """The cluster's VMs, listed once for every desktop asking within the same while."""
        with self._lock:
            listed = self._listed
        if listed is None or now - listed[0] >= self.config.resolver_policy_ttl:
            listed = (now, self.pve.vms())
            with self._lock:
                self._listed = listed
        return listed[1]

    def admit(self, desktop: Desktop, answered: dict[str, int]) -> None:
        """Put the answered addresses in the desktop's domains set until their TTL (and the grace) is up.

        An address already there for long enough is left alone, so a busy name costs no API call.
        """
        now = self.clock()
        ipset = self.pve.api.nodes(desktop.node).qemu(desktop.vmid).firewall.ipset(DOMAINS)
        with desktop.lock:
            for address, ttl in sorted(answered.items()):
                cidr = f"{address}/32"
                until = math.ceil(now + ttl + self.config.resolver_grace)
                if cidr not in desktop.entries:
                    if len(desktop.entries) >= self.config.resolver_max_addresses:
                        # A wildcard's names could otherwise grow the set (an API write each) without end.
                        raise DriverError(
                            f"VM {desktop.vmid}'s set holds {len(desktop.entries)} answered addresses, "
                            "the most it may"
                        )
                    try:
                        self.pve.call(
                            f"allow {cidr} to VM {desktop.vmid}",
                            ipset.post,
                            cidr=cidr,
                            comment=answered_comment(until),
                        )
                    except DriverError as exc:
                        # Added meanwhile (by the policy's own lookup, or the set was read before).
                        if "already exists" not in exc.message:
                            raise
                        self._renew(ipset, desktop, cidr, until)
                else:
                    current = desktop.entries[cidr]
                    if current is None or current - now >= (until - now) / 2:
                        continue
                    self._renew(ipset, desktop, cidr, until)
                desktop.entries[cidr] = until

    def _renew(self, ipset, desktop: Desktop, cidr: str, until: int) -> None:
        try:
            self.pve.call(
                f"allow {cidr} longer to VM {desktop.vmid}",
                ipset(quote(cidr, safe="")).put,
                comment=answered_comment(until),
            )
        except DriverError:
            # Removed meanwhile (its time was up, or the policy changed): put it back.
            self.pve.call(
                f"allow {cidr} to VM {desktop.vmid}", ipset.post, cidr=cidr, comment=answered_comment(until)
            )

    # -- what it refused -------------------------------------------------------------------------

    def refused(self, desktop: Desktop, name: str) -> None:
        """Count a refused name for the VM; its write is due at once, or once the interval since the
        VM's last one has passed."""
        name, now = clean_name(name), int(self.clock())
        with self._lock:
            pending = self._refused.setdefault(desktop.vmid, {})
            count, _ = pending.get(name, (0, now))
            pending[name] = (count + 1, now)
            if len(pending) > REFUSED_KEPT:  # a flood of names: the record keeps the latest anyway
                del pending[min(pending, key=lambda n: pending[n][1])]
            self._nodes[desktop.vmid] = desktop.node
            if desktop.vmid in self._writes:
                return
            written = self._refused_written.get(desktop.vmid, -math.inf)
            delay = max(0.0, written + self.config.resolver_refused_interval - time.monotonic())
            timer = threading.Timer(delay, self._write_refused, args=(desktop.vmid,))
            timer.daemon = True
            self._writes[desktop.vmid] = timer
        timer.start()

    def flush(self) -> None:
        """Write every VM's refused names now (the service stopping)."""
        with self._lock:
            waiting = list(self._writes.items())
        for vmid, timer in waiting:
            timer.cancel()
            self._write_refused(vmid)

    def _write_refused(self, vmid: int) -> None:
        with self._record_lock:
            with self._lock:
                self._writes.pop(vmid, None)
                pending, node = self._refused.pop(vmid, {}), self._nodes.get(vmid)
                self._refused_written[vmid] = time.monotonic()
            if not pending or node is None:
                return
            firewall = self.pve.api.nodes(node).qemu(vmid).firewall
            try:
                sets = self.pve.call(f"list the IP sets of VM {vmid}", firewall.ipset.get)
                comment = next((s.get("comment", "") for s in sets if s["name"] == REFUSED), None)
                # Made here for a VM whose firewall predates the record: its log lines are all its own,
                # as the engine took them before.
                since, names = (comment is not None and refused_record(comment)) or (0, [])
                record = refused_comment(since, recorded(names, pending))
                if comment is None:
                    self.pve.call(
                        f"record what VM {vmid} was refused",
                        firewall.ipset.post,
                        name=REFUSED,
                        comment=record,
                    )
                else:
                    self.pve.call(
                        f"record what VM {vmid} was refused",
                        firewall.ipset.post,
                        name=REFUSED,
                        rename=REFUSED,
                        comment=record,
                    )
            except DriverError as exc:
                # Counted again with the next refused name (a VM gone meanwhile takes them with it).
                logger.warning("could not record what VM %s was refused: %s", vmid, exc.message)
                with self._lock:
                    later = self._refused.setdefault(vmid, {})
                    for name, (count, last) in pending.items():
                        more, latest = later.get(name, (0, last))
                        later[name] = (count + more, max(last, latest))

    def _private(self, address: str) -> bool:
        # The firewall drops these before anything allowed: adding them would open nothing.
        ip = ipaddress.ip_address(address)
        return any(ip in network for network in self.private)

    # -- upstream ------------------------------------------------------------------------------

    def forward(self, request: DNSRecord) -> DNSRecord | None:
        """The upstream resolvers' answer to the question, or None when none answers."""
        question = request.q
        query = DNSRecord(
            DNSHeader(rd=request.header.rd), q=DNSQuestion(question.qname, question.qtype, question.qclass)
        )
        for upstream in self.config.resolver_upstreams:
            host, _, port = upstream.partition(":")
            try:
                answer = DNSRecord.parse(
                    query.send(host, int(port or 53), timeout=self.config.resolver_upstream_timeout)
                )
                if answer.header.tc:
                    answer = DNSRecord.parse(
                        query.send(
                            host, int(port or 53), tcp=True, timeout=self.config.resolver_upstream_timeout
                        )
                    )
            except (OSError, DNSError, ValueError) as exc:
                logger.warning("upstream resolver %s did not answer: %s", upstream, exc)
                continue
            if answer.header.id == query.header.id and answer.q == query.q:
                return answer
        return None


def _rcode(reply: DNSRecord, rcode: int) -> DNSRecord:
    reply.header.rcode = rcode
    return reply


class _Quiet:
    """dnslib's logger, into ours: errors only (it prints every packet otherwise)."""

    def log_error(self, handler, error) -> None:
        logger.warning("DNS from %s: %s", handler.client_address[0], error)

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _Handler(DNSHandler):
    """dnslib's handler, with a deadline on TCP: a desktop holding connections open and silent would
    otherwise hold a thread each for ever."""

    def setup(self) -> None:
        if isinstance(self.request, socket.socket):
            self.request.settimeout(TCP_IDLE)

    def handle(self) -> None:
        try:
            super().handle()
        except OSError as exc:
            logger.info("DNS over TCP from %s dropped: %s", self.client_address[0], exc)


class _Pooled:
    """socketserver's threading, bounded: RESOLVER_THREADS threads answer; past as many requests waiting,
    new ones are dropped (dnslib's own servers start a thread for every query)."""

    def start_pool(self, threads: int) -> None:
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="resolver")
        self.slots = threading.BoundedSemaphore(2 * threads)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        self.pool.submit(self._serve, request, client_address)

    def _serve(self, request, client_address):
        try:
            self.finish_request(request, client_address)
        except Exception:  # socketserver's own threads report it and go on, as this does
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self.slots.release()

    def server_close(self):
        super().server_close()
        self.pool.shutdown(wait=False, cancel_futures=True)


class _PooledUDP(_Pooled, socketserver.UDPServer):
    allow_reuse_address = True


class _PooledTCP(_Pooled, socketserver.TCPServer):
    allow_reuse_address = True


class ResolverService:
    """The resolver on UDP and TCP, each served by threads of this process."""

    def __init__(self, config: ProxmoxConfig, pve: PveApi | None = None):
        host, port = config.resolver_bind
        self.resolver = DesktopResolver(config, pve)
        # Port 0 (tests) is a free port: TCP takes the one UDP was given, and where that one is
        # taken for TCP (another program's connection), another pair is tried.
        attempts = 1 if port else 20
        for attempt in range(attempts):
            self.udp = self._server(host, port, tcp=False)
            try:
                self.tcp = self._server(host, self.udp.server.server_address[1], tcp=True)
            except OSError:
                self.udp.server.server_close()
                if attempt == attempts - 1:
                    raise
            else:
                break
        self.address = (host, self.udp.server.server_address[1])

    def _server(self, host: str, port: int, *, tcp: bool) -> DNSServer:
        kind = _PooledTCP if tcp else _PooledUDP
        server = DNSServer(
            self.resolver, address=host, port=port, logger=_Quiet(), handler=_Handler, server=kind
        )
        server.server.start_pool(self.resolver.config.resolver_threads)
        return server

    def start(self) -> ResolverService:
        self.udp.start_thread()
        self.tcp.start_thread()
        return self

    def stop(self) -> None:
        for server in (self.udp, self.tcp):
            server.stop()
            server.server.server_close()
        self.resolver.flush()


def main() -> None:
    from environs import Env

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    env = Env()
    env.read_env()
    if not env.str("PROXMOX_RESOLVER_ADDRESS", ""):
        # Idle rather than exit: `make run` stops every process when one ends.
        logger.info("PROXMOX_RESOLVER_ADDRESS is not set: the Proxmox desktops' resolver is off")
        while True:
            signal.pause()
    config = ProxmoxConfig.from_env(env)
    if not config.resolver_upstreams:
        raise SystemExit("PROXMOX_RESOLVER_UPSTREAMS is empty: the desktops' resolver has nowhere to ask")
    service = ResolverService(config).start()
    logger.info("the Proxmox desktops' resolver answers on %s:%s", *service.address)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    stopped.wait()
    service.stop()


if __name__ == "__main__":
    main()
