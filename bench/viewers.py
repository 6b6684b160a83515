"""Dozens of people watching desktops through the screen relay, as noVNC watches one.

    .venv/bin/python bench/viewers.py [--desktops 10] [--viewers 50] [--seconds 30] [--rate 25]

Starts its own control plane (`bench/stack.py`) and N minimal LXC desktops, each playing an
animation on its screen (a terminal redrawn whole with random text RATE times a second) beside a
small terminal that echoes what is typed. Opens M viewers through the screen relay, spread evenly
over the desktops (the first of each desktop in control mode, the others view-only), each speaking
RFB as noVNC 1.7 does: its encodings in its order (the desktop's server picks Tight), its pixel
format, a fence answered as it answers them, and an incremental update request once each update is
read. For SECONDS (after a warm-up) it measures, all at once:
  - frames (framebuffer updates) delivered per viewer per second;
  - input -> screen latency: each control viewer types a key into the small terminal about once a
    second and times the update that redraws that terminal (p50 / p95);
  - `GET /api/desktops` of the control plane meanwhile, from another process (target p95 <= 200 ms),
    and for SECONDS / 2 before the viewers open, the desktops animating unwatched;
  - the CPU of the desktops, of the web server (relays and API) and of the viewers meanwhile.
The viewers run in a process of their own, on this machine: their own CPU is in the figures.
Destroys everything it made.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import random
import statistics
import struct
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests
import websockets
from django.contrib.auth import get_user_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpu import container_cpu_seconds, cpu_ticks, group_cpu_seconds, group_running
from bench.provision import Bench
from bench.report import Figure, record
from bench.stack import control_plane
from bench.stats import percentile, summary
from desktops.audit import Actor
from desktops.guest import desktop_ssh_connect
from desktops.models import Membership, Role
from desktops.relays import relay_tickets_mint

# Where the bench puts its windows on the 1280x800 screen, clear of the session's own terminal
# (100x30 at +40+40) and of each other: an update touching TYPED is the echo of a key.
ANIMATION = "80x20+680+40"
ECHO = "40x6+680+520"
TYPED = (660, 500, 320, 140)  # x, y, width, height, the echo terminal with its frame and a margin
CLICK = (800, 575)  # inside the echo terminal, to give it the keyboard

# noVNC 1.7's SetEncodings (core/rfb.js `_sendEncodings`, without H.264, which needs WebCodecs), with
# its default quality 6 and compression 2.
NOVNC_ENCODINGS = [1, 7, -260, 16, 21, 5, 2, 6, 0, -32 + 6, -256 + 2, -223, -224, -258, -261, -308, -309]
NOVNC_ENCODINGS += [-312, -313, -307, -1063131698, -316, 0x574D5664, -239]
# noVNC's pixel format: 32 bpp, depth 24, little-endian true colour, red in the lowest byte.
NOVNC_PIXEL_FORMAT = struct.pack(">BBBBHHHBBBxxx", 32, 24, 0, 1, 255, 255, 255, 0, 8, 16)
RAW, COPY_RECT, TIGHT, ZRLE = 0, 1, 7, 16
CURSOR, VMWARE_CURSOR, LAST_RECT, DESKTOP_NAME, EXTENDED_SIZE, LED = -239, 0x574D5664, -224, -307, -308, -261
NO_PAYLOAD = {-223, -258, -316}  # desktop size, QEMU extended keys, extended mouse buttons: announcements
ENCODING_NAMES = {RAW: "Raw", COPY_RECT: "CopyRect", TIGHT: "Tight", ZRLE: "ZRLE"}
KEYS = (0x61, 0xFF08)  # "a", then BackSpace: the terminal's line never grows


class Stream:
    """Exact reads over WebSocket messages, whose boundaries RFB ignores; skipped bytes are not copied."""

    def __init__(self, recv):
        self.recv = recv
        self.buffer = bytearray()
        self.received = 0

    async def _more(self) -> None:
        chunk = await self.recv()
        self.received += len(chunk)
        self.buffer += chunk

    async def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            await self._more()
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    async def skip(self, n: int) -> None:
        while len(self.buffer) < n:
            await self._more()
        del self.buffer[:n]

    async def compact_length(self) -> int:
        """Tight's 1-3 byte length, 7 bits a byte."""
        length, shift = 0, 0
        for _ in range(3):
            byte = (await self.exactly(1))[0]
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        return length


