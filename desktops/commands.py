"""A command run in a desktop, as its agent user, over the control plane's pinned SSH: what CI and
scripts use where a person would open the terminal. Bounded in time and in output, and audited.
"""

from __future__ import annotations

import select
import shlex
import time
from dataclasses import dataclass

import paramiko
from django.utils.translation import gettext as _

from desktops.audit import Actor, audit_record
from desktops.errors import Conflict, Invalid, Unavailable
from desktops.guest import desktop_ssh_connect
from desktops.long_calls import LongCall, database_let_go
from desktops.models import Desktop, DesktopState
from desktops.selectors import workspace_for_control

MAX_SECONDS = 600
# Each of stdout and stderr; what comes after is read and dropped, so the command never blocks on it.
MAX_OUTPUT = 1024 * 1024
# A command that ignores SIGTERM at its time limit is killed this much later.
KILL_AFTER = 5


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None: the connection broke before the command ended
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration_ms: int


def desktop_exec(
    *, actor: Actor, desktop: Desktop, command: str, timeout: int = 60, stdin: str = ""
) -> CommandResult:
    """Run `command` with the agent user's shell in the running desktop; needs the role that may take
    control of it (a command reads all the desktop holds)."""
    workspace_for_control(actor=actor, workspace_id=desktop.workspace_id)
    if not command.strip():
        raise Invalid(_("Give a command to run."), fields={"command": [_("Empty.")]})
    if not 1 <= timeout <= MAX_SECONDS:
        raise Invalid(
            _("A command runs for 1 to %(max)d seconds.") % {"max": MAX_SECONDS},
            fields={"timeout": [_("Out of range.")]},
        )
    if desktop.state != DesktopState.RUNNING:
        raise Conflict(
            _("The desktop is %(state)s: start it first.") % {"state": desktop.get_state_display()}
        )
    # The program, not the whole line: arguments may carry secrets, as chat messages may.
    program = command.split(maxsplit=1)[0][:100]
    audit_record(
        actor=actor,
        action="desktop.exec",
        workspace_id=desktop.workspace_id,
        target=desktop.id,
        program=program,
        length=len(command),
        timeout=timeout,
    )
    with LongCall(actor, timeout + KILL_AFTER):
        return _run(desktop, command, timeout, stdin)


def _run(desktop: Desktop, command: str, timeout: int, stdin: str) -> CommandResult:
    try:
        ssh = desktop_ssh_connect(desktop_id=desktop.id, host=desktop.private_ip)
    except (paramiko.SSHException, OSError) as exc:
        raise Unavailable(_("The desktop's shell is not answering: try again in a moment.")) from exc
    started = time.monotonic()
    with ssh:
        # `timeout` in the desktop ends the command itself; closing our channel would not.
        wrapped = f'timeout --kill-after={KILL_AFTER} {timeout} "$SHELL" -c {shlex.quote(command)}'
        channel = ssh.get_transport().open_session()
        channel.exec_command(wrapped)
        if stdin:
            channel.sendall(stdin.encode())
        channel.shutdown_write()
        database_let_go()
        out, err, finished = _read(channel, deadline=started + timeout + KILL_AFTER + 5)
    elapsed = time.monotonic() - started
    return CommandResult(
        exit_code=channel.recv_exit_status() if finished else None,
        stdout=bytes(out[:MAX_OUTPUT]).decode(errors="replace"),
        stderr=bytes(err[:MAX_OUTPUT]).decode(errors="replace"),
        stdout_truncated=len(out) > MAX_OUTPUT,
        stderr_truncated=len(err) > MAX_OUTPUT,
        timed_out=elapsed >= timeout,
        duration_ms=int(elapsed * 1000),
    )


def _read(channel: paramiko.Channel, *, deadline: float) -> tuple[bytearray, bytearray, bool]:
    """Both streams to their end (past the cap, one byte more than it is kept, to tell it was cut);
    whether the command's exit status came."""
    out, err = bytearray(), bytearray()
    while time.monotonic() < deadline:
        if channel.recv_ready():
            data = channel.recv(65536)
            out += data[: MAX_OUTPUT + 1 - len(out)]
        elif channel.recv_stderr_ready():
            data = channel.recv_stderr(65536)
            err += data[: MAX_OUTPUT + 1 - len(err)]
        elif channel.exit_status_ready() and channel.eof_received:
            return out, err, True
        elif channel.closed:
            return out, err, channel.exit_status_ready()
        else:
            select.select([channel], [], [], 0.2)
    return out, err, False
