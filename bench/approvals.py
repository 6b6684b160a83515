"""An agent's request for approval, from its desktop to an open Mission Control page.

    .venv/bin/python bench/approvals.py [--requests 30]

Starts the guest endpoint and the web app (daphne each) on the bench database (`bench/database.py`),
opens the workspace's event stream as an open approvals page does, then, one request at a time, asks
through the guest endpoint with a desktop's token as `bureau approve` does and measures until the page
shows it: the request's event on the stream, then the queue fetched again with the request in it.
Target: p95 <= 500 ms. Removes what it made.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.database import django_setup  # noqa: E402
from bench.procfile import procfile_command  # noqa: E402

django_setup()

import requests  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402

from bench.missioncontrol import event_stream, session_cookie  # noqa: E402
from bench.report import Figure, record  # noqa: E402
from bench.stats import percentile, summary  # noqa: E402
from desktops import approvals, services  # noqa: E402
from desktops.audit import Actor  # noqa: E402
from desktops.crypto import api_token_hash  # noqa: E402
from desktops.models import Desktop, DesktopState, Plan  # noqa: E402
from tests.support.services import free_port, port_open, service_process  # noqa: E402


async def until(reader: asyncio.StreamReader, marker: bytes, seen: bytearray) -> None:
    while marker not in seen:
        chunk = await reader.read(65536)
        if not chunk:
            raise RuntimeError("the event stream closed")
        seen += chunk


async def measure(
    guest: str, web: str, port: int, workspace_id: str, token: str, cookie: str, count: int, answer
):
    reader, writer = await event_stream(port, f"/events/w/{workspace_id}/", cookie)
    ask = requests.Session()
    ask.headers["Authorization"] = f"Bearer {token}"
    page = requests.Session()
    page.cookies.set(settings.SESSION_COOKIE_NAME, cookie)
    queue = f"{web}/w/{workspace_id}/approvals/?fragment=1"
    page.get(queue).raise_for_status()  # warm-up
    seen, times = bytearray(), []
    for i in range(count):
        title = f"Déployer la version {i}"
        start = time.perf_counter()
        made = await asyncio.to_thread(
            ask.post, f"{guest}/v1/approvals", json={"title": title, "timeout": 60}
        )
        made.raise_for_status()
        await asyncio.wait_for(until(reader, made.json()["id"].encode(), seen), timeout=10)
        shown = await asyncio.to_thread(page.get, queue)
        assert title in shown.text, "the queue fetched after the event does not show the request"
        times.append(time.perf_counter() - start)
        # Answered before the next, as operators do: a desktop may have only so many waiting.
        await asyncio.to_thread(answer, made.json()["id"])
    writer.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()

    run = uuid.uuid4().hex[:8]
    user = get_user_model().objects.create_user(f"bench-{run}", f"bench-{run}@example.com", None)
    workspace = services.workspace_create(user=user, name="approvals bench")
    token = secrets.token_urlsafe(32)
    Desktop.objects.create(
        workspace=workspace,
        plan=Plan.objects.first(),
        name="asks",
        driver="bench",
        driver_ref=f"bench-{run}",
        state=DesktopState.RUNNING,
        image_profile="minimal",
        agent_token_hash=api_token_hash(token),
    )
    cookie = session_cookie(user)
    guest_port, web_port = free_port(), free_port()
    logs = Path(tempfile.mkdtemp())
    try:
        with (
            service_process(
                "guest",
                procfile_command("guest"),
                {**os.environ, "GUEST_HOST": "127.0.0.1", "GUEST_PORT": str(guest_port)},
                logs,
                lambda: port_open(guest_port),
            ),
            service_process(
                "web",
                procfile_command("web"),
                {**os.environ, "PORT": str(web_port)},
                logs,
                lambda: port_open(web_port),
            ),
        ):
            times = asyncio.run(
                measure(
                    f"http://127.0.0.1:{guest_port}",
                    f"http://127.0.0.1:{web_port}",
                    web_port,
                    workspace.id,
                    token,
                    cookie,
                    args.requests,
                    lambda approval_id: approvals.approval_decide(
                        actor=Actor(user=user), approval_id=approval_id, approve=True
                    ),
                )
            )
    finally:
        workspace.delete()
        user.delete()

    ms = [t * 1000 for t in times]
    print(f"{args.requests} requests for approval, one at a time, from the guest endpoint to an open page")
    print(summary("asked -> shown on the page", ms, unit="ms"))
    print(f"  p95 {percentile(ms, 0.95):.1f} ms (target <= 500 ms)")
    record(Figure("approval request -> shown in an open page, p95", percentile(ms, 0.95), "ms", 500))


if __name__ == "__main__":
    main()