async def skip_tight(stream: Stream, w: int, h: int) -> None:
    """One Tight rectangle (RFC 6143 §7.7.6 and TigerVNC's encoder), 3-byte pixels at depth 24."""
    control = (await stream.exactly(1))[0] >> 4
    if control == 0x8:  # fill
        await stream.skip(3)
        return
    if control == 0x9:  # JPEG
        await stream.skip(await stream.compact_length())
        return
    if control > 0x9:
        raise ValueError(f"Tight compression {control:#x} is not one a server sends to noVNC")
    size = w * h * 3  # copy filter
    if control & 0x4:  # an explicit filter
        kind = (await stream.exactly(1))[0]
        if kind == 1:  # palette
            colours = (await stream.exactly(1))[0] + 1
            await stream.skip(colours * 3)
            size = (w + 7) // 8 * h if colours == 2 else w * h
    await stream.skip(size if size < 12 else await stream.compact_length())


async def update_rects(stream: Stream) -> list[tuple[int, int, int, int, int]]:
    """The rest of a FramebufferUpdate: the screen areas it redraws and their encodings (pseudo-rectangles
    left out)."""
    count = struct.unpack(">xH", await stream.exactly(3))[0]
    drawn = []
    for _ in range(count):
        x, y, w, h, encoding = struct.unpack(">HHHHi", await stream.exactly(12))
        if encoding == LAST_RECT:
            break
        if encoding == TIGHT:
            await skip_tight(stream, w, h)
        elif encoding == ZRLE:
            await stream.skip(struct.unpack(">I", await stream.exactly(4))[0])
        elif encoding == COPY_RECT:
            await stream.skip(4)
        elif encoding == RAW:
            await stream.skip(w * h * 4)
        elif encoding == CURSOR:
            await stream.skip(w * h * 4 + (w + 7) // 8 * h)
            continue
        elif encoding == VMWARE_CURSOR:
            alpha = (await stream.exactly(2))[0]
            await stream.skip(w * h * 4 * (1 if alpha else 2))
            continue
        elif encoding == DESKTOP_NAME:
            await stream.skip(struct.unpack(">I", await stream.exactly(4))[0])
            continue
        elif encoding == EXTENDED_SIZE:
            await stream.skip(16 * (await stream.exactly(4))[0])  # screens, after 3 bytes of padding
            continue
        elif encoding == LED:
            await stream.skip(1)
            continue
        elif encoding in NO_PAYLOAD:
            continue
        else:
            raise ValueError(f"encoding {encoding} is not one noVNC asked for")
        drawn.append((x, y, w, h, encoding))
    return drawn


def overlaps(rect: tuple[int, int, int, int, int], area: tuple[int, int, int, int]) -> bool:
    x, y, w, h, _ = rect
    ax, ay, aw, ah = area
    return x < ax + aw and ax < x + w and y < ay + ah and ay < y + h


@dataclass
class Seen:
    """What one viewer saw within the measured window."""

    control: bool
    frames: int = 0
    received: int = 0
    latencies: list[float] = field(default_factory=list)  # ms
    missed: int = 0  # keys whose echo never came within 2 s
    encodings: Counter = field(default_factory=Counter)  # rectangles received, by encoding
    error: str = ""


class Viewer:
    def __init__(self, url: str, ticket: str, control: bool, start: float, end: float):
        self.url, self.ticket = url, ticket
        self.start, self.end = start, end
        self.seen = Seen(control)
        self.typed_at: float | None = None
        self.typed_perf = 0.0
        self.echoed = asyncio.Event()

    async def run(self) -> Seen:
        protocols = ["binary", f"lebureau.ticket.{self.ticket}"]
        try:
            async with websockets.connect(
                self.url, max_size=None, origin="http://127.0.0.1", subprotocols=protocols
            ) as ws:
                stream = Stream(ws.recv)
                width, height = await self.handshake(stream, ws.send)
                typist = asyncio.create_task(self.type_keys(ws.send)) if self.seen.control else None
                try:
                    async with asyncio.timeout(self.end - time.time() + 10):
                        await self.watch(stream, ws.send, width, height)
                finally:
                    if typist:
                        typist.cancel()
        except Exception as exc:  # a viewer that fails is counted; the others go on
            self.seen.error = f"{type(exc).__name__}: {exc}"
        return self.seen

    async def handshake(self, stream: Stream, send) -> tuple[int, int]:
        await stream.exactly(12)
        await send(b"RFB 003.008\n")
        await stream.exactly((await stream.exactly(1))[0])
        await send(b"\x01")  # None: the relay authenticates to the desktop itself
        assert await stream.exactly(4) == b"\0\0\0\0", "the relay refused the viewer"
        await send(b"\x01")  # shared, as noVNC
        width, height = struct.unpack(">HH", await stream.exactly(4))
        head = await stream.exactly(20)
        await stream.skip(struct.unpack(">I", head[16:20])[0])
        encodings = struct.pack(f">BxH{len(NOVNC_ENCODINGS)}i", 2, len(NOVNC_ENCODINGS), *NOVNC_ENCODINGS)
        await send(b"\x00\x00\x00\x00" + NOVNC_PIXEL_FORMAT + encodings)
        await send(struct.pack(">BBHHHH", 3, 0, 0, 0, width, height))
        return width, height

    async def watch(self, stream: Stream, send, width: int, height: int) -> None:
        before = 0  # bytes received before the measured window
        while time.time() < self.end:
            kind = (await stream.exactly(1))[0]
            if kind == 0:
                drawn = await update_rects(stream)
                now = time.time()
                if self.start <= now < self.end:
                    self.seen.frames += 1
                    self.seen.encodings.update(ENCODING_NAMES.get(r[4], str(r[4])) for r in drawn)
                if self.typed_at is not None and any(overlaps(r, TYPED) for r in drawn):
                    if self.start <= self.typed_at:
                        self.seen.latencies.append((time.perf_counter() - self.typed_perf) * 1000)
                    self.typed_at = None
                    self.echoed.set()
                await send(struct.pack(">BBHHHH", 3, 1, 0, 0, width, height))
            elif kind == 248:  # a fence: answered as noVNC answers it
                _, flags, length = struct.unpack(">3sIB", await stream.exactly(8))
                payload = await stream.exactly(length)
                await send(struct.pack(">BxxxIB", 248, flags & 0x3, length) + payload)
            elif kind == 3:  # cut text; a negative length is the extended clipboard's
                await stream.skip(abs(struct.unpack(">3xi", await stream.exactly(7))[0]))
            elif kind == 1:  # colour map entries
                await stream.skip(6 * struct.unpack(">xHH", await stream.exactly(5))[1])
            elif kind == 150:  # end of continuous updates
                continue
            elif kind != 2:  # 2: bell
                raise ValueError(f"server message {kind} is not one noVNC knows")
            if time.time() < self.start:
                before = stream.received
            else:
                self.seen.received = stream.received - before

    async def type_keys(self, send) -> None:
        x, y = CLICK
        await send(struct.pack(">BBHH", 5, 1, x, y) + struct.pack(">BBHH", 5, 0, x, y))
        await asyncio.sleep(max(0, self.start - time.time()) + random.random())
        for i in itertools.count():
            key = KEYS[i % 2]
            self.echoed.clear()
            self.typed_at, self.typed_perf = time.time(), time.perf_counter()
            await send(struct.pack(">BBxxI", 4, 1, key) + struct.pack(">BBxxI", 4, 0, key))
            try:
                await asyncio.wait_for(self.echoed.wait(), 2)
            except TimeoutError:
                self.typed_at = None
                self.seen.missed += 1
            await asyncio.sleep(0.5 + random.random())


def watch_all(viewers: list[tuple[str, str, bool]], start: float, end: float, out) -> None:
    """The viewers' process: all of them on one event loop. Sends what they saw and its own CPU
    seconds within the measured window."""
    cpu: list[float] = []

    async def clock(at: float) -> None:
        await asyncio.sleep(max(0, at - time.time()))
        cpu.append(time.process_time())

    async def everyone():
        clocks = [asyncio.create_task(clock(start)), asyncio.create_task(clock(end))]
        seen = await asyncio.gather(*(Viewer(url, t, c, start, end).run() for url, t, c in viewers))
        await asyncio.gather(*clocks)
        return seen

    seen = asyncio.run(everyone())
    out.send((seen, cpu[1] - cpu[0]))


def animate(desktop: dict, rate: float) -> None:
    """The animation and the echo terminal, started in the desktop's session over SSH."""
    # Each redraw fills the terminal with new random text, in place: a 480x260 area changes whole.
    redraw = 'printf "\\033[H"; head -c 1100 /dev/urandom | base64 -w 78'
    loop = f"while :; do {redraw}; sleep {1 / rate:.3f}; done"
    script = (
        f"export DISPLAY=:0; setsid -f xterm -geometry {ANIMATION} -e sh -c '{loop}' "
        f"</dev/null >/dev/null 2>&1; sleep 1; setsid -f xterm -geometry {ECHO} -e cat "
        "</dev/null >/dev/null 2>&1"
    )
    deadline = time.monotonic() + 60
    while True:  # sshd comes up a moment after the desktop reports running
        try:
            with desktop_ssh_connect(desktop_id=desktop["id"], host=desktop["privateIp"]) as ssh:
                _, stdout, _ = ssh.exec_command(script)
                if stdout.channel.recv_exit_status() == 0:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not start the animation on {desktop['name']}")
        time.sleep(1)


def cpu_now(web: int, desktops: list[dict]) -> dict[str, float]:
    """CPU seconds so far of the machine (busy, and all cores' time), the web server, the desktops."""
    busy, total = cpu_ticks()
    tick = os.sysconf("SC_CLK_TCK")
    return {
        "busy": busy / tick,
        "cores": total / tick,
        "web": group_cpu_seconds(web),
        "desktops": sum(container_cpu_seconds(d["id"]) for d in desktops),
    }


def api_times(base: str, key: str, end: float) -> list[float]:
    """`GET /api/desktops` five times a second until `end`, in ms each."""
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {key}"
    times = []
    while time.time() < end:
        t0 = time.perf_counter()
        http.get(f"{base}/api/desktops").raise_for_status()
        times.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.2)
    return times


