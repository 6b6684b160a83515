"""`lebureau mcp`: Le Bureau's desktops as tools of an MCP server (the official `mcp` SDK), on stdio, so any
MCP client (an IDE, another agent) can give a desktop's agent a task, run commands in the desktop and
start, stop or destroy it, with the API key's rights and no more.
"""

from __future__ import annotations

import functools
from dataclasses import asdict
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from lebureau_sdk import AsyncClient, LeBureauError

INSTRUCTIONS = (
    "Tools over Le Bureau's persistent cloud desktops for AI agents. A desktop is named by its id (dsk_…) "
    "or its name. send_message gives the desktop's own agent a task and returns its answer; run_command "
    "runs a shell command in the desktop as its agent user."
)


def build(base_url: str, api_key: str, *, default_desktop: str | None = None) -> MCPServer:
    server = MCPServer("lebureau", instructions=INSTRUCTIONS)
    api = AsyncClient(base_url, api_key)

    async def desktop_id(desktop: str | None) -> str:
        ref = desktop or default_desktop
        if not ref:
            raise ToolError("Name a desktop (its id or name): this server has no default one.")
        if ref.startswith("dsk_"):
            return ref
        async for found in api.desktops.list(name=ref):
            return found.id
        raise ToolError(f"No desktop named {ref!r}.")

    def brief(desktop) -> dict[str, Any]:
        return {
            "id": desktop.id,
            "name": desktop.name,
            "state": desktop.state,
            "labels": desktop.labels,
            "ip": desktop.private_ip,
            "error": desktop.last_error,
        }

    def tool(fn):
        """A tool whose API errors come back to the client as the API's words."""

        @functools.wraps(fn)
        async def run(*args, **kwargs):
            try:
                return await fn(*args, **kwargs)
            except LeBureauError as exc:
                raise ToolError(f"{exc.message} ({exc.code})") from exc

        return server.tool()(run)

    @tool
    async def list_desktops(label: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
        """The desktops this key sees, optionally those with a label or in a state."""
        return [brief(d) async for d in api.desktops.list(labels=[label] if label else None, state=state)]

    @tool
    async def create_desktop(
        name: str, image_profile: str = "full", labels: list[str] | None = None
    ) -> dict[str, Any]:
        """Create a desktop (lowercase letters, digits, hyphens) and wait until it runs."""
        desktop = await api.desktops.create(name, image_profile=image_profile, labels=labels, wait=True)
        return brief(desktop)

    async def step(name: str, desktop: str | None) -> dict[str, Any]:
        done = await getattr(api.desktops, name)(await desktop_id(desktop), wait=True)
        return brief(done)

    @tool
    async def start_desktop(desktop: str | None = None) -> dict[str, Any]:
        """Start a stopped desktop and wait until it runs."""
        return await step("start", desktop)

    @tool
    async def stop_desktop(desktop: str | None = None) -> dict[str, Any]:
        """Stop a running desktop (its disk stays) and wait until it has stopped."""
        return await step("stop", desktop)

    @tool
    async def suspend_desktop(desktop: str | None = None) -> dict[str, Any]:
        """Suspend a running desktop, keeping its memory."""
        return await step("suspend", desktop)

    @tool
    async def resume_desktop(desktop: str | None = None) -> dict[str, Any]:
        """Resume a suspended desktop."""
        return await step("resume", desktop)

    @tool
    async def destroy_desktop(desktop: str) -> dict[str, Any]:
        """Destroy a desktop and wipe its disk, for good. Always name the desktop."""
        return await step("destroy", desktop)

    @tool
    async def send_message(message: str, desktop: str | None = None, timeout: float = 900) -> dict[str, Any]:
        """Give the desktop's own agent a task and wait for its whole answer (status done or error)."""
        reply = await api.chat.ask(await desktop_id(desktop), message, timeout=timeout)
        return {"status": reply.status, "answer": reply.content, "message_id": reply.id}

    @tool
    async def read_conversation(desktop: str | None = None, last: int = 20) -> list[dict[str, Any]]:
        """The last messages between operators and the desktop's agent, oldest first."""
        messages = [m async for m in api.chat.list(await desktop_id(desktop))]
        return [{"author": m.author, "status": m.status, "content": m.content} for m in messages[-last:]]

    @tool
    async def run_command(command: str, desktop: str | None = None, timeout: int = 60) -> dict[str, Any]:
        """Run a shell command line in the desktop as its agent user: exit code, stdout, stderr."""
        result = await api.desktops.exec(await desktop_id(desktop), command, timeout=timeout)
        return asdict(result)

    return server


def serve(base_url: str, api_key: str, *, default_desktop: str | None = None) -> None:
    build(base_url, api_key, default_desktop=default_desktop).run("stdio")
