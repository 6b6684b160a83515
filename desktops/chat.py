"""The agent bridge, worker side: hand an operator's message to the agent runtime in the desktop.

The runtime is a command run over SSH as the desktop's agent user (the workspace's
`agent_command`, OpenClaw's CLI by default); its output is the agent's answer.
"""

from __future__ import annotations

import shlex

import paramiko
from django.utils import timezone

from desktops.models import ChatMessage, DesktopState
from workers.ssh import desktop_ssh_connect

# An agent turn may take long (it works in the desktop); past this the answer is given up on.
TURN_TIMEOUT = 3600
# Shells answer 127 for a command they cannot find.
NOT_FOUND = 127


def agent_command(template: str, *, session: str, message: str) -> str:
    return template.format(session=shlex.quote(session), message=shlex.quote(message))


def chat_deliver(*, message_id: str) -> None:
    """Run one queued agent turn; the reply row ends `done` with the answer or `error` with why."""
    if not ChatMessage.objects.filter(id=message_id, status=ChatMessage.Status.QUEUED).update(
        status=ChatMessage.Status.RUNNING
    ):
        return  # gone, or another worker has it
    reply = ChatMessage.objects.select_related("desktop__workspace", "reply_to").get(id=message_id)
    desktop = reply.desktop
    if desktop.state != DesktopState.RUNNING:
        return _finish(
            reply, f"The desktop is {desktop.state}: start it, then send the message again.", failed=True
        )
    template = desktop.workspace.agent_command
    command = agent_command(template, session=desktop.id, message=reply.reply_to.content)
    try:
        with desktop_ssh_connect(desktop_id=desktop.id, host=desktop.private_ip) as ssh:
            _, out, err = ssh.exec_command(command, timeout=TURN_TIMEOUT)
            answer, errors = out.read().decode(errors="replace"), err.read().decode(errors="replace")
            status = out.channel.recv_exit_status()
    except (paramiko.SSHException, OSError) as exc:
        return _finish(reply, f"The desktop's agent could not be reached: {exc}", failed=True)
    if status == NOT_FOUND:
        program = shlex.split(template)[0]
        return _finish(
            reply,
            f"This desktop has no agent runtime: `{program}` is not installed there. "
            "Use the full image, or set the workspace's agent command.",
            failed=True,
        )
    if status != 0:
        detail = errors.strip()[-2000:] or answer.strip()[-2000:]
        return _finish(reply, f"The agent stopped with status {status}: {detail}", failed=True)
    _finish(reply, answer.strip(), failed=False)


def _finish(reply: ChatMessage, content: str, *, failed: bool) -> None:
    ChatMessage.objects.filter(id=reply.id).update(
        content=content,
        status=ChatMessage.Status.ERROR if failed else ChatMessage.Status.DONE,
        completed_at=timezone.now(),
    )
