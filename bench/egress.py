"""Egress policies through the whole control plane: a change -> enforced in a running desktop; DNS answers.

    .venv/bin/python bench/egress.py [--changes 20] [--queries 200]

Starts its own daphne and Celery worker (`bench/stack.py`) and the suite's stand-in for the internet
with its DNS server (`tests/support/internet.py`: nothing leaves this host), makes one desktop through
the API, then alternates its workspace's policy between deny-all and open with
`PUT /api/workspaces/{id}/egress`. A probe inside the desktop opens a new TCP connection to a stand-in
host every 20 ms and notes, on the clock the host shares with it, the first that went the new way: the
time from the API call to that moment is the figure. Then times DNS answers of the desktop's own
resolver, as the desktop sees them. Destroys everything it made.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import Figure, record
from bench.stack import BENCH_LXC, control_plane
from bench.stats import percentile, summary
from tests.support.internet import ALLOWED, BLOCKED, UPSTREAM, stand_in_internet, upstream_dns

# Waits for the first new connection that goes the wanted way ("open": it connects; "closed": it does
# not), and prints the host's monotonic clock then.
PROBE = """
import socket, sys, time
want_open = sys.argv[1] == "open"
while True:
    try:
        socket.create_connection((sys.argv[2], 80), 0.1).close()
        went_open = True
    except OSError:
        went_open = False
    if went_open == want_open:
        print(time.monotonic(), flush=True)
        break
    time.sleep(0.02)
"""
# Times N look-ups of a name through the desktop's resolver (its resolv.conf), each checked against
# the name's address, in seconds, as JSON.
LOOKUPS = """
import json, socket, sys, time
times = []
for _ in range(int(sys.argv[2])):
    start = time.perf_counter()
    answer = socket.getaddrinfo(sys.argv[1], 80, socket.AF_INET)[0][4][0]
    times.append(time.perf_counter() - start)
    assert answer == sys.argv[3], answer
print(json.dumps(times))
"""


def inside(key: str, *command: str, stdin: str = "", timeout: float = 60) -> str:
    """Run a command in the desktop from the host (lxc-attach), as its agent would."""
    result = subprocess.run(
        ["lxc-attach", "-n", key, "-P", BENCH_LXC["LXC_PATH"], "--", *command],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory() as tmp,
        upstream_dns(Path(tmp)),
        stand_in_internet(Path(tmp)),
        control_plane("egress", concurrency=2, env={"LXC_UPSTREAM_DNS": UPSTREAM}) as stack,
    ):
        api = requests.Session()
        api.headers["Authorization"] = f"Bearer {stack.key}"
        egress = f"{stack.base}/api/workspaces/{stack.workspace.id}/egress"
        api.put(egress, json={"mode": "deny"}).raise_for_status()
        made = api.post(f"{stack.base}/api/desktops", json={"name": "fenced", "imageProfile": "minimal"})
        assert made.status_code == 201, made.text
        url = f"{stack.base}/api/desktops/{made.json()['id']}"
        deadline = time.monotonic() + 180
        while (desktop := api.get(url).json())["state"] != "running":
            assert desktop["state"] != "error" and time.monotonic() < deadline, desktop
            time.sleep(0.2)
        key = desktop["id"]

        enforced = []
        for i in range(args.changes):
            mode, way = ("open", "open") if i % 2 == 0 else ("deny", "closed")
            attach = ["lxc-attach", "-n", key, "-P", BENCH_LXC["LXC_PATH"], "--"]
            probe = subprocess.Popen(
                [*attach, "python3", "-c", PROBE, way, BLOCKED], stdout=subprocess.PIPE, text=True
            )
            time.sleep(0.3)  # the probe is running, and still sees the former policy
            start = time.monotonic()
            api.put(egress, json={"mode": mode}).raise_for_status()
            at = float(probe.communicate(timeout=60)[0])
            enforced.append(at - start)
            print(f"  {mode:>4}: enforced after {enforced[-1]:.3f} s", flush=True)

        api.put(egress, json={"mode": "allowlist", "entries": ["allowed.test"]}).raise_for_status()
        time.sleep(2)
        answers = json.loads(
            inside(key, "python3", "-c", LOOKUPS, "allowed.test", str(args.queries), ALLOWED)
        )

        print()
        print("policy change (PUT /api/workspaces/{id}/egress) -> enforced in the running desktop")
        print(summary("deny <-> open", enforced))
        print("DNS look-up through the desktop's resolver (allowed name, forwarded upstream)")
        print(summary("allowed.test", [a * 1000 for a in answers], unit="ms"))
        record(
            Figure(
                "Egress policy change -> enforced in a running desktop, p95",
                percentile(enforced, 0.95),
                "s",
                2.0,
            ),
            Figure("DNS answer through the desktop's resolver, p50", percentile(answers, 0.5) * 1000, "ms"),
        )


if __name__ == "__main__":
    main()
