"""The screen as an API, through the whole control plane, on a real LXC desktop.

    .venv/bin/python bench/screen.py [--shots 40] [--rounds 20]

Starts its own daphne and Celery worker (`bench/stack.py`), makes one desktop of the minimal image,
then times `GET /api/desktops/{id}/screenshot` (PNG, and JPEG for reference) with the desktop's
screen at 1280x800 and at 1920x1080 (resized with xrandr in its session), and how long an action
batch takes to show: from `POST …/actions` (a click in the terminal and a key typed into it) to the
end of the first screenshot that differs from the one before the batch. The batch answering with its
own screenshot (`screenshot: true`, taken once the screen has settled) is reported for reference.
"""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import requests
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import Figure, record
from bench.stack import control_plane
from bench.stats import percentile, summary
from desktops.guest import desktop_ssh_connect
from desktops.models import Desktop

SIZES = ((1280, 800), (1920, 1080))
SCREENSHOT_P50_TARGET = 0.150
VISIBLE_P50_TARGET = 0.300


def resize(desktop_id: str, width: int, height: int) -> None:
    desktop = Desktop.objects.get(id=desktop_id)
    with desktop_ssh_connect(desktop_id=desktop.id, host=desktop.private_ip) as ssh:
        _, out, err = ssh.exec_command(f"DISPLAY=:0 xrandr -s {width}x{height}")
        if out.channel.recv_exit_status() != 0:
            raise RuntimeError(f"xrandr: {err.read().decode()}")


def blank(png: bytes) -> bool:
    colours = Image.open(io.BytesIO(png)).getcolors(maxcolors=1 << 24)
    return len(colours) < 2


def shoot(http: requests.Session, url: str, **params) -> tuple[float, bytes]:
    start = time.perf_counter()
    response = http.get(url, params=params)
    response.raise_for_status()
    return time.perf_counter() - start, response.content


def screenshots(http, base, desktop_id, shots) -> list[Figure]:
    url = f"{base}/api/desktops/{desktop_id}/screenshot"
    figures = []
    for width, height in SIZES:
        resize(desktop_id, width, height)
        screen = http.get(f"{base}/api/desktops/{desktop_id}/screen").json()
        if (screen["width"], screen["height"]) != (width, height):
            raise RuntimeError(f"the screen is {screen['width']}x{screen['height']}, not {width}x{height}")
        for kind in ("png", "jpeg"):
            shoot(http, url, format=kind)  # the first one warms the route up
            times = [shoot(http, url, format=kind)[0] for _ in range(shots)]
            print(summary(f"screenshot {kind} {width}x{height}", times), flush=True)
            target = SCREENSHOT_P50_TARGET if kind == "png" else None
            figures += [
                Figure(
                    f"screen: screenshot {kind} {width}x{height} p50", percentile(times, 0.5), "s", target
                ),
                Figure(f"screen: screenshot {kind} {width}x{height} p95", percentile(times, 0.95), "s"),
            ]
    resize(desktop_id, *SIZES[0])
    return figures


def action_to_visible(http, base, desktop_id, rounds) -> list[Figure]:
    shot_url = f"{base}/api/desktops/{desktop_id}/screenshot"
    act_url = f"{base}/api/desktops/{desktop_id}/actions"
    # The session's terminal (image-build/guest/terminal) is at 40,40.
    click = {"type": "click", "x": 300, "y": 200}
    http.post(act_url, json={"actions": [click, {"type": "key", "keys": "ctrl+u"}]}).raise_for_status()
    visible, answered = [], []
    for round_ in range(rounds):
        if round_ % 40 == 0:  # keep the typed line short
            http.post(act_url, json={"actions": [{"type": "key", "keys": "ctrl+u"}]}).raise_for_status()
            time.sleep(0.3)
        _, before = shoot(http, shot_url)
        batch = {"actions": [click, {"type": "type", "text": "x"}]}
        start = time.perf_counter()
        http.post(act_url, json=batch).raise_for_status()
        while True:
            _, after = shoot(http, shot_url)
            if after != before:
                break
            if time.perf_counter() - start > 5:
                raise RuntimeError("the typed key did not show within 5 s")
        visible.append(time.perf_counter() - start)
        start = time.perf_counter()
        response = http.post(act_url, json={**batch, "screenshot": True})
        response.raise_for_status()
        answered.append(time.perf_counter() - start)
    http.post(act_url, json={"actions": [{"type": "key", "keys": "ctrl+u"}]}).raise_for_status()
    print(summary("action -> visible", visible), flush=True)
    print(summary("action + settled screenshot", answered), flush=True)
    return [
        Figure(
            "screen: action batch -> next screenshot showing it, p50",
            percentile(visible, 0.5),
            "s",
            VISIBLE_P50_TARGET,
        ),
        Figure("screen: action batch answered with its screenshot, p50", percentile(answered, 0.5), "s"),
    ]


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shots", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with control_plane("screen", concurrency=2) as stack:
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {stack.key}"
        created = http.post(
            f"{stack.base}/api/desktops", json={"name": "screen-bench", "imageProfile": "minimal"}
        )
        created.raise_for_status()
        desktop_id = created.json()["id"]
        deadline = time.monotonic() + 180
        while http.get(f"{stack.base}/api/desktops/{desktop_id}").json()["state"] != "running":
            if time.monotonic() > deadline:
                raise RuntimeError("the desktop did not start")
            time.sleep(0.2)
        # The session's terminal maps a moment after the VNC server answers.
        while blank(shoot(http, f"{stack.base}/api/desktops/{desktop_id}/screenshot")[1]):
            if time.monotonic() > deadline:
                raise RuntimeError("the desktop's screen stayed blank")
            time.sleep(0.5)
        figures = screenshots(http, stack.base, desktop_id, args.shots)
        figures += action_to_visible(http, stack.base, desktop_id, args.rounds)
    for figure in figures:
        verdict = "" if figure.passed is None else ("  pass" if figure.passed else "  FAIL")
        target = f" (target ≤ {figure.target * 1000:.0f} ms)" if figure.target else ""
        print(f"{figure.name:<62} {figure.value * 1000:7.1f} ms{target}{verdict}")
    record(*figures)


if __name__ == "__main__":
    main()
