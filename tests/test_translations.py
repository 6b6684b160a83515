"""French first: the pages' scripts and the fleet's and viewer's pages have no message left untranslated
in the French catalogue, and the pages answer in the browser's language."""

import re
from pathlib import Path

import pytest

from desktops.models import Role

LOCALE = Path(__file__).resolve().parent.parent / "locale" / "fr" / "LC_MESSAGES"
# The pages held to it entry by entry (the others are on their way).
FULLY_FRENCH = (
    "templates/missioncontrol/desktop.html",
    "templates/missioncontrol/desktop_rows.html",
    "templates/missioncontrol/desktops.html",
    "templates/missioncontrol/fleet_summary.html",
    "templates/missioncontrol/watchers.html",
    "templates/missioncontrol/landing.html",
    "desktops/agent_failures.py",
    "missioncontrol/static/missioncontrol/",
)


def entries(catalogue: str):
    """(where it is used, msgid, whether it has a French translation) of each entry but the header."""
    for block in (LOCALE / catalogue).read_text().split("\n\n"):
        where = " ".join(line[3:] for line in block.splitlines() if line.startswith("#: "))
        msgid = "".join(re.findall(r'^(?:msgid )?"(.*)"$', block.split("msgstr")[0], re.M))
        translations = re.findall(r'^msgstr(?:\[\d\])? "(.*)"((?:\n".*")*)', block, re.M)
        if msgid and "#, fuzzy" not in block:
            yield where, msgid, all(first or rest for first, rest in translations)


@pytest.mark.parametrize("catalogue", ["django.po", "djangojs.po"])
def test_no_message_of_the_french_pages_is_left_untranslated(catalogue):
    untranslated = [
        msgid
        for where, msgid, done in entries(catalogue)
        if not done and any(p in where for p in FULLY_FRENCH)
    ]
    assert untranslated == []


def test_the_scripts_speak_the_browsers_language(client, members):
    client.force_login(members[Role.VIEWER].user)
    assert "Connexion au terminal" in client.get("/jsi18n/", HTTP_ACCEPT_LANGUAGE="fr").content.decode()
    assert "Connexion au terminal" not in client.get("/jsi18n/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