def viewer_tickets(stack, desktops: list[dict], count: int) -> list[tuple[str, str, bool]]:
    """(relay URL, ticket, control) for each viewer, each a person of its own in the workspace (a
    person opens a few relays at most, RELAY_MAX_PER_USER): the first of each desktop controls it."""
    ws_base = stack.base.replace("http://", "ws://")
    viewers = []
    for i in range(count):
        desktop, control = desktops[i % len(desktops)], i < len(desktops)
        name = f"{stack.user.username}-viewer-{i}"
        user = get_user_model().objects.create_user(name, f"{name}@example.com", None)
        role = Role.MEMBER if control else Role.VIEWER
        Membership.objects.create(workspace=stack.workspace, user=user, role=role)
        mode = "control" if control else "view"
        tickets = relay_tickets_mint(actor=Actor(user=user), desktop_id=desktop["id"], mode=mode)
        viewers.append((f"{ws_base}/ws/desktops/{desktop['id']}/vnc", tickets.vnc, control))
    return viewers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--desktops", type=int, default=10)
    parser.add_argument("--viewers", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--rate", type=float, default=25, help="the animation's redraws a second")
    parser.add_argument("--warm-up", type=float, default=5)
    args = parser.parse_args()
    with control_plane("viewers", concurrency=4) as stack:
        bench = Bench(stack)
        try:
            with ThreadPoolExecutor(max_workers=args.desktops) as pool:
                list(pool.map(lambda i: bench.create(f"viewed-{i:02d}"), range(args.desktops)))
            desktops = [bench.http.get(f"{stack.base}/api/desktops/{i}").json() for i in bench.made]
            with ThreadPoolExecutor(max_workers=args.desktops) as pool:
                list(pool.map(lambda d: animate(d, args.rate), desktops))
            time.sleep(2)  # the windows mapped and drawn
            # The same API with the same desktops animating, nobody watching: what the viewers add.
            unwatched = api_times(stack.base, stack.key, time.time() + args.seconds / 2)
            viewers = viewer_tickets(stack, desktops, args.viewers)
            web = group_running("lebureau.asgi:application", stack.base.rsplit(":", 1)[1])
            start = time.time() + args.warm_up
            end = start + args.seconds
            receiving, sending = multiprocessing.Pipe(duplex=False)
            process = multiprocessing.get_context("fork").Process(
                target=watch_all, args=(viewers, start, end, sending)
            )
            process.start()
            time.sleep(max(0, start - time.time()))
            before = cpu_now(web, desktops)
            api = api_times(stack.base, stack.key, end)
            after = cpu_now(web, desktops)
            seen, viewers_cpu = receiving.recv()
            process.join()
        finally:
            bench.destroy_all()
            get_user_model().objects.filter(username__startswith=f"{stack.user.username}-viewer-").delete()
    cpu = {name: after[name] - before[name] for name in before}
    report(args, seen, api, unwatched, {**cpu, "viewers": viewers_cpu})


def report(args, seen: list[Seen], api: list[float], unwatched: list[float], cpu: dict[str, float]) -> None:
    failed = [s for s in seen if s.error]
    rates = [s.frames / args.seconds for s in seen if not s.error]
    latencies = [ms for s in seen for ms in s.latencies]
    missed = sum(s.missed for s in seen)
    kib = sum(s.received for s in seen) / 1024
    print()
    print(
        f"{args.viewers} viewers of {args.desktops} desktops through the screen relay, {args.seconds:.0f} s, "
        f"each desktop redrawing {args.rate:.0f} times a second"
    )
    for s in failed:
        print(f"  a viewer failed: {s.error}")
    print(summary("frames per viewer per second", rates, "fps"))
    print(f"{'':<28} {kib / args.seconds:.0f} KiB/s delivered to all viewers together")
    encodings = sum((s.encodings for s in seen), Counter())
    print(f"{'':<28} rectangles by encoding: {', '.join(f'{n} {c}' for n, c in encodings.most_common())}")
    print(summary("input -> screen latency", latencies, "ms"))
    print(f"{'':<28} keys whose echo never came within 2 s: {missed}")
    print(summary("GET /api/desktops meanwhile", api, "ms"))
    print(summary("... before, nobody watching", unwatched, "ms"))
    share = {name: 100 * seconds / cpu["cores"] for name, seconds in cpu.items()}
    rest = share["busy"] - share["desktops"] - share["web"] - share["viewers"]
    print(
        f"CPU of the machine's {os.cpu_count()} cores meanwhile: {share['busy']:.0f}% busy: the desktops "
        f"{share['desktops']:.0f}%, the web server (relays and API) {share['web']:.0f}%, the viewers "
        f"{share['viewers']:.0f}%, everything else (the worker, other work on the machine) {rest:.0f}%"
    )
    name = f"{args.viewers} viewers of {args.desktops} desktops"
    record(
        Figure(f"{name}: viewers that failed", len(failed), "", 0),
        Figure(f"{name}: frames per viewer per second, mean", statistics.mean(rates), "fps"),
        Figure(f"{name}: frames per viewer per second, slowest viewer", min(rates), "fps"),
        Figure(f"{name}: input -> screen latency p95", percentile(latencies, 0.95), "ms"),
        Figure(f"{name}: keys never echoed", missed, "", 0),
        Figure(f"{name}: API list p95 meanwhile", percentile(api, 0.95), "ms", 200),
        Figure(f"{name}: API list p95 before, the desktops unwatched", percentile(unwatched, 0.95), "ms"),
        Figure(
            f"{name}: the web server's CPU (relays and API)", 100 * cpu["web"] / args.seconds, "% of a core"
        ),
    )


if __name__ == "__main__":
    main()
