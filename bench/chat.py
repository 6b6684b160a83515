"""A chat message through the whole control plane to the agent and back, as the page sees it.

    .venv/bin/python bench/chat.py [--turns 20]

Starts its own daphne and Celery worker (`bench/stack.py`), gives the workspace a key to a scripted
OpenAI-compatible model server on the host (no LLM is reachable here; it answers at once), and
times each `POST /api/desktops/{id}/chat` to the first streamed piece of the answer and to the
complete answer, both as they arrive on the workspace's server-sent event stream, the one the page
reads. Desktops are of the full image (real OpenClaw, its gateway kept warm):
  - the first, as a deployment makes it: the engine's warm pool of one (what beat's periodic work
    boots) is filled and its agent warmed first, then the create takes it; its first message is sent
    the moment it runs, then `--turns` more;
  - then one booted on demand (the pool is empty by then, as after a burst of creates): its first
    message, sent the moment it runs while OpenClaw is still starting and warming up, for reference.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.events import WorkspaceEvents
from bench.report import Figure, record
from bench.stack import BENCH_LXC, bench_engine, control_plane
from bench.stats import percentile, summary
from desktops import services
from desktops.audit import Actor
from tests.support.scripted_model import ScriptedModelServer, Text
from workers.drivers.lxc import network as lxc_net

MODEL_PORT = 18432
ANSWER = "Here is the answer, at once."
# One member of the bench workspace's plan (starter) on the full image.
WARM_POOL = "full:1:2048:10=1"
# Where the desktop's own warm-up turn records how long after boot it was done.
AGENT_WARM = "/home/agent/.cache/bureau/agent-warm"


def turn(http: requests.Session, base: str, desktop_id: str, stream: WorkspaceEvents) -> tuple[float, float]:
    start = time.perf_counter()
    response = http.post(f"{base}/api/desktops/{desktop_id}/chat", json={"message": "Réponds vite"})
    response.raise_for_status()
    message_id = response.json()["id"]
    deadline = start + 600
    while message_id not in stream.done:
        if time.perf_counter() > deadline:
            raise RuntimeError(f"no answer to {message_id}")
        time.sleep(0.005)
    conversation = http.get(f"{base}/api/desktops/{desktop_id}/chat", params={"pageSize": 200}).json()
    answer = conversation["results"][-1]
    if answer["status"] != "done" or answer["content"] != ANSWER:
        raise RuntimeError(f"unexpected answer: {answer}")
    first = stream.first.get(message_id, stream.done[message_id])
    return first - start, stream.done[message_id] - start


def warmed_after(desktop_id: str) -> str:
    """How long the desktop's own warm-up of its agent took from boot, as it recorded it."""
    from desktops.guest import desktop_ssh_connect
    from desktops.models import Desktop

    desktop = Desktop.objects.get(id=desktop_id)
    with desktop_ssh_connect(desktop_id=desktop.id, host=desktop.private_ip) as ssh:
        _, out, _ = ssh.exec_command(f"cat {AGENT_WARM} 2>/dev/null || echo '(not warm)'")
        return out.read().decode().strip()


def fill_warm_pool(timeout: float = 300) -> float:
    """Run the engine's periodic work on the bench's worker, as beat does, and wait until the pool's
    member has its agent warm; the seconds that took."""
    from workers.tasks import engine_maintenance

    start = time.perf_counter()
    engine_maintenance.delay()
    driver = bench_engine()
    while time.perf_counter() - start < timeout:
        for meta in driver.store.all():
            rootfs = driver.store.dir(meta["key"]) / "rootfs"
            if meta.get("pool") and (rootfs / AGENT_WARM.lstrip("/")).exists():
                return time.perf_counter() - start
        time.sleep(0.5)
    raise RuntimeError("the warm pool was not filled in time")


