"""Relay benchmark: the VNC and terminal relays against going straight to the desktop.

    .venv/bin/python bench/relay.py [--updates 80] [--pings 2000] [--keystrokes 300]

Runs a real Xvnc (1920x1080, an xterm on it) and sshd on loopback, and the control plane's own
daphne in front of them, exactly as a desktop is served. Prints, in one run:
  - throughput of full-screen framebuffer updates, through the relay vs straight TCP, both as
    Raw pixels (the relay's worst case: no encoding work, pure copying) and as ZRLE (compressed,
    as VNC viewers ask for it);
  - the relay's own CPU per MiB of the Raw stream delivered, beside two references on the same
    stream: a bare ASGI relay under daphne (`bench/bare_relay.py`, the floor of any relay on our
    server) and websockify (noVNC's relay);
  - round trip of a small request (a 1x1 non-incremental update), p50 / p99, relay vs direct;
  - terminal keystroke echo through the relay (p50 / p99) vs a direct SSH channel.
It uses the bench database (`bench/database.py`) and removes the rows it made.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.database import django_setup  # noqa: E402

django_setup()

import websockets  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402

from bench.cpu import cpu_ticks, group_cpu_seconds  # noqa: E402
from bench.report import Figure, record  # noqa: E402
from bench.stats import percentile  # noqa: E402
from desktops.audit import Actor  # noqa: E402
from desktops.guest import control_plane_public_key, desktop_ssh_connect  # noqa: E402
from desktops.models import Desktop, DesktopState, Membership, Plan, Role, Workspace  # noqa: E402
from desktops.relays import relay_tickets_mint  # noqa: E402
from tests.support import services as real  # noqa: E402
from tests.support.services import service_process  # noqa: E402

WIDTH, HEIGHT = 1920, 1080
HANDSHAKE = b"RFB 003.008\n" + b"\x01" + b"\x01"
RAW_32BPP = bytes([0, 0, 0, 0, 32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0])
RAW, ZRLE = 0, 16


def update_request(incremental: int, w: int, h: int) -> bytes:
    return struct.pack(">BBHHHH", 3, incremental, 0, 0, w, h)


class RfbReader:
    """Reads server messages from a byte source; only what these requests can produce."""

    def __init__(self, recv):
        self.recv = recv
        self.buffer = bytearray()

    async def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self.buffer += await self.recv()
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    async def skip(self, n: int) -> None:
        """Consume n bytes of pixel data without keeping them: chunks wholly inside are never copied."""
        taken = min(n, len(self.buffer))
        del self.buffer[:taken]
        n -= taken
        while n:
            chunk = await self.recv()
            if len(chunk) > n:
                self.buffer += memoryview(chunk)[n:]
                return
            n -= len(chunk)

    async def handshake(self, send, encoding: int) -> None:
        await self.exactly(12)
        await send(b"RFB 003.008\n")
        count = (await self.exactly(1))[0]
        await self.exactly(count)
        await send(b"\x01")
        await self.exactly(4)
        await send(b"\x01")
        header = await self.exactly(24)
        await self.exactly(struct.unpack(">I", header[20:24])[0])
        await send(RAW_32BPP + struct.pack(">BxHi", 2, 1, encoding))

    async def update(self) -> int:
        """One FramebufferUpdate of Raw or ZRLE rectangles; returns its size in bytes."""
        while True:
            kind = (await self.exactly(1))[0]
            if kind == 0:
                break
            if kind == 3:  # ServerCutText
                await self.exactly(7 + struct.unpack(">I", (await self.exactly(7))[3:7])[0] - 7)
            elif kind == 2:  # Bell
                continue
        rects = struct.unpack(">xH", await self.exactly(3))[0]
        size = 4
        for _ in range(rects):
            _, _, w, h, encoding = struct.unpack(">HHHHi", await self.exactly(12))
            # A ZRLE rectangle is its compressed length, then that many bytes.
            length = w * h * 4 if encoding == RAW else struct.unpack(">I", await self.exactly(4))[0] + 4
            await self.skip(length - 4 if encoding == ZRLE else length)
            size += 12 + length
        return size


@dataclass
class Run:
    throughput: float  # bytes a second
    rtts: list[float]  # ms
    cpu_busy: float  # share of all cores
    relay_cpu_ms_per_mib: float | None  # the relay's own CPU per MiB delivered


async def measure(
    reader: RfbReader, send, updates: int, pings: int, encoding: int, relay_pgid: int | None = None
) -> Run:
    await reader.handshake(send, encoding)
    await send(update_request(0, WIDTH, HEIGHT))
    await reader.update()  # warm-up
    # Request, then read the whole update, as a viewer does (a server merges outstanding requests).
    start, total, (busy0, all0) = time.perf_counter(), 0, cpu_ticks()
    relay0 = group_cpu_seconds(relay_pgid) if relay_pgid else 0.0
    for _ in range(updates):
        await send(update_request(0, WIDTH, HEIGHT))
        total += await reader.update()
    throughput = total / (time.perf_counter() - start)
    busy1, all1 = cpu_ticks()
    relay_cost = None
    if relay_pgid:
        relay_cost = 1000 * (group_cpu_seconds(relay_pgid) - relay0) / (total / 2**20)
    # How much of the machine (all cores) the stream kept busy: near 100% means CPU-bound.
    cpu_busy = (busy1 - busy0) / max(1, all1 - all0)
    rtts = []
    for _ in range(pings):
        t0 = time.perf_counter()
        await send(update_request(0, 1, 1))
        await reader.update()
        rtts.append((time.perf_counter() - t0) * 1000)
    return Run(throughput, rtts, cpu_busy, relay_cost)


async def direct(port: int, updates: int, pings: int, encoding: int):
    r, w = await asyncio.open_connection("127.0.0.1", port)

    async def send(data):
        w.write(data)
        await w.drain()

    try:
        return await measure(RfbReader(lambda: r.read(262144)), send, updates, pings, encoding)
    finally:
        w.close()


def connect(url: str, ticket: str | None):
    """A relay opened as a browser does: the single-use ticket as a subprotocol."""
    protocols = ["binary"] + ([f"lebureau.ticket.{ticket}"] if ticket else [])
    return websockets.connect(url, max_size=None, origin="http://127.0.0.1", subprotocols=protocols)


async def relayed(
    url: str, ticket: str | None, updates: int, pings: int, encoding: int, pgid: int | None = None
):
    async with connect(url, ticket) as ws:
        return await measure(RfbReader(ws.recv), ws.send, updates, pings, encoding, pgid)


async def terminal_echo(url: str, ticket: str, keystrokes: int) -> list[float]:
    import json

    async with connect(url, ticket) as ws:
        await ws.send(json.dumps({"type": "input", "data": "stty raw -echo; cat\n"}))
        await asyncio.sleep(1)
        while True:  # drain the banner and prompt
            try:
                await asyncio.wait_for(ws.recv(), 0.3)
            except TimeoutError:
                break
        times = []
        for i in range(keystrokes):
            key = "abcdefghij"[i % 10]
            t0 = time.perf_counter()
            await ws.send(json.dumps({"type": "input", "data": key}))
            while key.encode() not in await ws.recv():
                pass
            times.append((time.perf_counter() - t0) * 1000)
        return times


def direct_echo(desktop_id: str, keystrokes: int) -> list[float]:
    with desktop_ssh_connect(desktop_id=desktop_id, host="127.0.0.1") as ssh:
        channel = ssh.invoke_shell()
        channel.sendall(b"stty raw -echo; cat\n")
        time.sleep(1)
        while channel.recv_ready():
            channel.recv(65536)
        times = []
        for i in range(keystrokes):
            key = "abcdefghij"[i % 10].encode()
            t0 = time.perf_counter()
            channel.sendall(key)
            while key not in channel.recv(1024):
                pass
            times.append((time.perf_counter() - t0) * 1000)
        return times


def reference_relays(vnc_port: int) -> dict[str, list[str]]:
    """The commands of the relays the project's is read against, each listening on {port}."""
    daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", "{port}"]
    return {
        "bare ASGI relay under daphne": [*daphne, "bench.bare_relay:application"],
        "websockify": [sys.executable, "-m", "websockify", "127.0.0.1:{port}", f"127.0.0.1:{vnc_port}"],
    }


