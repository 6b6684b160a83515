"""Files into and out of a desktop through the API: who may, where, how much; on a real LXC desktop."""

import io
import zipfile

import pytest
from asgiref.sync import async_to_sync

from desktops.models import AuditEvent, DesktopState, Role
from tests.conftest import api_key_for, client_for
from tests.factories import DesktopFactory
from tests.support.desktops import provision, run

pytestmark = pytest.mark.django_db(transaction=True)


def body_of(response) -> bytes:
    """A streamed download, read as the web server reads it (the chunks come asynchronously)."""

    async def read():
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(read)()


def put(api, desktop, path: str, body: bytes):
    return api.generic(
        "PUT", f"/api/desktops/{desktop.id}/files?path={path}", body, content_type="application/octet-stream"
    )


@pytest.mark.parametrize(("role", "expected"), [("outsider", 404), (Role.VIEWER, 403)])
def test_only_those_who_may_take_control_move_files(members, workspace, role, expected):
    desktop = DesktopFactory(workspace=workspace, state=DesktopState.RUNNING, private_ip="10.0.0.9")
    api = client_for(key=api_key_for(members[role]))  # the outsider owns another workspace
    assert api.get(f"/api/desktops/{desktop.id}/files?path=notes.txt").status_code == expected
    assert put(api, desktop, "notes.txt", b"hello").status_code == expected
    assert not AuditEvent.objects.filter(action__startswith="desktop.file").exists()


def test_a_stopped_desktop_or_no_path_is_a_clear_refusal(members, workspace):
    desktop = DesktopFactory(workspace=workspace, state=DesktopState.STOPPED)
    api = client_for(key=api_key_for(members[Role.MEMBER]))
    response = api.get(f"/api/desktops/{desktop.id}/files?path=notes.txt")
    assert response.status_code == 409 and "stopped" in response.json()["error"]["message"]
    assert api.get(f"/api/desktops/{desktop.id}/files").status_code == 400


@pytest.mark.lxc
@pytest.mark.worker
def test_files_go_in_and_out_of_the_agents_home_and_nowhere_else(lxc_api, plan):
    desktop = provision(lxc_api, "files-desk")
    text = "Le résumé du projet, déjà prêt.\n".encode()

    # In: folders made as needed, the file the agent's own.
    response = put(lxc_api, desktop, "projet/docs/résumé.txt", text)
    assert response.status_code == 201, response.content
    assert response.json()["path"] == "/home/agent/projet/docs/résumé.txt"
    assert run(desktop, "cat ~/projet/docs/résumé.txt").encode() == text
    assert run(desktop, "stat -c %U ~/projet/docs/résumé.txt").strip() == "agent"

    # Out: the file as it is, a folder as a zip.
    out = lxc_api.get(f"/api/desktops/{desktop.id}/files?path=/home/agent/projet/docs/résumé.txt")
    assert out.status_code == 200 and body_of(out) == text
    assert "attachment" in out["Content-Disposition"]
    folder = lxc_api.get(f"/api/desktops/{desktop.id}/files?path=projet")
    archive = zipfile.ZipFile(io.BytesIO(body_of(folder)))
    assert archive.read("docs/résumé.txt") == text

    # The attacker's paths: climbing out, absolute elsewhere, a link planted by the agent.
    run(desktop, "ln -s /etc ~/etc-link")
    for path in ("../../etc/passwd", "/etc/passwd", "etc-link/passwd", "projet/../../root"):
        response = lxc_api.get(f"/api/desktops/{desktop.id}/files?path={path}")
        assert response.status_code in (400, 404), (path, response.status_code)
        assert b"root:" not in response.content
    assert put(lxc_api, desktop, "etc-link/evil", b"x").status_code == 400
    # Zip slip: a name the agent chose that an extractor reading "\\" as a separator would climb out by.
    run(desktop, r"mkdir -p ~/slip && printf x > ~/slip/'..\..\evil' && printf y > ~/slip/'C:x'")
    names = zipfile.ZipFile(
        io.BytesIO(body_of(lxc_api.get(f"/api/desktops/{desktop.id}/files?path=slip")))
    ).namelist()
    assert sorted(names) == [".._.._evil", "C_x"]
    assert put(lxc_api, desktop, "../../tmp/evil", b"x").status_code == 400
    assert lxc_api.get(f"/api/desktops/{desktop.id}/files?path=absent.txt").status_code == 404

    # Past the plan's size: refused before a byte lands, in and out.
    plan.transfer_max_mib = 1
    plan.save()
    big = put(lxc_api, desktop, "big.bin", b"\0" * (2 * 1024 * 1024))
    assert big.status_code == 413 and "1 MiB" in big.json()["error"]["message"]
    assert run(desktop, "ls -a ~").split().count("big.bin") == 0
    assert not [n for n in run(desktop, "ls -a ~/projet/docs").split() if n.endswith(".partial")]
    run(desktop, "head -c 2000000 /dev/zero > ~/projet/big.bin")
    assert lxc_api.get(f"/api/desktops/{desktop.id}/files?path=projet").status_code == 413

    actions = list(AuditEvent.objects.filter(target=desktop.id).values_list("action", flat=True))
    assert actions.count("desktop.file_upload") == 1 and actions.count("desktop.file_download") == 3
