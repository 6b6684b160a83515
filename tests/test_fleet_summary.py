"""The desktops list as a fleet view: each row's agent outcome, the summary on top, and a page whose
number of queries does not grow with the fleet."""

from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from desktops.models import ChatMessage, DesktopState, Role
from tests.conftest import client_for
from tests.factories import DesktopFactory, api_key_for, history, round_prices

Status = ChatMessage.Status


def turn(desktop, task: str, status: str, answer: str = "") -> ChatMessage:
    asked = ChatMessage.objects.create(desktop=desktop, author="operator", content=task)
    finished = timezone.now() if status in (Status.DONE, Status.ERROR) else None
    return ChatMessage.objects.create(
        desktop=desktop, author="agent", reply_to=asked, status=status, content=answer, completed_at=finished
    )


def fleet_page(client, workspace, query: str = "") -> str:
    return client.get(f"/w/{workspace.id}/desktops/{query}").content.decode()


def test_each_row_shows_the_agents_last_outcome(client, members, workspace, plan):
    working = DesktopFactory(workspace=workspace, name="working", state=DesktopState.RUNNING)
    answered = DesktopFactory(workspace=workspace, name="answered", state=DesktopState.RUNNING)
    failed = DesktopFactory(workspace=workspace, name="failed", state=DesktopState.STOPPED)
    DesktopFactory(workspace=workspace, name="idle", state=DesktopState.SUSPENDED)
    turn(working, "an old task", Status.DONE, "done long ago")
    turn(working, "Compile the report", Status.RUNNING)
    turn(answered, "Count the files", Status.DONE, "42 files")
    turn(failed, "Book the train", Status.ERROR, "No LLM key for OpenAI in this workspace.")

    client.force_login(members[Role.VIEWER].user)
    page = fleet_page(client, workspace)
    row = {d: page[page.index(f'data-desktop="{d.id}"') :][:1500] for d in (working, answered, failed)}
    assert (
        "working" in row[working] and "Compile the report" in row[working] and "old task" not in row[working]
    )
    assert "answered" in row[answered] and "ago" in row[answered]
    # A failed turn stays on the list, with why, on a desktop stopped since.
    assert "failed" in row[failed] and "No LLM key for OpenAI" in row[failed]

    summary = page[page.index('id="fleet-summary"') :][:2000]
    figure = lambda name: summary.split(f'data-figure="{name}">')[1].split("<")[0]  # noqa: E731
    assert figure("running") == "2" and figure("stopped") == "2" and figure("in_error") == "1"
    assert figure("working") == "1" and figure("spent").startswith("€")
    assert "(1 suspended)" in summary

    failing = fleet_page(client, workspace, "?state=failing")
    assert "No LLM key for OpenAI" in failing and "42 files" not in failing and "answered" not in failing


def test_the_fleets_page_and_list_make_as_many_queries_for_thirty_desktops_as_for_one(
    client, members, workspace, plan, settings
):
    # Nothing kept between the two loads: the fleet's spend is measured both times.
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}
    round_prices(plan)  # the API shows each desktop's plan with its price
    client.force_login(members[Role.OWNER].user)
    api = client_for(key=api_key_for(members[Role.OWNER]))
    page = f"/w/{workspace.id}/desktops/"

    def add(n: int) -> None:
        for _ in range(n):
            desktop = DesktopFactory(workspace=workspace, plan=plan, state=DesktopState.RUNNING)
            now = timezone.now()
            history(
                desktop, (now - timedelta(hours=2), DesktopState.PROVISIONING), (now, DesktopState.RUNNING)
            )
            desktop.labels.create(name="ci")
            turn(desktop, "a task", Status.ERROR, "it failed")

    def queries() -> list[int]:
        counts = []
        for reader, url in ((client, page), (api, "/api/desktops")):
            with CaptureQueriesContext(connection) as captured:
                assert reader.get(url).status_code == 200
            counts.append(len(captured))
        return counts

    add(1)
    # First visits write: the page remembers the workspace in the session, the key when it was used;
    # later ones write nothing.
    client.get(page), api.get("/api/desktops")
    one = queries()
    add(29)
    assert queries() == one


def test_an_outsider_sees_nothing_of_the_fleet(client, members, workspace, plan):
    turn(DesktopFactory(workspace=workspace, name="secret-desk"), "Secret plans", Status.ERROR, "why")
    client.force_login(members["outsider"].user)
    response = client.get(f"/w/{workspace.id}/desktops/")
    assert response.status_code == 404 and "Secret plans" not in response.content.decode()


def test_new_computer_keeps_what_was_typed_when_it_is_refused(client, members, workspace, plan):
    DesktopFactory(workspace=workspace, name="taken")
    client.force_login(members[Role.MEMBER].user)
    url = f"/w/{workspace.id}/desktops/new/"
    for name, why in (("Bad Name", "lowercase"), ("taken", "taken"), ("x" * 70, "at most 63")):
        response = client.post(url, {"name": name, "plan": plan.id, "image_profile": "minimal"})
        page = response.content.decode()
        assert response.status_code == 400 and why in page
        assert f'value="{name}"' in page and '<details class="card" id="new-computer" open>' in page
    assert not workspace.desktops.exclude(name="taken").exists()
