"""Mission Control under a fleet: 1,000 desktops in one workspace, 200 live pages open.

    .venv/bin/python bench/missioncontrol.py [--desktops 1000] [--requests 200] [--streams 200]

Starts its own daphne on the bench database (`bench/database.py`) and measures over HTTP:
  - the desktops page and `GET /api/desktops` (first page, 50 rows): p50 / p95 / max latency of
    sequential requests, after a warm-up;
  - 200 server-sent event streams open on the workspace: the time from a desktop's state change
    (committed by this process, as a worker would) to its arrival on every stream.
Removes what it made.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.database import django_setup, vacuum_analyze  # noqa: E402
from bench.procfile import procfile_command  # noqa: E402

django_setup()

import requests  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model  # noqa: E402
from django.contrib.sessions.backends.db import SessionStore  # noqa: E402

from bench.report import Figure, record  # noqa: E402
from bench.stats import percentile, summary  # noqa: E402
from desktops import lifecycle, services  # noqa: E402
from desktops.audit import SYSTEM, Actor  # noqa: E402
from desktops.models import Desktop, DesktopState, Plan  # noqa: E402
from tests.support.services import free_port, port_open, service_process  # noqa: E402

OPEN_BATCH = 25


def session_cookie(user) -> str:
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    return session.session_key


def timed_gets(http: requests.Session, url: str, count: int) -> list[float]:
    for _ in range(5):  # warm-up: connections, caches, first queries
        http.get(url).raise_for_status()
    times = []
    for _ in range(count):
        start = time.perf_counter()
        http.get(url).raise_for_status()
        times.append(time.perf_counter() - start)
    return times


async def event_stream(
    port: int, path: str, cookie: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A page's server-sent event stream, once the server says it is open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
        f"Cookie: {settings.SESSION_COOKIE_NAME}={cookie}\r\n\r\n".encode()
    )
    await writer.drain()
    buffer = b""
    while b"stream-open" not in buffer:
        chunk = await reader.read(65536)
        if not chunk:
            raise RuntimeError(f"the event stream closed before opening: {buffer[:300]!r}")
        buffer += chunk
    return reader, writer  # the connection lasts as long as its writer is kept


async def open_stream(
    port: int, path: str, cookie: str, opened: asyncio.Event, ready: list
) -> asyncio.StreamReader:
    reader, writer = await event_stream(port, path, cookie)
    ready.append(writer)
    if len(ready) == opened.total:
        opened.set()
    return reader


async def wait_for_event(reader: asyncio.StreamReader, marker: bytes) -> float:
    buffer = b""
    while marker not in buffer:
        chunk = await reader.read(65536)
        if not chunk:
            raise RuntimeError("an event stream closed before the change arrived")
        buffer += chunk
    return time.perf_counter()


async def fan_out(port: int, path: str, cookie: str, streams: int, change) -> list[float]:
    opened = asyncio.Event()
    opened.total = streams
    writers: list = []
    # Pages open a few at a time, as people do: each opening briefly takes a database connection
    # (PostgreSQL allows 100 by default), an open stream then holds none.
    readers = []
    for first in range(0, streams, OPEN_BATCH):
        batch = range(first, min(first + OPEN_BATCH, streams))
        readers += await asyncio.gather(*(open_stream(port, path, cookie, opened, writers) for _ in batch))
    await opened.wait()
    marker = f'"state": "{DesktopState.STOPPING}"'.encode()
    waits = [asyncio.create_task(wait_for_event(r, marker)) for r in readers]
    await asyncio.sleep(0.5)
    start = time.perf_counter()
    await asyncio.to_thread(change)
    arrived = await asyncio.wait_for(asyncio.gather(*waits), timeout=30)
    for writer in writers:
        writer.close()
    return [t - start for t in arrived]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--desktops", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--streams", type=int, default=200)
    args = parser.parse_args()

    run = uuid.uuid4().hex[:8]
    user = get_user_model().objects.create_user(f"bench-{run}", f"bench-{run}@example.com", None)
    workspace = services.workspace_create(user=user, name="fleet bench")
    _, key = services.api_key_create(
        actor=Actor(user=user), workspace_id=workspace.id, name="b", scope="write"
    )
    plan = Plan.objects.first()
    Desktop.objects.bulk_create(
        Desktop(
            workspace=workspace,
            plan=plan,
            name=f"agent-{i:04d}",
            driver="bench",
            driver_ref=f"bench-{i}",
            state=DesktopState.RUNNING,
            private_ip=f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
            image_profile="minimal",
        )
        for i in range(args.desktops)
    )
    vacuum_analyze("desktops_desktop")
    target = workspace.desktops.order_by("name").first()
    cookie = session_cookie(user)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        with service_process(
            "web",
            procfile_command("web"),
            {**os.environ, "PORT": str(port)},
            Path(tempfile.mkdtemp()),
            lambda: port_open(port),
        ):
            page = requests.Session()
            page.cookies.set(settings.SESSION_COOKIE_NAME, cookie)
            page_times = timed_gets(page, f"{base}/w/{workspace.id}/desktops/", args.requests)
            api = requests.Session()
            api.headers["Authorization"] = f"Bearer {key}"
            api_times = timed_gets(api, f"{base}/api/desktops", args.requests)

            def change():
                lifecycle.transition(
                    desktop_id=target.id,
                    sources={DesktopState.RUNNING},
                    target=DesktopState.STOPPING,
                    actor=SYSTEM,
                )

            delays = asyncio.run(fan_out(port, f"/events/w/{workspace.id}/", cookie, args.streams, change))
    finally:
        workspace.delete()
        user.delete()

    ms = [t * 1000 for t in page_times]
    print(
        f"{args.desktops} desktops in one workspace; {args.requests} sequential requests each, after warm-up"
    )
    print(summary("desktops page", ms, unit="ms"))
    print(summary("GET /api/desktops", [t * 1000 for t in api_times], unit="ms"))
    print(
        f"  p95 target <= 100 ms: page {percentile(ms, 0.95):.1f} ms, "
        f"API {percentile([t * 1000 for t in api_times], 0.95):.1f} ms"
    )
    d_ms = [d * 1000 for d in delays]
    print(f"{len(delays)}/{args.streams} event streams got the state change:")
    print(summary("  delay", d_ms, unit="ms"))
    print(f"  slowest stream {max(d_ms):.1f} ms (target <= 500 ms); median {statistics.median(d_ms):.1f} ms")
    api_ms = [t * 1000 for t in api_times]
    record(
        Figure(f"desktops page, {args.desktops} desktops, p95", percentile(ms, 0.95), "ms", 100),
        Figure(f"GET /api/desktops, {args.desktops} desktops, p95", percentile(api_ms, 0.95), "ms", 100),
        Figure(
            f"state change on {len(delays)} of {args.streams} event streams, slowest", max(d_ms), "ms", 500
        ),
    )


if __name__ == "__main__":
    main()
