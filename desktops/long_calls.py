"""Calls that hold a web thread for long (a command, a transfer, a batch of screen actions): at most
`LONG_CALLS_PER_PERSON` of one person's (or one desktop's agent's) at once, across every web process,
past which the answer is a 429; and each gives its database connection back while it waits on the
desktop (`database_let_go`). Together these keep one member from taking the threads and the
connections that every tenant's requests share.
"""

from __future__ import annotations

import math

from django.conf import settings
from django.db import connection
from django.utils.translation import gettext as _

from desktops.audit import Actor
from desktops.errors import TooBusy
from desktops.slots import slot_free, slot_take

# A call may outlive its own limit a little (closing, the kill of a command that ignores SIGTERM).
GRACE = 30
# Said to the client: the earliest a slot frees, but no more than this (calls mostly end early).
MAX_RETRY_AFTER = 30


class LongCall:
    """A slot taken for one call; given back by `end()` (a download's stream ends it when closed)."""

    def __init__(self, actor: Actor, seconds: float):
        caller = f"user:{actor.user.pk}" if actor.user is not None else actor.label
        self.key = f"long-calls:{caller}"
        limit = settings.LONG_CALLS_PER_PERSON
        self.token, wait = slot_take(key=self.key, limit=limit, seconds=seconds + GRACE)
        if self.token is None:
            raise TooBusy(
                _("%(n)d of your commands, transfers or screen actions still run: wait for one to end.")
                % {"n": limit},
                retry_after=min(MAX_RETRY_AFTER, max(1, math.ceil(wait))),
            )

    def end(self) -> None:
        slot_free(key=self.key, token=self.token)

    def __enter__(self) -> LongCall:
        return self

    def __exit__(self, *exc) -> None:
        self.end()


def database_let_go() -> None:
    """Before a long wait on a desktop: the database connection goes back to the pool (autocommit, so
    nothing is lost; Django opens another if the call needs one again). Not inside a transaction (a
    test's)."""
    if not connection.in_atomic_block:
        connection.close()
