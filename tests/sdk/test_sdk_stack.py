"""The SDK, the CLI and the MCP server against the real stack: daphne serving the API, the suite's Celery
workers doing the lifecycle on the directory test driver (no desktop is needed to make, label, stop and
destroy a fleet), and, for commands, OpenSSH on loopback standing in for a desktop's shell (the web
server dials it as the desktop's address and SSH port). Chat answers need a real desktop's agent: they
are in test_lxc_sdk.py.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lebureau_sdk import (
    AsyncClient,
    Client,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    UnavailableError,
)
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from billing.models import Subscription
from desktops.guest import control_plane_public_key
from desktops.models import AuditEvent, Desktop, Role, Schedule, ScheduleRun
from lebureau.celery import app as celery_app
from tests.conftest import web_server
from tests.factories import DesktopFactory, TierFactory, api_key_for
from tests.support.services import sshd

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]
LEBUREAU = str(Path(sys.executable).with_name("lebureau"))


@pytest.fixture(scope="module")
def site(celery_worker, driver_dir, tmp_path_factory):
    """The web server, whose desktops' shell is an sshd on loopback (root, the control plane's key)."""
    with sshd(tmp_path_factory.mktemp("sshd"), control_plane_public_key()) as port:
        extra = {"DESKTOP_SSH_PORT": str(port), "DESKTOP_SSH_USER": "root"}
        with web_server(driver_dir, tmp_path_factory.getbasetemp(), **extra) as url:
            yield url


@pytest.fixture
def key(members, plan, workspace):
    Subscription.objects.update_or_create(workspace=workspace, defaults={"tier": TierFactory()})  # room
    return api_key_for(members[Role.MEMBER])


@pytest.fixture
def viewer_key(members):
    return api_key_for(members[Role.VIEWER])


@pytest.fixture
def shell_desktop(workspace, plan):
    """A running desktop whose shell is the loopback sshd."""
    return DesktopFactory(workspace=workspace, plan=plan, name="shell", private_ip="127.0.0.1")


def test_the_sdk_makes_labels_stops_and_destroys_a_fleet(site, key, workspace):
    seen = []
    with Client(site, key) as client:
        one = client.desktops.create("sdk-one", image_profile="minimal", wait=True, on_progress=seen.append)
        assert one.state == "running" and seen[-1].state == "running"
        assert seen[0].state == "provisioning"

        fleet = client.desktops.bulk_create(
            name_prefix="ci", count=3, labels=["ci"], image_profile="minimal", wait=True
        )
        assert [d.name for d in fleet] == ["ci-1", "ci-2", "ci-3"] and {d.state for d in fleet} == {"running"}

        # All or none: two more would pass the tier's four desktops, so none is made.
        Subscription.objects.filter(workspace=workspace).update(tier=TierFactory(max_desktops=5))
        with pytest.raises(QuotaExceededError) as refused:
            client.desktops.bulk_create(name_prefix="ci", count=2)
        assert refused.value.code == "quota_exceeded" and "none made" in refused.value.message
        assert len(list(client.desktops.list())) == 4

        assert {d.id for d in client.desktops.list(labels=["ci"])} == {d.id for d in fleet}
        stopped = client.desktops.bulk("stop", labels=["ci"])
        assert (stopped.done, stopped.refused) == (3, 0)
        assert {client.desktops.wait(d.id).state for d in fleet} == {"stopped"}
        with pytest.raises(ConflictError):
            client.desktops.stop(fleet[0].id)
        assert client.desktops.start(fleet[0].id, wait=True).state == "running"
        assert client.desktops.label(one.id, add=["keep"]).labels == ["keep"]
        assert [(c.name, c.desktops) for c in client.workspaces.labels(workspace.id)] == [
            ("ci", 3),
            ("keep", 1),
        ]
        assert client.desktops.destroy(one.id, wait=True).state == "destroyed"
        events = [e.to_state for e in client.desktops.events(one.id)]
        assert events == ["provisioning", "running", "destroying", "destroyed"]


async def test_the_async_client_has_the_same_methods_and_typed_errors(site, key, viewer_key):
    async with AsyncClient(site, key) as client:
        desktop = await client.desktops.create("async-one", image_profile="minimal", wait=True)
        assert desktop.state == "running"
        assert [d.name async for d in client.desktops.list(name="async-one")] == ["async-one"]
        with pytest.raises(NotFoundError):
            await client.desktops.get("dsk_doesnotexist0000")
    async with AsyncClient(site, viewer_key) as viewer:
        with pytest.raises(PermissionDeniedError):
            await viewer.desktops.stop(desktop.id)


def test_commands_run_in_the_desktops_shell_bounded_and_audited(site, key, shell_desktop):
    with Client(site, key) as client:
        ran = client.desktops.exec(shell_desktop.id, "echo héllo; echo oops >&2; exit 3")
        assert (ran.exit_code, ran.stdout, ran.stderr, ran.timed_out) == (3, "héllo\n", "oops\n", False)
        quoted = client.desktops.exec(shell_desktop.id, argv=["printf", "%s|", "a b", "$HOME"], stdin=None)
        assert quoted.stdout == "a b|$HOME|"
        assert client.desktops.exec(shell_desktop.id, "cat", stdin="from stdin").stdout == "from stdin"
        big = client.desktops.exec(shell_desktop.id, "head -c 3000000 /dev/zero | tr '\\0' x")
        assert big.stdout_truncated and big.stdout == "x" * 2**20 and big.exit_code == 0
        started = time.monotonic()
        slow = client.desktops.exec(shell_desktop.id, "sleep 30", timeout=1)
        assert slow.timed_out and slow.exit_code == 124 and time.monotonic() - started < 15
    audited = AuditEvent.objects.filter(action="desktop.exec", target=shell_desktop.id).order_by("at")
    assert [e.detail["program"] for e in audited][:2] == ["echo", "printf"]
    assert all("héllo" not in json.dumps(e.detail) for e in audited)


def test_503_is_retried_with_backoff_then_raised(site, key, workspace, plan):
    """A desktop whose shell refuses connections (nothing listens at its address): every try is a 503,
    tried again, each audited: three tries for two retries."""
    down = DesktopFactory(workspace=workspace, plan=plan, name="down", private_ip="127.0.0.2")
    with Client(site, key, max_retries=2) as client, pytest.raises(UnavailableError) as failed:
        client.desktops.exec(down.id, "true")
    assert failed.value.status == 503
    assert AuditEvent.objects.filter(action="desktop.exec", target=down.id).count() == 3


def cli(*args: str, env: dict[str, str], input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [LEBUREAU, *args], env=env, capture_output=True, text=True, timeout=120, input=input, check=False
    )


@pytest.fixture
def cli_env(tmp_path):
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}


def test_login_over_plain_http_to_another_host_asks_first_and_sends_nothing_unless_told(cli_env, tmp_path):
    refused = cli("login", "--url", "http://lebureau.example:8000", "--key", "lb_x", env=cli_env, input="\n")
    assert refused.returncode == 1
    assert "plain http to another machine" in " ".join(refused.stderr.split())
    assert not (tmp_path / "config").exists()


def test_the_cli_logs_in_then_drives_desktops_commands_and_schedules(
    site, key, cli_env, shell_desktop, tmp_path
):
    # A config file left readable by all (by hand, or by an older CLI) does not keep its mode.
    saved = tmp_path / "config" / "lebureau" / "config.json"
    saved.parent.mkdir(parents=True)
    saved.write_text("{}")
    saved.chmod(0o644)
    login = cli("login", "--url", site, "--key", key, env=cli_env)
    assert login.returncode == 0, login.stderr
    assert saved.stat().st_mode & 0o777 == 0o600 and json.loads(saved.read_text())["api_key"] == key

    made = cli("desktops", "create", "cli-a", "--image", "minimal", "--label", "ci", "--json", env=cli_env)
    assert made.returncode == 0, made.stderr
    [desktop] = json.loads(made.stdout)
    assert (desktop["name"], desktop["state"], desktop["labels"]) == ("cli-a", "running", ["ci"])
    listed = cli("desktops", "ls", "--label", "ci", "--json", env=cli_env)
    assert [d["name"] for d in json.loads(listed.stdout)] == ["cli-a"]
    human = cli("desktops", "ls", env=cli_env)
    assert "cli-a" in human.stdout and "running" in human.stdout
    stopped = cli("desktops", "stop", "cli-a", "--json", env=cli_env)
    assert json.loads(stopped.stdout)["desktops"][0]["state"] == "stopped"
    again = cli("desktops", "stop", "cli-a", env=cli_env)
    assert again.returncode == 1 and "Cannot stop a desktop that is stopped" in again.stderr

    printed = cli("exec", "shell", "--", "printf", "%s", "a b", env=cli_env)
    assert (printed.returncode, printed.stdout) == (0, "a b")
    assert cli("exec", "shell", "--", "exit 7", env=cli_env).returncode == 7

    added = cli("schedules", "add", "shell", "*/5 * * * *", "Rapport du jour", "--json", env=cli_env)
    schedule = json.loads(added.stdout)
    assert schedule["cron"] == "*/5 * * * *" and schedule["nextRunAt"]
    # The control plane was down for an hour: beat's next claim runs the schedule once.
    Schedule.objects.filter(id=schedule["id"]).update(
        next_run_at=Desktop.objects.get(name="shell").created_at
    )
    celery_app.send_task("workers.tasks.schedules_run")
    deadline = time.monotonic() + 30
    while not ScheduleRun.objects.filter(schedule_id=schedule["id"], status="sent").exists():
        assert time.monotonic() < deadline, list(ScheduleRun.objects.values("status", "error"))
        time.sleep(0.2)
    runs = json.loads(cli("schedules", "ls", "shell", "--json", env=cli_env).stdout)
    assert runs[0]["lastRun"]["status"] == "sent" and runs[0]["lastRun"]["replyId"]
    assert ScheduleRun.objects.filter(schedule_id=schedule["id"]).count() == 1
    assert cli("schedules", "rm", schedule["id"], env=cli_env).returncode == 0

    removed = cli("desktops", "rm", "cli-a", "--yes", "--json", env=cli_env)
    assert json.loads(removed.stdout)["desktops"][0]["state"] == "destroyed"
    assert cli("desktops", "ls", env={**cli_env, "XDG_CONFIG_HOME": str(tmp_path / "none")}).returncode == 2


async def test_an_mcp_client_drives_desktops_through_lebureau_mcp(site, key, viewer_key, shell_desktop):
    env = {"LEBUREAU_URL": site, "LEBUREAU_API_KEY": key, "XDG_CONFIG_HOME": "/nonexistent"}
    server = StdioServerParameters(command=LEBUREAU, args=["mcp", "--desktop", "shell"], env=env)
    async with stdio_client(server) as streams, ClientSession(*streams) as session:
        await session.initialize()
        tools = {tool.name for tool in (await session.list_tools()).tools}
        assert {"list_desktops", "create_desktop", "stop_desktop", "send_message", "run_command"} <= tools

        ran = await session.call_tool("run_command", {"command": "echo from-mcp; exit 2"})
        assert not ran.is_error and ran.structured_content["exit_code"] == 2
        assert ran.structured_content["stdout"] == "from-mcp\n"

        made = await session.call_tool("create_desktop", {"name": "mcp-made", "image_profile": "minimal"})
        assert made.structured_content["state"] == "running"
        listed = await session.call_tool("list_desktops", {"state": "running"})
        assert {"shell", "mcp-made"} <= {d["name"] for d in listed.structured_content["result"]}
        stopped = await session.call_tool("stop_desktop", {"desktop": "mcp-made"})
        assert stopped.structured_content["state"] == "stopped"
        refused = await session.call_tool("stop_desktop", {"desktop": "mcp-made"})
        assert refused.is_error and "Cannot stop a desktop that is stopped" in refused.content[0].text
        gone = await session.call_tool("destroy_desktop", {"desktop": "mcp-made"})
        assert gone.structured_content["state"] == "destroyed"

    viewer_env = {**env, "LEBUREAU_API_KEY": viewer_key}
    server = StdioServerParameters(command=LEBUREAU, args=["mcp", "--desktop", "shell"], env=viewer_env)
    async with stdio_client(server) as streams, ClientSession(*streams) as session:
        await session.initialize()
        refused = await session.call_tool("run_command", {"command": "id"})
        assert refused.is_error and "permission_denied" in refused.content[0].text
