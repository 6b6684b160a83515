"""Run inside a desktop: its X clipboard (display :0 unless DISPLAY says otherwise) as UTF-8, with
Python and libX11 alone (the minimal image has no xclip). `get` prints it; `set TEXT` takes it and
answers for it until another program takes it, or a minute passes."""

import ctypes
import os
import signal
import sys
from ctypes import POINTER, byref, c_char_p, c_int, c_long, c_uint, c_ulong, c_void_p

Atom = Window = c_ulong
XA_ATOM, SELECTION_CLEAR, SELECTION_REQUEST, SELECTION_NOTIFY = 4, 29, 30, 31


class SelectionRequest(ctypes.Structure):
    _fields_ = [
        ("type", c_int),
        ("serial", c_ulong),
        ("send_event", c_int),
        ("display", c_void_p),
        ("owner", Window),
        ("requestor", Window),
        ("selection", Atom),
        ("target", Atom),
        ("property", Atom),
        ("time", c_ulong),
    ]


class Selection(ctypes.Structure):
    _fields_ = [
        ("type", c_int),
        ("serial", c_ulong),
        ("send_event", c_int),
        ("display", c_void_p),
        ("requestor", Window),
        ("selection", Atom),
        ("target", Atom),
        ("property", Atom),
        ("time", c_ulong),
    ]


class Event(ctypes.Union):
    _fields_ = [
        ("type", c_int),
        ("request", SelectionRequest),
        ("selection", Selection),
        ("pad", c_long * 24),
    ]


# XGetWindowProperty's answers: type, format, item count, bytes left, data.
OUT = [POINTER(Atom), POINTER(c_int), POINTER(c_ulong), POINTER(c_ulong), POINTER(c_void_p)]
x = ctypes.cdll.LoadLibrary("libX11.so.6")
for name, restype, argtypes in [
    ("XOpenDisplay", c_void_p, [c_char_p]),
    ("XDefaultRootWindow", Window, [c_void_p]),
    (
        "XCreateSimpleWindow",
        Window,
        [c_void_p, Window, c_int, c_int, c_uint, c_uint, c_uint, c_ulong, c_ulong],
    ),
    ("XInternAtom", Atom, [c_void_p, c_char_p, c_int]),
    ("XSetSelectionOwner", c_int, [c_void_p, Atom, Window, c_ulong]),
    ("XConvertSelection", c_int, [c_void_p, Atom, Atom, Atom, Window, c_ulong]),
    ("XNextEvent", c_int, [c_void_p, POINTER(Event)]),
    ("XChangeProperty", c_int, [c_void_p, Window, Atom, Atom, c_int, c_int, c_void_p, c_int]),
    ("XSendEvent", c_int, [c_void_p, Window, c_int, c_long, POINTER(Event)]),
    ("XFlush", c_int, [c_void_p]),
    (
        "XGetWindowProperty",
        c_int,
        [c_void_p, Window, Atom, c_long, c_long, c_int, Atom, *OUT],
    ),
]:
    getattr(x, name).restype, getattr(x, name).argtypes = restype, argtypes

display = x.XOpenDisplay(os.environ.get("DISPLAY", ":0").encode())
if not display:
    sys.exit("the display is not open")
window = x.XCreateSimpleWindow(display, x.XDefaultRootWindow(display), 0, 0, 1, 1, 0, 0, 0)
CLIPBOARD, UTF8, TARGETS, PROPERTY = (
    x.XInternAtom(display, name, 0) for name in (b"CLIPBOARD", b"UTF8_STRING", b"TARGETS", b"BUREAU_CLIP")
)
event = Event()


def get() -> bytes:
    signal.alarm(10)
    x.XConvertSelection(display, CLIPBOARD, UTF8, PROPERTY, window, 0)
    while x.XNextEvent(display, byref(event)) == 0 and event.type != SELECTION_NOTIFY:
        pass
    if not event.selection.property:
        return b""  # nobody holds the clipboard
    kind, size, count, left, data = Atom(), c_int(), c_ulong(), c_ulong(), c_void_p()
    x.XGetWindowProperty(
        display,
        window,
        PROPERTY,
        0,
        1 << 24,
        1,
        0,
        byref(kind),
        byref(size),
        byref(count),
        byref(left),
        byref(data),
    )
    return ctypes.string_at(data, count.value)


def hold(text: bytes) -> None:
    signal.alarm(60)
    x.XSetSelectionOwner(display, CLIPBOARD, window, 0)
    x.XFlush(display)
    targets = (Atom * 2)(TARGETS, UTF8)
    while x.XNextEvent(display, byref(event)) == 0 and event.type != SELECTION_CLEAR:
        if event.type != SELECTION_REQUEST:
            continue
        asked = event.request
        answer = Event()
        answer.selection.type = SELECTION_NOTIFY
        answer.selection.requestor, answer.selection.selection = asked.requestor, asked.selection
        answer.selection.target, answer.selection.time = asked.target, asked.time
        answer.selection.property = asked.property or asked.target
        if asked.target == TARGETS:
            x.XChangeProperty(display, asked.requestor, answer.selection.property, XA_ATOM, 32, 0, targets, 2)
        elif asked.target == UTF8:
            x.XChangeProperty(
                display, asked.requestor, answer.selection.property, UTF8, 8, 0, text, len(text)
            )
        else:
            answer.selection.property = 0  # refused: only text is held
        x.XSendEvent(display, asked.requestor, 0, 0, byref(answer))
        x.XFlush(display)


if sys.argv[1] == "get":
    sys.stdout.buffer.write(get())
else:
    hold(sys.argv[2].encode())
