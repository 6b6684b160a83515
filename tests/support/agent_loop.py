"""An agent at work in a real desktop, for the human-in-the-loop tests: a small agent runtime whose
turns leave processes behind unless stopped, and `bureau approve` run as the agent, in the background."""

import shlex
import threading
import time

from desktops.guest import desktop_ssh_connect
from tests.conftest import SCRIPTED_MODEL_URL
from tests.support.desktops import run

# A small agent runtime: it streams the model's answer, and meanwhile has a tool of its own at work, a
# process it started and one it let go of (forked twice, as a daemon is), which outlive it unless
# stopped with the whole turn.
AGENT = """
import json, os, subprocess, sys, urllib.request
nap = ["python3", "-c", "import time; time.sleep(3600)"]
turn = os.path.basename(os.environ["BUREAU_RUN_DIR"])
subprocess.Popen([*nap, f"turn-tool-{turn}"])
if os.fork() == 0:
    if os.fork() == 0:
        os.execvp("python3", [*nap, f"turn-daemon-{turn}"])
    os._exit(0)
body = {"model": "scripted", "stream": True, "messages": [{"role": "user", "content": sys.argv[1]}]}
request = urllib.request.Request(
    sys.argv[2] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json", "Authorization": "Bearer sk-scripted"},
)
for line in urllib.request.urlopen(request):
    if line.startswith(b"data: {"):
        for choice in json.loads(line[6:])["choices"]:
            print(choice["delta"].get("content") or "", end="", flush=True)
"""


def install_agent(desktop, workspace) -> None:
    """Make the agent above the workspace's agent runtime, talking to the scripted model."""
    run(desktop, f"cat > ~/agent.py <<'EOF'\n{AGENT}\nEOF")
    workspace.agent_command = f"python3 agent.py {{message}} {shlex.quote(SCRIPTED_MODEL_URL)}"
    workspace.save()


def turn_processes(desktop, reply_id: str) -> str:
    """The turn's processes, by their command lines (bracketed: the shell running pgrep is not one)."""
    pattern = f"[a]gent.py Write|[t]urn-(tool|daemon)-{reply_id}"
    return run(desktop, f"pgrep -af {shlex.quote(pattern)} || true")


def wait_for(check, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, what if isinstance(what, str) else what()
        time.sleep(0.2)
    return result


class Asking(threading.Thread):
    """`bureau approve …` run in the desktop as its agent, until it exits."""

    def __init__(self, desktop, arguments: str, stdin: str = ""):
        super().__init__(daemon=True)
        self.desktop, self.command, self.stdin = desktop, f"cd /tmp && bureau approve {arguments}", stdin
        self.status, self.out, self.err = None, "", ""
        self.start()

    def run(self):
        with desktop_ssh_connect(desktop_id=self.desktop.id, host=self.desktop.private_ip) as ssh:
            stdin, out, err = ssh.exec_command(self.command, timeout=120)
            stdin.write(self.stdin)
            stdin.channel.shutdown_write()
            self.out, self.err = out.read().decode(), err.read().decode()
            self.status = out.channel.recv_exit_status()

    def result(self) -> tuple[int, str]:
        self.join(90)
        assert self.status is not None, "bureau approve never returned"
        return self.status, self.out
