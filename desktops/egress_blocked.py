"""Every attempt of a desktop to reach what its egress policy refuses, counted per destination.

The engines count them (the LXC engine: its resolver's refused look-ups, and a counter per address in
nftables for the packets dropped); those counters are read periodically, by the alerts' evaluation,
and what they grew by since the last reading is added to the desktop's counts here, which outlive the
engine's own (an engine forgets an address left alone for a while, a resolver's log is cut).
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from desktops.engines import desktop_blocked_egress
from desktops.models import BlockedAttempt, Desktop

Via = BlockedAttempt.Via


def blocked_attempts_record(desktop: Desktop) -> int | None:
    """Read what the desktop's engine counted and add what is new; how many new attempts (None where its
    engine cannot tell)."""
    found = desktop_blocked_egress(desktop)
    if found is None:
        return None
    readings = [(Via.NAME, name, count) for name, count in found.names]
    readings += [(Via.ADDRESS, b.address, b.packets) for b in found.addresses]
    now, new = timezone.now(), 0
    with transaction.atomic():
        known = {
            (b.via, b.destination): b
            for b in BlockedAttempt.objects.select_for_update().filter(desktop=desktop)
        }
        for via, destination, count in readings:
            row = known.get((via, destination))
            grown = _grown(via, 0 if row is None else row.engine_count, count)
            if row is None:
                BlockedAttempt.objects.create(
                    desktop=desktop,
                    via=via,
                    destination=destination[:253],
                    attempts=grown,
                    engine_count=count,
                    last_at=now,
                )
            elif grown or count != row.engine_count:
                row.attempts += grown
                row.engine_count = count
                row.last_at = now if grown else row.last_at
                row.save(update_fields=["attempts", "engine_count", "last_at"])
            new += grown
    return new


def _grown(via: str, before: int, now: int) -> int:
    """What an engine's counter grew by. An address's packet counter starts again from nothing once the
    engine forgot the address; a name's count is over the end of the resolver's log only, so it may
    shrink as older look-ups leave that end: then nothing is new."""
    if now >= before:
        return now - before
    return now if via == Via.ADDRESS else 0


def blocked_attempts_of(*, desktop: Desktop) -> QuerySet[BlockedAttempt]:
    """The destinations the desktop was refused, the latest attempt first."""
    return desktop.blocked_attempts.all()
