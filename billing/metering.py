"""Usage from the record, never from a counter a lost task could skip.

Time in each state comes from the lifecycle's event log (every transition writes one, in the same
transaction), disk from the engines' measures counted into GiB-hours per day, tokens from the
agents' answers. A transition that never completed leaves the desktop in its transitional state,
which is not running: it counts as running only once the log says it runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from datetime import date, datetime, time, timedelta
from decimal import Decimal

from django.utils import timezone

from desktops.models import DesktopState as S

ZERO = Decimal(0)
GIB = 1024**3
_MICROSECOND = timedelta(microseconds=1)
# The states whose time is reported; only running time is charged by the hour.
MEASURED = {S.RUNNING: "running_seconds", S.SUSPENDED: "suspended_seconds", S.STOPPED: "stopped_seconds"}


@dataclass
class Meter:
    """Usage and what it costs, for one desktop-day or any sum of them (EUR, unrounded)."""

    running_seconds: Decimal = ZERO
    suspended_seconds: Decimal = ZERO
    stopped_seconds: Decimal = ZERO
    gib_hours: Decimal = ZERO
    input_tokens: int = 0
    output_tokens: int = 0
    compute: Decimal = ZERO
    storage: Decimal = ZERO
    models: Decimal = ZERO

    @property
    def running_hours(self) -> Decimal:
        return self.running_seconds / 3600

    @property
    def suspended_hours(self) -> Decimal:
        return self.suspended_seconds / 3600

    @property
    def stopped_hours(self) -> Decimal:
        return self.stopped_seconds / 3600

    @property
    def platform(self) -> Decimal:
        """What Le Bureau charges: the desktops' time and storage (the models are paid to their providers)."""
        return self.compute + self.storage

    @property
    def total(self) -> Decimal:
        return self.compute + self.storage + self.models

    def __iadd__(self, other: Meter) -> Meter:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    @classmethod
    def sum(cls, meters: Iterable[Meter]) -> Meter:
        total = cls()
        for meter in meters:
            total += meter
        return total


# Periods


def month_of(day: date) -> date:
    return day.replace(day=1)


def this_month() -> date:
    return month_of(timezone.localdate())


def month_parse(text: str) -> date:
    """A month written `YYYY-MM` (of this millennium, so that the next month exists too)."""
    month = datetime.strptime(text, "%Y-%m").date()
    if not 2000 <= month.year <= 2999:
        raise ValueError(f"{text} is out of range")
    return month


def next_month(month: date) -> date:
    return (month.replace(day=28) + timedelta(days=4)).replace(day=1)


def midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=timezone.get_default_timezone())


def seconds(delta: timedelta) -> Decimal:
    """Exact to the microsecond, as the event log keeps time."""
    return Decimal(delta // _MICROSECOND) / 1_000_000


def by_day(start: datetime, end: datetime) -> Iterator[tuple[date, Decimal]]:
    """The seconds of [start, end) that fall on each day."""
    while start < end:
        day = timezone.localtime(start).date()
        piece_end = min(end, midnight(day + timedelta(days=1)))
        yield day, seconds(piece_end - start)
        start = piece_end


def days_of(start: datetime, end: datetime) -> list[date]:
    """Every day [start, end) touches."""
    return [day for day, _ in by_day(start, end)]


# State time, from the event log

Span = tuple[str, datetime, datetime]


def state_spans(
    opening: dict[str, str], events: Iterable[tuple[str, datetime, str]], start: datetime, end: datetime
) -> dict[str, list[Span]]:
    """Each desktop's (state, from, to) within [start, end).

    `opening` is each desktop's state at `start` (from its last event before it); `events` are the
    (desktop, at, new state) rows of the log within the period, in time order.
    """
    spans: dict[str, list[Span]] = defaultdict(list)
    state, since = dict(opening), dict.fromkeys(opening, start)
    for desktop_id, at, to_state in events:
        if desktop_id in state:
            spans[desktop_id].append((state[desktop_id], since[desktop_id], at))
        state[desktop_id], since[desktop_id] = to_state, at
    for desktop_id, current in state.items():
        spans[desktop_id].append((current, since[desktop_id], end))
    return spans


def state_time(spans: Iterable[Span]) -> dict[date, Meter]:
    """Seconds running, suspended and stopped per day; other states (on the way, error) are not counted."""
    days: dict[date, Meter] = defaultdict(Meter)
    for state, start, end in spans:
        name = MEASURED.get(state)
        if name is not None:
            for day, secs in by_day(start, end):
                setattr(days[day], name, getattr(days[day], name) + secs)
    return days


def running_peaks(spans: Iterable[Span]) -> dict[date, int]:
    """The most desktops running at once on each day."""
    changes: dict[date, list[tuple[datetime, int]]] = defaultdict(list)
    for state, start, end in spans:
        if state != S.RUNNING:
            continue
        for day, _ in by_day(start, end):
            day_end = midnight(day + timedelta(days=1))
            changes[day] += [(max(start, midnight(day)), 1), (min(end, day_end), -1)]
    peaks = {}
    for day, points in changes.items():
        running = peak = 0
        # At one instant, a desktop stopping goes before one starting: they never ran together.
        for _, change in sorted(points):
            running += change
            peak = max(peak, running)
        peaks[day] = peak
    return peaks


# Disk, from the engines' measures


def gib_hours(bytes_: int, start: datetime, end: datetime) -> Iterator[tuple[date, Decimal]]:
    """GiB-hours a disk holding `bytes_` from `start` to `end` adds to each day."""
    for day, secs in by_day(start, end):
        yield day, Decimal(bytes_) * secs / (GIB * 3600)
