"""A real desktop's agent through the SDK, the CLI and the MCP server: an LXC desktop from the minimal
image, whose workspace's agent command answers in four lines over two seconds, so that the answer
streams. And a schedule that finds the desktop stopped: it starts it, sends the message, and stops it
once the agent has answered. Run under the LXC lock (flock /tmp/lebureau-lxc.lock)."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from lebureau_sdk import Client
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from desktops.models import Desktop, Role, Schedule, ScheduleRun
from lebureau.celery import app as celery_app
from tests.conftest import LXC_DESKTOP_TESTS, ROOT, web_server
from tests.factories import api_key_for
from tests.support.desktops import provision, wait_for_state

pytestmark = LXC_DESKTOP_TESTS
LEBUREAU = str(Path(sys.executable).with_name("lebureau"))
# Four lines, half a second apart: the answer grows while the SDK polls it.
STREAMING_AGENT = "bash -c 'for i in 1 2 3 4; do echo \"$1 $i\"; sleep 0.5; done' agent {message}"
# Leaves its task, as a report, in ~/out: the pipeline's artefacts.
REPORTING_AGENT = (
    'sh -c \'mkdir -p ~/out && printf "%s\\n" "$1" > ~/out/report.md && echo report written\' agent {message}'
)


@pytest.fixture
def real_desktop(lxc_api, workspace):
    workspace.agent_command = STREAMING_AGENT
    workspace.save(update_fields=["agent_command"])
    return provision(lxc_api, "streamer")


@pytest.fixture
def site(real_desktop, driver_dir, tmp_path_factory):
    with web_server(driver_dir, tmp_path_factory.getbasetemp()) as url:
        yield url


@pytest.fixture
def key(members):
    return api_key_for(members[Role.MEMBER])


def test_an_answer_streams_to_the_sdk_and_the_cli(site, key, real_desktop, tmp_path):
    with Client(site, key) as client:
        pieces = list(client.chat.stream(real_desktop.id, "bonjour", interval=0.2))
        assert pieces[-1].message.status == "done"
        assert "".join(p.text for p in pieces).strip() == "\n".join(f"bonjour {i}" for i in range(1, 5))
        assert len([p for p in pieces if p.text]) >= 2, "the answer came in one piece: it did not stream"
        assert client.desktops.exec(real_desktop.id, "whoami").stdout == "agent\n"

    env = {"PATH": "/usr/bin:/bin", "LEBUREAU_URL": site, "LEBUREAU_API_KEY": key, "HOME": str(tmp_path)}
    followed = subprocess.run(
        [LEBUREAU, "chat", "streamer", "salut", "--follow"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.split() == ["salut", "1", "salut", "2", "salut", "3", "salut", "4"]


async def test_an_mcp_client_gives_the_desktops_agent_a_task(site, key, real_desktop):
    env = {"LEBUREAU_URL": site, "LEBUREAU_API_KEY": key, "XDG_CONFIG_HOME": "/nonexistent"}
    server = StdioServerParameters(command=LEBUREAU, args=["mcp", "--desktop", "streamer"], env=env)
    async with stdio_client(server) as streams, ClientSession(*streams) as session:
        await session.initialize()
        answered = await session.call_tool("send_message", {"message": "tâche"})
        assert answered.structured_content["status"] == "done"
        assert answered.structured_content["answer"].splitlines() == [f"tâche {i}" for i in range(1, 5)]
        ran = await session.call_tool("run_command", {"command": "hostname"})
        assert ran.structured_content["stdout"] == "streamer\n"


def test_a_schedule_starts_the_stopped_desktop_sends_and_stops_it_after_the_answer(site, key, real_desktop):
    with Client(site, key) as client:
        assert client.desktops.stop(real_desktop.id, wait=True).state == "stopped"
        schedule = client.schedules.create(real_desktop.id, "0 6 * * *", "rapport", stop_after=True)
    # Due now (as if beat had been down since 6:00); beat's task, run by the suite's worker, claims it.
    Schedule.objects.filter(id=schedule.id).update(next_run_at=real_desktop.created_at)
    celery_app.send_task("workers.tasks.schedules_run")
    deadline = time.monotonic() + 120
    while (
        run := ScheduleRun.objects.filter(schedule_id=schedule.id).first()
    ) is None or run.status != "done":
        assert time.monotonic() < deadline, run and (run.status, run.error)
        time.sleep(0.5)
    assert run.reply.content.splitlines() == [f"rapport {i}" for i in range(1, 5)]
    assert wait_for_state(real_desktop.id, "stopped", "error", timeout=60).state == "stopped"
    states = list(Desktop.objects.get(id=real_desktop.id).events.values_list("to_state", flat=True))
    assert states[-5:] == ["stopped", "starting", "running", "stopping", "stopped"]


def test_the_pipeline_example_runs_a_task_and_brings_back_its_artefacts(
    lxc_api, workspace, key, driver_dir, tmp_path_factory, tmp_path
):
    """examples/ci/pipeline.sh as a CI runner would run it, on a real desktop made through the CLI."""
    workspace.agent_command = REPORTING_AGENT
    workspace.save(update_fields=["agent_command"])
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LEBUREAU_API_KEY": key,
        "IMAGE": "minimal",
        "DESKTOP_NAME": "pipeline",
        "TASK": "Écris le rapport",
        "ARTEFACTS_DIR": str(tmp_path / "artefacts"),
    }
    with web_server(driver_dir, tmp_path_factory.getbasetemp(), COMPUTE_DRIVER="lxc") as url:
        ran = subprocess.run(
            [str(ROOT / "examples/ci/pipeline.sh")],
            env={**env, "LEBUREAU_URL": url},
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert ran.returncode == 0, ran.stderr
    assert "report written" in ran.stdout
    assert (tmp_path / "artefacts" / "report.md").read_text() == "Écris le rapport\n"
    assert Desktop.objects.get(name="pipeline").state in ("destroying", "destroyed")