def running_desktop(http: requests.Session, base: str, name: str) -> tuple[str, float]:
    """Create a desktop of the full image; its id once it runs, and how long that took."""
    created = http.post(f"{base}/api/desktops", json={"name": name, "imageProfile": "full"})
    created.raise_for_status()
    desktop_id = created.json()["id"]
    start = time.perf_counter()
    while (state := http.get(f"{base}/api/desktops/{desktop_id}").json()["state"]) != "running":
        if state == "error":
            raise RuntimeError("the desktop did not start")
        time.sleep(0.05)
    return desktop_id, time.perf_counter() - start


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()
    host = lxc_net.gateway_of(BENCH_LXC["LXC_SUBNET"])
    env = {"LXC_HOST_TCP_PORTS": f"8000,{MODEL_PORT}", "LXC_WARM_POOL": WARM_POOL}
    with control_plane("chat", concurrency=2, env=env) as stack:
        lxc_net.ensure_bridge(BENCH_LXC["LXC_BRIDGE"], BENCH_LXC["LXC_SUBNET"])
        with ScriptedModelServer(host, MODEL_PORT) as model:
            model.model.fallback = Text(ANSWER)
            services.llm_key_save(
                actor=Actor(user=stack.user),
                workspace_id=stack.workspace.id,
                provider="openai_compatible",
                name="scripted",
                base_url=model.base_url,
                model="scripted",
                secret="sk-bench-scripted-model",  # noqa: S106 (the scripted server takes any)
            )
            http = requests.Session()
            http.headers["Authorization"] = f"Bearer {stack.key}"
            stream = WorkspaceEvents(stack.base, stack.workspace.id, stack.user)
            filled = fill_warm_pool()
            print(f"warm pool filled, its agent warm, after {filled:.1f} s", flush=True)
            desktop_id, took = running_desktop(http, stack.base, "chat-bench")
            print(f"desktop (from the warm pool) running after {took:.2f} s", flush=True)
            pooled = turn(http, stack.base, desktop_id, stream)
            print(f"first message: first piece {pooled[0]:.2f} s, complete {pooled[1]:.2f} s", flush=True)
            warm = []
            for i in range(args.turns):
                warm.append(turn(http, stack.base, desktop_id, stream))
                first, complete = warm[-1]
                print(f"  turn {i + 1}/{args.turns}: first piece {first:.3f} s, complete {complete:.3f} s")
            # The pool is empty now: the next desktop boots on demand, its agent with it.
            cold_id, cold_took = running_desktop(http, stack.base, "chat-bench-cold")
            print(f"desktop (booted on demand) running after {cold_took:.2f} s", flush=True)
            cold = turn(http, stack.base, cold_id, stream)
            print(f"first message: first piece {cold[0]:.2f} s, complete {cold[1]:.2f} s", flush=True)
            warmed = warmed_after(cold_id)
            print(f"its own warm-up turn done {warmed} s after its boot", flush=True)
    print()
    print("POST /api/desktops/{id}/chat -> answer on the page's event stream (full image, real OpenClaw,")
    print("scripted model answering at once)")
    print(f"{'create -> running, from the warm pool':<42} {took:.2f} s")
    for label, (first, complete) in (("warm pool", pooled), ("booted on demand", cold)):
        print(f"{'first message at running, ' + label:<42} first piece {first:.2f} s, done {complete:.2f} s")
    print(f"{'  its warm-up turn done after boot':<42} {warmed} s")
    print(summary("first piece (target <= 2 s)", [f for f, _ in warm]))
    print(summary("complete answer", [c for _, c in warm]))
    record(
        Figure("chat: running -> first streamed piece of the first message", pooled[0], "s", 5),
        Figure(
            "chat: message -> first streamed piece, warm, p95", percentile([f for f, _ in warm], 0.95), "s", 2
        ),
        Figure("chat: create -> running, from the warm pool", took, "s"),
        Figure("chat: first message on a desktop booted on demand (pool empty), first piece", cold[0], "s"),
    )


if __name__ == "__main__":
    main()
