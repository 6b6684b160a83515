"""A desktop whose root replaces its own VNC server with a hostile one, against the real web server.

One real LXC desktop for all of it. Its root stops the desktop session and serves RFB on port 5900
itself, three ways: a screen of 65535 x 65535 pixels (16 GiB to zero-fill, were it believed), an update
of thousands of full-height CopyRects (each row once copied the framebuffer's rest), and a tar-pit that
accepts and never greets. Meanwhile its owner asks the real daphne for screenshots, and another tenant
lists their desktops. The web server's peak memory must stay within MEMORY_BOUND of what it was, the
other tenant's p95 under 200 ms, and each screenshot must end in a 503 that says why.
"""

import statistics
import threading
import time

import requests
from django.conf import settings

from billing.models import Subscription
from desktops.models import Role
from desktops.screen import MAX_SCREEN_PIXELS
from tests.conftest import LXC_DESKTOP_TESTS, web_server
from tests.factories import TierFactory, api_key_for
from tests.support.desktops import provision, run
from tests.support.services import peak_memory

pytestmark = LXC_DESKTOP_TESTS

# What one person's screen sessions may cost the web server at most: as many framebuffers of the largest
# screen shown as they may run sessions at once (4 x 32 MiB). The hostile screens here are refused before
# a framebuffer is made (too large), or cut short while drawing one of 16 MiB.
MEMORY_BOUND = settings.LONG_CALLS_PER_PERSON * MAX_SCREEN_PIXELS * 4

# The hostile server, run by the desktop's root with the desktop's own python3.
HOSTILE = r"""
import socket, struct, sys, threading, time

MODE = sys.argv[1]


def serve(conn):
    try:
        if MODE == "tarpit":
            time.sleep(600)
            return
        conn.sendall(b"RFB 003.008\n")
        conn.recv(12)
        conn.sendall(bytes([1, 1]))  # one security type: None
        conn.recv(1)
        conn.sendall(struct.pack(">I", 0))
        conn.recv(1)  # ClientInit
        width, height = (65535, 65535) if MODE == "huge" else (2048, 2048)
        pixel_format = struct.pack(">BBBBHHHBBB3x", 32, 24, 0, 1, 255, 255, 255, 16, 8, 0)
        conn.sendall(struct.pack(">HH", width, height) + pixel_format + struct.pack(">I", 7) + b"hostile")
        if MODE == "storm":
            # 9,000 one-pixel-wide, full-height copies: 16 bytes each to send.
            rect = struct.pack(">HHHHiHH", 1, 0, 1, height, 1, 0, 0)
            conn.sendall(struct.pack(">BxH", 0, 9000) + rect * 9000)
        time.sleep(600)
    except OSError:
        pass
    finally:
        conn.close()


server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", 5900))
server.listen(64)
while True:
    connection, _ = server.accept()
    threading.Thread(target=serve, args=(connection,), daemon=True).start()
"""


def hostile(desktop, mode: str) -> None:
    listening = "import socket; socket.create_connection(('127.0.0.1', 5900), 1).close()"
    run(
        desktop,
        "kill $(cat /root/hostile.pid 2>/dev/null) 2>/dev/null; sleep 0.2; "
        f"setsid python3 /root/hostile-rfb.py {mode} </dev/null >/dev/null 2>&1 & "
        "echo $! >/root/hostile.pid; "
        f'for i in $(seq 50); do python3 -c "{listening}" 2>/dev/null && exit 0; sleep 0.1; done; exit 1',
        user="root",
    )


def attacked(site: str, desktop, owner: dict, other: dict) -> tuple[list, list[float]]:
    """Six screenshots at once by the desktop's owner (an agent hammering its own screen), while the
    other tenant lists their desktops every 50 ms, 40 times at least (a p95 of fewer is their slowest):
    the answers, and the other tenant's timings."""
    shots, timings, done = [], [], threading.Event()

    def other_tenant():
        while not done.is_set() or len(timings) < 40:
            started = time.monotonic()
            answer = requests.get(f"{site}/api/desktops", headers=other, timeout=10)
            timings.append(time.monotonic() - started)
            assert answer.status_code == 200
            time.sleep(0.05)

    def shoot():
        url = f"{site}/api/desktops/{desktop.id}/screenshot"
        shots.append(requests.get(url, headers=owner, timeout=60))

    watcher = threading.Thread(target=other_tenant)
    shooters = [threading.Thread(target=shoot) for _ in range(6)]
    watcher.start()
    try:
        for shooter in shooters:
            shooter.start()
        for shooter in shooters:
            shooter.join()
    finally:
        done.set()
        watcher.join()
    return shots, timings


def test_a_hostile_screen_server_stalls_no_one_and_cannot_bloat_the_web_server(
    lxc_api, members, workspace, driver_dir, tmp_path_factory
):
    Subscription.objects.update_or_create(workspace=workspace, defaults={"tier": TierFactory()})
    desktop = provision(lxc_api, "hostile-screen")
    run(desktop, "systemctl stop bureau-vnc", user="root")
    run(desktop, f"cat > /root/hostile-rfb.py <<'EOF'\n{HOSTILE}\nEOF", user="root")
    owner = {"Authorization": f"Bearer {api_key_for(members[Role.MEMBER])}"}
    other = {"Authorization": f"Bearer {api_key_for(members['outsider'])}"}

    with web_server(driver_dir, tmp_path_factory.getbasetemp()) as site:
        port = int(site.rsplit(":", 1)[1])
        assert requests.get(f"{site}/api/desktops", headers=other, timeout=10).status_code == 200
        before = peak_memory(port)
        for mode, why in (
            ("huge", "65535x65535, larger than Le Bureau shows"),
            ("storm", "stopped answering"),
            ("tarpit", "not answering"),
        ):
            hostile(desktop, mode)
            shots, timings = attacked(site, desktop, owner, other)
            # Past the person's sessions at once, a 429 (a tar-pit holds its four for 15 s); the others
            # end in a 503 that says why.
            statuses = sorted(shot.status_code for shot in shots)
            assert set(statuses) <= {429, 503} and statuses.count(429) <= 2, (mode, statuses)
            if mode == "tarpit":
                assert statuses == [429, 429, 503, 503, 503, 503]
            for shot in shots:
                assert shot.status_code == 429 or why in shot.json()["error"]["message"], (mode, shot.json())
            p95 = statistics.quantiles(timings, n=20)[-1]
            print(f"{mode}: the other tenant's p95 {p95 * 1000:.0f} ms over {len(timings)} calls")
            assert p95 < 0.2, (mode, f"the other tenant's p95 was {p95 * 1000:.0f} ms")
            grown = peak_memory(port) - before
            assert grown < MEMORY_BOUND, (mode, f"the web server's peak grew by {grown >> 20} MiB")