def median_cost(relay_run, rounds: int) -> float:
    """A relay's CPU per MiB of the Raw stream, in ms: the median of `rounds` runs of `relay_run()`, as
    one run lasts under a second and its figure moves with the machine's scheduling."""
    return statistics.median(asyncio.run(relay_run()).relay_cpu_ms_per_mib for _ in range(rounds))


def reference_cost(command: list[str], env: dict[str, str], workdir: Path, args) -> float:
    """A reference relay's CPU per MiB of the same Raw stream, in ms."""
    port = real.free_port()
    command = [part.replace("{port}", str(port)) for part in command]
    with service_process(f"reference-{port}", command, env, workdir, lambda: real.port_open(port)) as relay:
        url = f"ws://127.0.0.1:{port}/"
        return median_cost(lambda: relayed(url, None, args.updates, 0, RAW, relay.pid), args.rounds)


def mint(user, desktop):
    return relay_tickets_mint(actor=Actor(user=user), desktop_id=desktop.id, mode="control")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--updates", type=int, default=80)
    parser.add_argument("--pings", type=int, default=2000)
    parser.add_argument("--keystrokes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7, help="runs of the Raw stream for each relay's CPU")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-relay-"))
    user = get_user_model().objects.create_user(
        f"bench-{os.getpid()}", f"bench-{os.getpid()}@example.com", None
    )
    workspace = Workspace.objects.create(name="relay bench")
    Membership.objects.create(workspace=workspace, user=user, role=Role.MEMBER)
    desktop = Desktop.objects.create(
        workspace=workspace,
        plan=Plan.objects.first(),
        name="relay-bench",
        driver="bench",
        state=DesktopState.RUNNING,
        private_ip="127.0.0.1",
    )
    try:
        with (
            real.xvnc(geometry=f"{WIDTH}x{HEIGHT}") as (_, vnc_port),
            real.sshd(workdir, control_plane_public_key()) as ssh_port,
        ):
            settings.DESKTOP_SSH_PORT, settings.DESKTOP_SSH_USER = ssh_port, "root"
            port = real.free_port()
            env = {
                **os.environ,
                "DESKTOP_VNC_PORT": str(vnc_port),
                "DESKTOP_SSH_PORT": str(ssh_port),
                "DESKTOP_SSH_USER": "root",
            }
            daphne = [
                sys.executable,
                "-m",
                "lebureau.server",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "lebureau.asgi:application",
            ]
            with service_process(
                "daphne", daphne, env, workdir, lambda: real.port_open(port)
            ) as ours_process:
                base = f"ws://127.0.0.1:{port}/ws/desktops/{desktop.id}"
                runs = {}
                for name, encoding in (("Raw", RAW), ("ZRLE", ZRLE)):
                    direct_run = asyncio.run(direct(vnc_port, args.updates, args.pings, encoding))
                    relay = relayed(
                        f"{base}/vnc", mint(user, desktop).vnc, args.updates, args.pings, encoding
                    )
                    runs[name] = (direct_run, asyncio.run(relay))
                ours = median_cost(
                    lambda: relayed(
                        f"{base}/vnc", mint(user, desktop).vnc, args.updates, 0, RAW, ours_process.pid
                    ),
                    args.rounds,
                )
                r_echo = asyncio.run(
                    terminal_echo(f"{base}/terminal", mint(user, desktop).terminal, args.keystrokes)
                )
                d_echo = direct_echo(desktop.id, args.keystrokes)
            references = {
                name: reference_cost(
                    command, {**env, "BARE_RELAY_TARGET": f"127.0.0.1:{vnc_port}"}, workdir, args
                )
                for name, command in reference_relays(vnc_port).items()
            }
    finally:
        real.terminal_sessions_end()  # its `cat` in raw mode must not greet the next terminal
        desktop.delete()
        workspace.delete()
        user.delete()

    mib = 1024 * 1024
    cores = os.cpu_count()
    for name, (d, r) in runs.items():
        print(f"VNC full-screen {name} updates ({WIDTH}x{HEIGHT}, 32 bpp, {args.updates} updates)")
        print(f"  direct TCP : {d.throughput / mib:8.1f} MiB/s   {cores} cores {100 * d.cpu_busy:3.0f}% busy")
        print(
            f"  via relay  : {r.throughput / mib:8.1f} MiB/s   {cores} cores {100 * r.cpu_busy:3.0f}% busy"
            f"  ({100 * r.throughput / d.throughput:.0f}% of direct)"
        )
    floor = references["bare ASGI relay under daphne"]
    print(
        "Relay CPU per MiB of the Raw stream delivered (user + system time of the relay's processes, "
        f"median of {args.rounds} runs)"
    )
    print(
        f"  the screen relay            : {ours:6.2f} ms/MiB  ({ours / floor:.2f}x the floor: target 1.25x)"
    )
    for name, cost in references.items():
        print(f"  {name:<28}: {cost:6.2f} ms/MiB")
    d_rtt, r_rtt = runs["Raw"][0].rtts, runs["Raw"][1].rtts
    print(f"Small request round trip ({args.pings} x 1x1 update)")
    print(f"  direct TCP : p50 {statistics.median(d_rtt):.3f} ms  p99 {percentile(d_rtt, 0.99):.3f} ms")
    print(f"  via relay  : p50 {statistics.median(r_rtt):.3f} ms  p99 {percentile(r_rtt, 0.99):.3f} ms")
    added = statistics.median(r_rtt) - statistics.median(d_rtt)
    print(
        f"  added      : p50 {added:.3f} ms  p99 {percentile(r_rtt, 0.99) - percentile(d_rtt, 0.99):.3f} ms"
        "  (target <= 2 ms at p50)"
    )
    print(f"Terminal keystroke echo ({args.keystrokes} keys)")
    print(f"  direct SSH : p50 {statistics.median(d_echo):.3f} ms  p99 {percentile(d_echo, 0.99):.3f} ms")
    print(
        f"  via relay  : p50 {statistics.median(r_echo):.3f} ms  p99 {percentile(r_echo, 0.99):.3f} ms"
        "  (target p50 <= 10 ms)"
    )
    record(
        *(
            Figure(
                f"VNC {name} updates through the relay, share of direct TCP",
                100 * r.throughput / d.throughput,
                "%",
            )
            for name, (d, r) in runs.items()
        ),
        Figure("screen relay CPU per MiB, times the bare daphne relay's", ours / floor, "x", 1.25),
        Figure("screen relay CPU per MiB", ours, "ms/MiB"),
        *(Figure(f"{name} CPU per MiB (reference)", cost, "ms/MiB") for name, cost in references.items()),
        Figure("VNC small request round trip added by the relay, p50", added, "ms", 2),
        Figure("terminal keystroke echo through the relay, p50", statistics.median(r_echo), "ms", 10),
    )


if __name__ == "__main__":
    main()
