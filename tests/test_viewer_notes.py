"""What the viewer says of a desktop before anyone tries it: the minimal image has no agent."""

from desktops.models import Role
from tests.factories import DesktopFactory


def test_a_minimal_desktop_says_it_has_no_agent(client, members, workspace):
    minimal = DesktopFactory(workspace=workspace, image_profile="minimal")
    full = DesktopFactory(workspace=workspace, image_profile="full")
    client.force_login(members[Role.MEMBER].user)
    assert "has no agent runtime" in client.get(f"/desktops/{minimal.id}/").content.decode()
    assert "has no agent runtime" not in client.get(f"/desktops/{full.id}/").content.decode()
    page = client.get(f"/w/{workspace.id}/desktops/").content.decode()
    assert "Minimal (fast, no agent: screen and terminal only)" in page  # said when choosing it too
