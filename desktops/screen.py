"""A desktop's screen as the API shows and drives it: screenshots, its size and pointer, input actions.

The control plane speaks RFB to the desktop's screen itself (``desktops.rfb``: its own VNC server, or
its engine's console when that is down), one short session per request. Viewers may look (with the
view-only password, so the desktop's server itself refuses their input); acting needs the role that
may take control, and each batch of actions is audited. A batch is checked whole, against the
screen's size too, before its first action is sent: a bad one changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import struct
import unicodedata
from dataclasses import dataclass, field

from django.utils.translation import gettext as _
from PIL import Image

from desktops.audit import Actor, audit_record, desktop_actor
from desktops.errors import Conflict, Invalid, Unavailable
from desktops.long_calls import LongCall, database_let_go
from desktops.models import Desktop, DesktopState
from desktops.rfb import RfbReader, ScreenUnreachable, ServerRefused, screen_link_open, server_handshake
from desktops.selectors import workspace_for_control

MAX_ACTIONS = 100
MAX_TEXT = 2000
MAX_WAIT_MS = 10_000
# Waits of a batch, added up: a request holds a worker no longer than this.
MAX_TOTAL_WAIT_MS = 30_000
MAX_SCROLL = 50
MAX_KEYS_IN_COMBINATION = 6
FORMATS = {"png": "image/png", "jpeg": "image/jpeg"}
JPEG_QUALITY = 80
# After a batch, the screenshot waits until the screen has not changed for this long (or MAX_SETTLE):
# what the actions set off is drawn by then.
SETTLE_QUIET = 0.1
MAX_SETTLE = 2.0
DRAG_STEPS = 8
CONNECT_TIMEOUT = 15
# What a desktop's screen server may ask of the control plane, whoever runs it (the desktop's root may
# replace it): a screen of at most this many pixels (a 4K one: 32 MiB at 4 bytes a pixel), and per
# update at most so many rectangles, drawing at most so many screens' worth of pixels, in at most so
# many rows per line of the screen (a row narrower than the screen is copied on its own, about a
# microsecond each: a server's updates redraw what changed, seldom the screen's height twice).
MAX_SCREEN_SIDE = 8192
MAX_SCREEN_PIXELS = 3840 * 2160
MAX_RECTS_PER_UPDATE = 10_000
MAX_SCREENS_PER_UPDATE = 4
MAX_ROWS_PER_LINE = 8

# RFB messages (RFC 6143 §7.5, §7.6) and the pseudo-encodings the client asks for.
SET_PIXEL_FORMAT, SET_ENCODINGS, UPDATE_REQUEST, KEY_EVENT, POINTER_EVENT = 0, 2, 3, 4, 5
FRAMEBUFFER_UPDATE, SET_COLOUR_MAP, BELL, SERVER_CUT_TEXT = 0, 1, 2, 3
RAW, COPY_RECT, DESKTOP_SIZE, CURSOR_POSITION = 0, 1, -223, 0x574D5666
# 32 bits a pixel, true colour, little-endian red at bit 16: in memory B, G, R, X, which Pillow reads as is.
PIXEL_FORMAT = struct.pack(">BBBBHHHBBB3x", 32, 24, 0, 1, 255, 255, 255, 16, 8, 0)

BUTTONS = {"left": 1, "middle": 2, "right": 3}
SCROLL_BUTTONS = {"up": 4, "down": 5, "left": 6, "right": 7}
# X keysyms for key names (X11/keysymdef.h); a single character is its own keysym.
KEYSYMS = {
    "ctrl": 0xFFE3,
    "control": 0xFFE3,
    "shift": 0xFFE1,
    "alt": 0xFFE9,
    "altgr": 0xFE03,
    "super": 0xFFEB,
    "meta": 0xFFEB,
    "win": 0xFFEB,
    "enter": 0xFF0D,
    "return": 0xFF0D,
    "tab": 0xFF09,
    "escape": 0xFF1B,
    "esc": 0xFF1B,
    "backspace": 0xFF08,
    "delete": 0xFFFF,
    "del": 0xFFFF,
    "insert": 0xFF63,
    "home": 0xFF50,
    "end": 0xFF57,
    "pageup": 0xFF55,
    "page_up": 0xFF55,
    "pagedown": 0xFF56,
    "page_down": 0xFF56,
    "left": 0xFF51,
    "up": 0xFF52,
    "right": 0xFF53,
    "down": 0xFF54,
    "space": 0x20,
    "menu": 0xFF67,
    "print": 0xFF61,
    "plus": 0x2B,
    **{f"f{n}": 0xFFBE + n - 1 for n in range(1, 25)},
}
# The control characters text may hold; others are keys, pressed with a key action.
TYPED_KEYSYMS = {"\n": 0xFF0D, "\t": 0xFF09}


def keysym_of(character: str) -> int:
    """The X keysym that types `character`: Latin-1 ones are their own code, any other Unicode
    character is 0x01000000 plus its code point (the X protocol's rule, which RFB follows)."""
    if character in TYPED_KEYSYMS:
        return TYPED_KEYSYMS[character]
    code = ord(character)
    if 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xFF:
        return code
    return 0x01000000 + code


def keys_parse(combination: str) -> list[int]:
    """``ctrl+l``, ``alt+F4``, ``ctrl+shift+t``, ``enter``: the keysyms to press in that order."""
    names = combination.split("+")
    if not 0 < len(names) <= MAX_KEYS_IN_COMBINATION:
        raise ValueError(_("A key combination has 1 to %(max)d keys.") % {"max": MAX_KEYS_IN_COMBINATION})
    keysyms = []
    for name in names:
        if len(name) == 1 and name.isprintable() and name != " ":
            # ctrl+L means the L key, as on a keyboard: shift is asked for by name.
            keysyms.append(keysym_of(name.lower()))
        elif name.lower() in KEYSYMS:
            keysyms.append(KEYSYMS[name.lower()])
        else:
            raise ValueError(_("“%(name)s” is not a key name.") % {"name": name})
    return keysyms


@dataclass(frozen=True)
class Action:
    """One step of a batch, as the API validated it; its coordinates are checked against the screen."""

    type: str
    x: int | None = None
    y: int | None = None
    to_x: int | None = None
    to_y: int | None = None
    button: str = "left"
    double: bool = False
    dx: int = 0
    dy: int = 0
    text: str = ""
    keys: str = ""
    ms: int = 0

    def points(self) -> list[tuple[int, int]]:
        points = [(self.x, self.y), (self.to_x, self.to_y)]
        return [p for p in points if p[0] is not None]


@dataclass(frozen=True)
class ScreenshotOptions:
    format: str = "png"
    width: int | None = None  # scaled down to this width, never up


@dataclass(frozen=True)
class Screenshot:
    data: bytes
    content_type: str
    width: int
    height: int
    screen_width: int
    screen_height: int

    @property
    def scale(self) -> float:
        """Image pixels per screen pixel: a point in the image is (x / scale, y / scale) on the screen."""
        return self.width / self.screen_width


@dataclass(frozen=True)
class ScreenInfo:
    width: int
    height: int
    name: str
    cursor: tuple[int, int] | None  # when the desktop's server tells it


@dataclass(frozen=True)
class ActionsDone:
    count: int
    screenshot: Screenshot | None


@dataclass(frozen=True)
class Pixels:
    """A copy of the screen, made into an image once the RFB session's step is over: encoding holds
    the CPU for tens of milliseconds, which no loop needs to wait for."""

    width: int
    height: int
    data: bytes  # B, G, R, X for each pixel (PIXEL_FORMAT)

    def image(self, options: ScreenshotOptions) -> Screenshot:
        image = Image.frombuffer("RGB", (self.width, self.height), self.data, "raw", "BGRX", 0, 1)
        if options.width and options.width < self.width:
            height = max(1, round(self.height * options.width / self.width))
            image = image.resize((options.width, height), Image.Resampling.BILINEAR)
        out = io.BytesIO()
        if options.format == "jpeg":
            image.save(out, "JPEG", quality=JPEG_QUALITY)
        else:
            # Fast compression: screens are flat colours that compress well even so.
            image.save(out, "PNG", compress_level=1)
        return Screenshot(out.getvalue(), FORMATS[options.format], *image.size, self.width, self.height)


@dataclass
class _Framebuffer:
    width: int
    height: int
    cursor: tuple[int, int] | None = None
    pixels: bytearray = field(init=False)

    def __post_init__(self):
        if not (
            0 < self.width <= MAX_SCREEN_SIDE
            and 0 < self.height <= MAX_SCREEN_SIDE
            and self.width * self.height <= MAX_SCREEN_PIXELS
        ):
            raise ServerRefused(f"a {self.width}x{self.height} screen is beyond what is shown")
        self.pixels = bytearray(self.width * self.height * 4)


class RfbScreen:
    """One RFB session with a desktop's screen: its framebuffer kept from Raw and CopyRect updates,
    and pointer and key events sent to it."""

    def __init__(self, stream, reader: RfbReader, width: int, height: int, name: str):
        self.stream, self.reader = stream, reader
        self.framebuffer = _Framebuffer(width, height)
        self.name = name
        self.buttons = 0
        self.keyboard_used = False
        # Checked between rectangles: a server whose whole update is already buffered never lets the
        # loop run, so a timeout of the loop's alone would not interrupt it.
        self.deadline = math.inf

    @classmethod
    async def open(cls, *, desktop_id: str, host: str, mode: str) -> RfbScreen:
        """Raises Unavailable when neither the desktop's screen nor its engine's console lets us in."""
        try:
            link = await screen_link_open(desktop_id=desktop_id, host=host, mode=mode)
        except (ScreenUnreachable, ServerRefused) as exc:
            raise Unavailable(_("The desktop's screen is not answering: try again in a moment.")) from exc
        reader = RfbReader(link.stream.next_chunk)
        try:
            server_init = await asyncio.wait_for(
                server_handshake(reader, link.stream.write, link.password), CONNECT_TIMEOUT
            )
        except (ServerRefused, TimeoutError) as exc:
            await link.stream.close()
            if isinstance(exc, TimeoutError):  # connected, never greeted
                raise Unavailable(_("The desktop's screen is not answering: try again in a moment.")) from exc
            refused = _("The desktop's screen refused the connection: try again in a moment.")
            raise Unavailable(refused) from exc
        width, height = struct.unpack_from(">HH", server_init)
        try:
            screen = cls(link.stream, reader, width, height, server_init[24:].decode("utf-8", "replace"))
        except ServerRefused as exc:
            await link.stream.close()
            raise Unavailable(
                _("The desktop's screen says it is %(width)dx%(height)d, larger than Le Bureau shows.")
                % {"width": width, "height": height}
            ) from exc
        encodings = (RAW, COPY_RECT, DESKTOP_SIZE, CURSOR_POSITION)
        await link.stream.write(
            struct.pack(">B3x", SET_PIXEL_FORMAT)
            + PIXEL_FORMAT
            + struct.pack(f">BxH{len(encodings)}i", SET_ENCODINGS, len(encodings), *encodings)
        )
        return screen

    @property
    def size(self) -> tuple[int, int]:
        return self.framebuffer.width, self.framebuffer.height

    async def close(self) -> None:
        await self.stream.close()

    async def request(self, *, incremental: bool, area: tuple[int, int, int, int] | None = None) -> None:
        x, y, w, h = area or (0, 0, *self.size)
        await self.stream.write(struct.pack(">BBHHHH", UPDATE_REQUEST, int(incremental), x, y, w, h))

    async def update(self, *, quiet: float | None = None) -> bool:
        """Read server messages up to and including the next framebuffer update, and apply it; False
        when none began within `quiet` seconds."""
        while True:
            try:
                kind = (await asyncio.wait_for(self.reader.read(1), quiet))[0]
            except TimeoutError:
                if quiet is None:
                    raise
                return False
            if kind == FRAMEBUFFER_UPDATE:
                break
            if kind == SET_COLOUR_MAP:  # never sent for true colour; skipped should a server send it
                _padding, _first, count = struct.unpack(">BHH", await self.reader.read(5))
                await self.reader.read(6 * count)
            elif kind == SERVER_CUT_TEXT:
                (length,) = struct.unpack(">3xI", await self.reader.read(7))
                await self.reader.read(length)
            elif kind != BELL:
                raise ServerRefused(f"unknown server message type {kind}")
        (count,) = struct.unpack(">xH", await self.reader.read(3))
        if count > MAX_RECTS_PER_UPDATE:
            raise ServerRefused(f"an update of {count} rectangles")
        drawn = rows = 0
        loop = asyncio.get_running_loop()
        for _step in range(count):
            if loop.time() > self.deadline:
                raise TimeoutError
            x, y, w, h, encoding = struct.unpack(">HHHHi", await self.reader.read(12))
            if encoding in (RAW, COPY_RECT):
                fb = self.framebuffer
                drawn, rows = drawn + w * h, rows + h
                if (
                    drawn > MAX_SCREENS_PER_UPDATE * fb.width * fb.height
                    or rows > MAX_ROWS_PER_LINE * fb.height
                ):
                    raise ServerRefused("an update drawing the screen over and over")
            await self._rectangle(x, y, w, h, encoding)
        return True

    async def _rectangle(self, x: int, y: int, w: int, h: int, encoding: int) -> None:
        fb = self.framebuffer
        if encoding == DESKTOP_SIZE:
            self.framebuffer = _Framebuffer(w, h, cursor=fb.cursor)
        elif encoding == CURSOR_POSITION:
            fb.cursor = (x, y)
        elif x + w > fb.width or y + h > fb.height:
            raise ServerRefused(f"a {w}x{h} rectangle at {x},{y} is off a {fb.width}x{fb.height} screen")
        elif encoding == RAW:
            stride, row = fb.width * 4, w * 4
            if x == 0 and w == fb.width:  # whole rows: straight into the framebuffer
                await self.reader.read_into(memoryview(fb.pixels)[y * stride : (y + h) * stride])
                return
            data = bytearray(row * h)
            await self.reader.read_into(memoryview(data))
            for line in range(h):
                start = (y + line) * stride + x * 4
                fb.pixels[start : start + row] = data[line * row : (line + 1) * row]
        elif encoding == COPY_RECT:
            source_x, source_y = struct.unpack(">HH", await self.reader.read(4))
            if source_x + w > fb.width or source_y + h > fb.height:
                raise ServerRefused(f"a copy from {source_x},{source_y} reaches off the screen")
            stride, row = fb.width * 4, w * 4
            # Each row copied alone (not the framebuffer's rest), all before any is written: the two
            # areas may overlap.
            sources = ((source_y + i) * stride + source_x * 4 for i in range(h))
            rows = [fb.pixels[start : start + row] for start in sources]
            for line, data in enumerate(rows):
                start = (y + line) * stride + x * 4
                fb.pixels[start : start + row] = data
        else:
            raise ServerRefused(f"encoding {encoding} was not asked for")

    async def full(self) -> None:
        await self.request(incremental=False)
        await self.update()

    async def settle(self) -> None:
        """Follow the screen's changes until it has been still for SETTLE_QUIET."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + MAX_SETTLE
        await self.full()
        while loop.time() < deadline:
            await self.request(incremental=True)
            if not await self.update(quiet=SETTLE_QUIET):
                return

    def pixels(self) -> Pixels:
        fb = self.framebuffer
        return Pixels(fb.width, fb.height, bytes(fb.pixels))

    # Input

    async def pointer(self, x: int, y: int, buttons: int | None = None) -> None:
        if buttons is not None:
            self.buttons = buttons
        await self.stream.write(struct.pack(">BBHH", POINTER_EVENT, self.buttons, x, y))

    async def key(self, keysym: int, down: bool) -> None:
        if not self.keyboard_used:
            # A Shift press and release (which types nothing) first: the first key event an X session
            # gets makes its clients load their keymap, and a character the VNC server maps on the fly
            # for that very event (an "é" opening a fresh desktop's first batch) arrives unmapped.
            self.keyboard_used = True
            for pressed in (True, False):
                await self.stream.write(struct.pack(">BBxxI", KEY_EVENT, int(pressed), KEYSYMS["shift"]))
        await self.stream.write(struct.pack(">BBxxI", KEY_EVENT, int(down), keysym))

    async def perform(self, action: Action) -> None:
        kind = action.type
        if kind == "move":
            await self.pointer(action.x, action.y)
        elif kind == "click":
            mask = 1 << (BUTTONS[action.button] - 1)
            await self.pointer(action.x, action.y)
            for _step in range(2 if action.double else 1):
                await self.pointer(action.x, action.y, mask)
                await self.pointer(action.x, action.y, 0)
        elif kind == "drag":
            mask = 1 << (BUTTONS[action.button] - 1)
            await self.pointer(action.x, action.y)
            await self.pointer(action.x, action.y, mask)
            for step in range(1, DRAG_STEPS + 1):
                x = action.x + (action.to_x - action.x) * step // DRAG_STEPS
                y = action.y + (action.to_y - action.y) * step // DRAG_STEPS
                await self.pointer(x, y)
            await self.pointer(action.to_x, action.to_y, 0)
        elif kind == "scroll":
            await self.pointer(action.x, action.y)
            for amount, (back, forth) in ((action.dy, ("up", "down")), (action.dx, ("left", "right"))):
                mask = 1 << (SCROLL_BUTTONS[forth if amount > 0 else back] - 1)
                for _step in range(abs(amount)):
                    await self.pointer(action.x, action.y, mask)
                    await self.pointer(action.x, action.y, 0)
        elif kind == "type":
            for character in action.text:
                await self.key(keysym_of(character), True)
                await self.key(keysym_of(character), False)
        elif kind == "key":
            keysyms = keys_parse(action.keys)
            for keysym in keysyms:
                await self.key(keysym, True)
            for keysym in reversed(keysyms):
                await self.key(keysym, False)
        elif kind == "wait":
            await asyncio.sleep(action.ms / 1000)


def _running(desktop: Desktop) -> None:
    if desktop.state != DesktopState.RUNNING or not desktop.private_ip:
        raise Conflict(
            _("The desktop is %(state)s: start it first.") % {"state": desktop.get_state_display()}
        )


class _Session:
    """One RFB session, run on an event loop of the calling thread's own, never the web server's: a
    hostile screen server stalls this request alone. The loop runs only during `step()`, so between
    steps the thread may use the database (Django refuses to under a running loop)."""

    def __init__(self, desktop: Desktop, mode: str, connect_within: float = CONNECT_TIMEOUT):
        self.desktop, self.mode, self.connect_within = desktop, mode, connect_within

    def __enter__(self) -> _Session:
        self.runner = asyncio.Runner()
        opening = RfbScreen.open(desktop_id=self.desktop.id, host=self.desktop.private_ip, mode=self.mode)
        try:
            self.screen = self.runner.run(asyncio.wait_for(opening, self.connect_within))
        except TimeoutError as exc:
            self.runner.close()
            raise Unavailable(_("The desktop's screen is not answering: try again in a moment.")) from exc
        except BaseException:
            self.runner.close()
            raise
        return self

    def step(self, work, seconds: float):
        """`work(screen)` within `seconds`, or Unavailable: the screen was too slow or went wrong."""

        async def timed():
            loop = asyncio.get_running_loop()
            self.screen.deadline = loop.time() + seconds
            return await asyncio.wait_for(work(self.screen), seconds)

        try:
            return self.runner.run(timed())
        except TimeoutError as exc:
            raise Unavailable(_("The desktop's screen is too slow to answer: try again.")) from exc
        except (ServerRefused, OSError) as exc:
            raise Unavailable(_("The desktop's screen stopped answering: try again in a moment.")) from exc

    def __exit__(self, *exc) -> None:
        try:
            self.runner.run(self.screen.close())
        finally:
            self.runner.close()


def _slot(caller: Actor | None, seconds: float):
    """One of the caller's long-call slots for a session (each may hold a whole screen in memory):
    none for the platform's own screenshots, which are time-boxed and shared per workspace instead."""
    return LongCall(caller, seconds) if caller is not None else contextlib.nullcontext()


def screen_screenshot(
    *, desktop: Desktop, options: ScreenshotOptions, caller: Actor | None, seconds: float = CONNECT_TIMEOUT
) -> Screenshot:
    """The desktop's screen as an image, within `seconds` to connect and as many to draw; any role
    that sees the desktop may take one."""
    _running(desktop)

    async def shoot(screen: RfbScreen) -> Pixels:
        await screen.full()
        return screen.pixels()

    with _slot(caller, 2 * seconds), _Session(desktop, "view", connect_within=seconds) as session:
        database_let_go()
        pixels = session.step(shoot, seconds)
    return pixels.image(options)


def screen_info(*, desktop: Desktop, caller: Actor | None) -> ScreenInfo:
    """The screen's size, and where its pointer is if the desktop's server says."""
    _running(desktop)

    async def read(screen: RfbScreen) -> ScreenInfo:
        # A one-pixel update carries the pointer's position too, from servers that report it.
        await screen.request(incremental=False, area=(0, 0, 1, 1))
        await screen.update()
        fb = screen.framebuffer
        return ScreenInfo(fb.width, fb.height, screen.name, fb.cursor)

    with _slot(caller, 2 * CONNECT_TIMEOUT), _Session(desktop, "view") as session:
        return session.step(read, CONNECT_TIMEOUT)


def actions_check(actions: list[Action], screen: tuple[int, int] | None = None) -> None:
    """The whole batch against its limits, and once it is known, against the screen's size."""
    if not 0 < len(actions) <= MAX_ACTIONS:
        raise Invalid(
            _("A batch has 1 to %(max)d actions.") % {"max": MAX_ACTIONS},
            fields={"actions": [_("Wrong number of actions.")]},
        )
    if sum(action.ms for action in actions) > MAX_TOTAL_WAIT_MS:
        raise Invalid(
            _("A batch waits %(max)d ms at most in all.") % {"max": MAX_TOTAL_WAIT_MS},
            fields={"actions": [_("Too long a wait.")]},
        )
    for index, action in enumerate(actions):
        where = f"actions[{index}]"
        if len(action.text) > MAX_TEXT:
            raise Invalid(
                _("Action %(index)d: at most %(max)d characters are typed at once.")
                % {"index": index, "max": MAX_TEXT},
                fields={where: [_("Too long a text.")]},
            )
        if any(unicodedata.category(c) == "Cc" and c not in TYPED_KEYSYMS for c in action.text):
            raise Invalid(
                _(
                    "Action %(index)d: text holds no control characters but line breaks and tabs"
                    " (press other keys with a key action)."
                )
                % {"index": index},
                fields={where: [_("A control character.")]},
            )
        if action.type == "key":
            try:
                keys_parse(action.keys)
            except ValueError as exc:
                message = _("Action %(index)d: %(why)s") % {"index": index, "why": exc}
                raise Invalid(message, fields={where: [str(exc)]}) from exc
        for x, y in action.points() if screen else ():
            width, height = screen
            if not (0 <= x < width and 0 <= y < height):
                raise Invalid(
                    _("Action %(index)d: the point %(x)d,%(y)d is outside the %(width)dx%(height)d screen.")
                    % {"index": index, "x": x, "y": y, "width": width, "height": height},
                    fields={where: [_("Outside the screen.")]},
                )


def screen_act(
    *, actor: Actor, desktop: Desktop, actions: list[Action], screenshot: ScreenshotOptions | None = None
) -> ActionsDone:
    """Perform a batch of input actions in order on the desktop's screen, then optionally take a
    screenshot once the screen has settled. Needs the role that may take control of the desktop."""
    workspace_for_control(actor=actor, workspace_id=desktop.workspace_id)
    return _act(actor=actor, desktop=desktop, actions=actions, screenshot=screenshot)


def screen_act_by_agent(
    *, desktop: Desktop, actions: list[Action], screenshot: ScreenshotOptions | None = None
) -> ActionsDone:
    """The same, by the desktop's own agent on its own screen (the guest endpoint, with the desktop's
    token), audited with the desktop as the actor."""
    return _act(actor=desktop_actor(desktop), desktop=desktop, actions=actions, screenshot=screenshot)


def _act(
    *, actor: Actor, desktop: Desktop, actions: list[Action], screenshot: ScreenshotOptions | None
) -> ActionsDone:
    _running(desktop)
    actions_check(actions)  # what needs no screen, before reaching it

    async def act(screen: RfbScreen) -> Pixels | None:
        for action in actions:
            await screen.perform(action)
        if screenshot is None:
            # Answered once the server has taken every event sent before it.
            await screen.request(incremental=False, area=(0, 0, 1, 1))
            await screen.update()
            return None
        await screen.settle()
        return screen.pixels()

    budget = MAX_SETTLE + sum(action.ms for action in actions) / 1000 + len(actions)
    with LongCall(actor, CONNECT_TIMEOUT + budget), _Session(desktop, "control") as session:
        actions_check(actions, session.screen.size)
        audit_record(
            actor=actor,
            action="desktop.screen.actions",
            workspace_id=desktop.workspace_id,
            target=desktop.id,
            count=len(actions),
            # What was done, not what was typed: text may carry secrets.
            types=sorted({action.type for action in actions}),
            typed=sum(len(action.text) for action in actions),
        )
        database_let_go()
        pixels = session.step(act, budget)
    return ActionsDone(len(actions), pixels.image(screenshot) if pixels else None)
