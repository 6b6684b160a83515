"""A refused form comes back as it was filled in, what is wrong said right beside the field concerned
(the field marked invalid and pointing at its error for screen readers), whether the form's own checks
or the service behind it refused it."""

import re

import pytest

from desktops.models import DesktopState, Role
from tests.factories import PASSWORD, DesktopFactory, UserFactory


def beside(page: str, field_id: str) -> str:
    """The error shown beside that field, checking the field points at it."""
    widget = re.search(rf"<(?:input|select|textarea)[^>]*\bid=\"{field_id}\"[^>]*>", page)
    assert widget, f"no field {field_id}"
    assert 'aria-invalid="true"' in widget.group(0)
    assert f"{field_id}_error" in re.search(r'aria-describedby="([^"]*)"', widget.group(0)).group(1)
    error = re.search(rf'<ul class="errorlist" id="{field_id}_error"><li>(.*?)</li>', page)
    assert error, f"no error beside {field_id}"
    return error.group(1)


@pytest.fixture
def admin(client, members):
    client.force_login(members[Role.ADMIN].user)
    return members[Role.ADMIN]


def test_new_computer_says_what_is_wrong_with_the_name_beside_it(client, admin, workspace, plan):
    response = client.post(
        f"/w/{workspace.id}/desktops/new/", {"name": "Bad Name", "plan": plan.id, "image_profile": "minimal"}
    )
    page = response.content.decode()
    assert response.status_code == 400 and 'value="Bad Name"' in page
    assert "lowercase" in beside(page, "newcomputerform-name").lower()
    assert 'id="new-computer" open' in page  # the form stays open, as it was sent

    DesktopFactory(workspace=workspace, name="taken", state=DesktopState.RUNNING)
    page = client.post(
        f"/w/{workspace.id}/desktops/new/", {"name": "taken", "plan": plan.id, "image_profile": "nothing"}
    ).content.decode()
    assert "nothing is not one of the available choices" in beside(page, "newcomputerform-image_profile")


def test_settings_forms_say_what_is_wrong_beside_the_field(client, admin, workspace):
    key = client.post(
        f"/w/{workspace.id}/keys/new/", {"name": "ci", "scope": "write", "expires_at": "2020-01-01T10:00"}
    )
    assert key.status_code == 400 and 'value="ci"' in key.content.decode()
    assert "future" in beside(key.content.decode(), "apikeyform-expires_at")

    llm = client.post(
        f"/w/{workspace.id}/llm-keys/new/",
        {"provider": "openai_compatible", "name": "mine", "secret": "sk-long-enough-1234", "model": "m"},
    ).content.decode()
    assert "baseUrl" in beside(llm, "llmkeyform-base_url") and 'value="mine"' in llm
    short = client.post(
        f"/w/{workspace.id}/llm-keys/new/", {"provider": "anthropic", "name": "mine", "secret": "short"}
    ).content.decode()
    assert "too short" in beside(short, "llmkeyform-secret") and "short" not in re.findall(
        r'value="([^"]*)"', short
    )

    price = client.post(
        f"/w/{workspace.id}/model-prices/new/",
        {"model": "gpt-x", "input_per_million": "-1", "output_per_million": "2"},
    ).content.decode()
    assert "greater than or equal to 0" in beside(price, "modelpriceform-input_per_million")
    assert 'value="gpt-x"' in price and 'value="2"' in price


def test_a_schedule_comes_back_on_its_tab_with_what_is_wrong_beside_it(client, members, workspace):
    desktop = DesktopFactory(workspace=workspace, state=DesktopState.RUNNING)
    client.force_login(members[Role.MEMBER].user)
    response = client.post(
        f"/desktops/{desktop.id}/schedules/new/",
        {"cron": "every morning", "timezone": "Europe/Paris", "message": "Le rapport du jour"},
    )
    page = response.content.decode()
    assert response.status_code == 400 and 'data-open-tab="schedules-panel"' in page
    assert "not a cron expression" in beside(page, "scheduleform-cron")
    assert 'value="every morning"' in page and "Le rapport du jour</textarea>" in page
    assert not desktop.schedules.exists()
    # A viewer may not schedule: said on the page (as a toast there), not beside a field.
    client.force_login(members[Role.VIEWER].user)
    refused = client.post(
        f"/desktops/{desktop.id}/schedules/new/",
        {"cron": "0 9 * * *", "timezone": "Europe/Paris", "message": "x"},
        follow=True,
    ).content.decode()
    assert 'class="toast error"' in refused and not desktop.schedules.exists()


FRENCH = {"HTTP_ACCEPT_LANGUAGE": "fr-FR,fr;q=0.9"}


def test_what_is_refused_and_what_is_done_is_said_in_french(client, admin, workspace, plan):
    """Form errors and several banners were English on French pages, from strings never marked."""
    bad = client.post(
        f"/w/{workspace.id}/desktops/new/",
        {"name": "Bad Name", "plan": plan.id, "image_profile": "minimal"},
        **FRENCH,
    ).content.decode()
    assert beside(bad, "newcomputerform-name").startswith("Utilisez 1 à 63 lettres minuscules")
    DesktopFactory(workspace=workspace, name="pris", state=DesktopState.RUNNING)
    taken = client.post(
        f"/w/{workspace.id}/desktops/new/",
        {"name": "pris", "plan": plan.id, "image_profile": "minimal"},
        **FRENCH,
    ).content.decode()
    assert "Un bureau de ce nom existe déjà dans l&#x27;espace de travail." in taken
    key = client.post(
        f"/w/{workspace.id}/keys/new/", {"name": "ci", "scope": "write"}, follow=True, **FRENCH
    ).content.decode()
    assert "Clé d&#x27;API créée : copiez-la maintenant, elle ne sera plus affichée." in key
    stopped = DesktopFactory(workspace=workspace, name="alpha", state=DesktopState.STOPPED)
    acted = client.post(
        f"/w/{workspace.id}/desktops/actions/",
        {"action": "start", "desktops": [stopped.id]},
        follow=True,
        **FRENCH,
    ).content.decode()
    assert "alpha : « Démarrer » demandé." in acted


def test_a_newcomers_workspace_is_named_in_their_language(client, db):
    newcomer = UserFactory(email="camille@example.com")
    client.post("/accounts/login/", {"login": newcomer.email, "password": PASSWORD}, follow=True, **FRENCH)
    assert newcomer.memberships.get().workspace.name == "Espace de travail de camille"
