"""A chat message through the whole control plane to the agent and back, as the page sees it.

    .venv/bin/python bench/chat.py [--turns 20]

Starts its own daphne and Celery worker (`bench/stack.py`), gives the workspace a key to a scripted
OpenAI-compatible model server on the host (no LLM is reachable here; it answers at once), makes
one desktop of the full image (real OpenClaw, its gateway kept warm), then times each
`POST /api/desktops/{id}/chat` to the first streamed piece of the answer and to the complete
answer, both as they arrive on the workspace's server-sent event stream, the one the page reads.
The first message is sent the moment the desktop runs, while OpenClaw is still starting (it
starts as the desktop boots, then warms its agent up with a token-free turn of its own); its time
to the first piece, and when the desktop's warm-up turn was done, are reported on their own.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.events import WorkspaceEvents
from bench.report import Figure, record
from bench.stack import BENCH_LXC, control_plane
from bench.stats import percentile, summary
from desktops import services
from desktops.audit import Actor
from tests.support.scripted_model import ScriptedModelServer, Text
from workers.drivers.lxc import network as lxc_net

MODEL_PORT = 18432
ANSWER = "Here is the answer, at once."


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
        _, out, _ = ssh.exec_command("cat ~/.cache/bureau/agent-warm 2>/dev/null || echo '(not warm)'")
        return out.read().decode().strip()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()
    host = lxc_net.gateway_of(BENCH_LXC["LXC_SUBNET"])
    env = {"LXC_HOST_TCP_PORTS": f"8000,{MODEL_PORT}"}
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
            body = {"name": "chat-bench", "imageProfile": "full"}
            created = http.post(f"{stack.base}/api/desktops", json=body)
            created.raise_for_status()
            desktop_id = created.json()["id"]
            booted = time.perf_counter()
            while (state := http.get(f"{stack.base}/api/desktops/{desktop_id}").json()["state"]) != "running":
                if state == "error":
                    raise RuntimeError("the desktop did not start")
                time.sleep(0.2)
            running = time.perf_counter()
            print(f"desktop running after {running - booted:.1f} s", flush=True)
            stream = WorkspaceEvents(stack.base, stack.workspace.id, stack.user)
            # The operator's first message as soon as the desktop runs: it meets the agent however
            # far its boot has got (the gateway starting, then warming up).
            cold = turn(http, stack.base, desktop_id, stream)
            print(f"first message: first piece {cold[0]:.2f} s, complete {cold[1]:.2f} s", flush=True)
            warmed = warmed_after(desktop_id)
            print(f"the desktop's own warm-up turn done {warmed} s after its boot", flush=True)
            warm = []
            for i in range(args.turns):
                warm.append(turn(http, stack.base, desktop_id, stream))
                first, complete = warm[-1]
                print(f"  turn {i + 1}/{args.turns}: first piece {first:.3f} s, complete {complete:.3f} s")
    print()
    print("POST /api/desktops/{id}/chat -> answer on the page's event stream (full image, real OpenClaw,")
    print("scripted model answering at once)")
    print(f"{'first message, sent at running':<34} first piece {cold[0]:.2f} s, complete {cold[1]:.2f} s")
    print(f"{'warm-up turn done after boot':<34} {warmed} s")
    print(summary("first piece (target <= 2 s)", [f for f, _ in warm]))
    print(summary("complete answer", [c for _, c in warm]))
    record(
        Figure("chat: running -> first streamed piece of the first message", cold[0], "s", 5),
        Figure(
            "chat: message -> first streamed piece, warm, p95", percentile([f for f, _ in warm], 0.95), "s", 2
        ),
    )


if __name__ == "__main__":
    main()
