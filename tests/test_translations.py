"""French first: every message of the code is in the French catalogues, each with a checked French
translation, and the pages answer in the browser's language."""

import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import NamedTuple

import pytest
from django import forms
from django.template.base import Lexer, TokenType
from django.utils.functional import Promise

from desktops import services
from desktops.audit import SYSTEM, Actor
from desktops.lifecycle import transition
from desktops.models import DesktopState, Role
from missioncontrol import forms as page_forms
from tests.factories import DesktopFactory

ROOT = Path(__file__).resolve().parent.parent
LOCALE = Path("locale") / "fr" / "LC_MESSAGES"
CATALOGUES = ("django.po", "djangojs.po")
FIELD = re.compile(r'^(msgctxt|msgid|msgid_plural|msgstr(?:\[\d+\])?) "(.*)"$')
# What a copy of the tree to gather the messages from leaves out: installed, built or generated things.
NOT_SOURCE = {".git", ".venv", "node_modules", "staticfiles", "var", "test-artifacts", "image-build/cache"}
NOT_SOURCE |= {"image-build/out", "missioncontrol/static/vendor", ".pytest_cache", ".ruff_cache"}


class Entry(NamedTuple):
    key: tuple[str, str, str]  # msgctxt, msgid, msgid_plural: what the code asks for
    translations: list[str]
    fuzzy: bool

    @property
    def msgid(self) -> str:
        return self.key[1]


def entries(catalogue: Path) -> list[Entry]:
    """Each entry but the header, as gettext writes them: blocks apart, strings split over lines."""
    found = []
    for block in catalogue.read_text().split("\n\n"):
        flags, fields, field = [], {}, ""
        for line in block.splitlines():
            if line.startswith("#,"):
                flags += [flag.strip() for flag in line[2:].split(",")]
            elif match := FIELD.match(line):
                field = match[1]
                fields[field] = match[2]
            elif line.startswith('"') and field:
                fields[field] += line[1:-1]
        if fields.get("msgid"):
            key = (fields.get("msgctxt", ""), fields["msgid"], fields.get("msgid_plural", ""))
            translations = [text for name, text in fields.items() if name.startswith("msgstr")]
            found.append(Entry(key, translations, "fuzzy" in flags))
    return found


@pytest.mark.parametrize("catalogue", CATALOGUES)
def test_every_message_has_a_checked_french_translation(catalogue):
    catalogued = entries(ROOT / LOCALE / catalogue)
    assert catalogued
    untranslated = [e.msgid for e in catalogued if not e.translations or not all(e.translations)]
    fuzzy = [e.msgid for e in catalogued if e.fuzzy]
    assert (untranslated, fuzzy) == ([], []), (
        f"{catalogue}: no French for {untranslated}; "
        f"French marked fuzzy (check it, then drop the flag) for {fuzzy}"
    )


def _not_source(directory: str, names: list[str]) -> set[str]:
    here = Path(directory).relative_to(ROOT)
    return {n for n in names if n == "__pycache__" or (here / n).as_posix() in NOT_SOURCE}


def test_the_catalogues_hold_every_message_of_the_code_and_no_other(tmp_path):
    # `make messages` on a copy of the tree: what the catalogues would be, with the code as it is.
    copy = tmp_path / "tree"
    shutil.copytree(ROOT, copy, ignore=_not_source, symlinks=True)
    (copy / ".venv").symlink_to(sys.prefix)
    gathered = subprocess.run(["make", "-s", "messages"], cwd=copy, capture_output=True, text=True)
    assert gathered.returncode == 0, gathered.stderr
    for catalogue in CATALOGUES:
        in_code = {e.key: e.msgid for e in entries(copy / LOCALE / catalogue)}
        catalogued = {e.key: e.msgid for e in entries(ROOT / LOCALE / catalogue)}
        missing = [msgid for key, msgid in in_code.items() if key not in catalogued]
        gone = [msgid for key, msgid in catalogued.items() if key not in in_code]
        assert (missing, gone) == ([], []), (
            f"{catalogue} is behind the code (run `make messages`, then translate): it lacks {missing} "
            f"and holds {gone}, which the code no longer has"
        )


def test_the_scripts_speak_the_browsers_language(client, members):
    client.force_login(members[Role.VIEWER].user)
    assert "Connexion au terminal" in client.get("/jsi18n/", HTTP_ACCEPT_LANGUAGE="fr").content.decode()
    assert "Connexion au terminal" not in client.get("/jsi18n/", HTTP_ACCEPT_LANGUAGE="en").content.decode()


TEMPLATES = ROOT / "templates"
# Words a template writes that are no prose, so stay as they are in every language: names and acronyms.
NOT_PROSE = re.compile(r"\b(Le Bureau|Mission Control|API|IP|CSV)\b")
WORDS = re.compile(r"[^\W\d_]{2,}")
ENTITY = re.compile(r"&#?\w+;")
VERBATIM = re.compile(r"(<(code|pre|script|style)\b[^>]*>).*?(</\2>)", re.S)  # its content is code, not prose
ATTRIBUTE = re.compile(r"""\b(placeholder|aria-label|title|alt)=(["'])(.*?)\2""", re.S)
TAG = re.compile(r"<[^>]*>")
LITERAL_DEFAULT = re.compile(r"""\bdefault:(["'])(.*?)\1""")
HOLE = "\0"  # where a template tag or variable stood


def _prose(text: str) -> list[str]:
    pieces = (piece.strip() for piece in re.split(rf"[{HOLE}\n]", ENTITY.sub(" ", text)))
    return [piece for piece in pieces if WORDS.search(NOT_PROSE.sub("", piece))]


def _untranslated(source: str) -> list[str]:
    """The literal words a template writes out: its text outside blocktranslate and comment blocks, what tag
    attributes a person reads hold as plain words, and words given as a filter's default."""
    text, found, closing = [], [], None
    for token in Lexer(source).tokenize():
        if closing:
            closing = None if token.token_type == TokenType.BLOCK and token.contents == closing else closing
        elif token.token_type == TokenType.TEXT:
            text.append(token.contents)
        else:
            tag = (token.contents.split() or [""])[0]
            if token.token_type == TokenType.BLOCK and tag in {"blocktranslate", "blocktrans", "comment"}:
                closing = "end" + tag
            found += [m[0] for m in LITERAL_DEFAULT.finditer(token.contents) if WORDS.search(m[2])]
            text.append(HOLE)
    html = VERBATIM.sub(rf"\1{HOLE}\3", "".join(text))
    for _, _, value in ATTRIBUTE.findall(html):
        found += _prose(value)
    return found + _prose(TAG.sub(HOLE, html))


def test_the_templates_write_no_word_outside_translation():
    untranslated = {
        path.relative_to(ROOT).as_posix(): words
        for path in sorted(TEMPLATES.rglob("*.html"))
        if (words := _untranslated(path.read_text()))
    }
    assert untranslated == {}, f"words a person reads, not marked for translation, in {untranslated}"


def test_the_forms_of_the_pages_name_their_fields_in_the_readers_language():
    plain = []
    for form in vars(page_forms).values():
        if isinstance(form, type) and issubclass(form, forms.Form):
            for name, field in form.base_fields.items():
                # A label each (read aloud for a bare field too), and help texts and placeholders where given.
                read = [field.label] + [
                    t for t in (field.help_text, field.widget.attrs.get("placeholder")) if t
                ]
                plain += [
                    f"{form.__name__}.{name}: {text!r}" for text in read if not isinstance(text, Promise)
                ]
    assert plain == [], f"form texts a person reads, not marked for translation: {plain}"


# Words of English sentences that no French sentence holds.
ENGLISH = re.compile(
    r"\b(the|and|is|are|with|your|this|not|from|you|has|have|was|will|when|what|which|there|their|been|into"
    r"|only|than|of|to|for|yet)\b",
    re.I,
)


class _Read(HTMLParser):
    """What a person reads on a page: its text, and the attributes shown or read aloud; not code."""

    CODE = {"script", "style", "code", "pre"}

    def __init__(self):
        super().__init__()
        self.read, self.code = [], 0

    def handle_starttag(self, tag, attrs):
        self.code += tag in self.CODE
        self.read += [
            value for name, value in attrs if name in ("placeholder", "title", "aria-label", "alt") and value
        ]

    def handle_endtag(self, tag):
        self.code -= tag in self.CODE

    def handle_data(self, data):
        if not self.code and data.strip():
            self.read.append(" ".join(data.split()))


def test_a_french_page_holds_no_english_sentence_whatever_wrote_it(client, members, workspace, plan):
    """The catalogue tests see only what is marked: a service's or a view's sentence never marked reached
    French pages in English. Here the pages are read as rendered, with what the services put on them."""
    owner = members[Role.OWNER]
    running = DesktopFactory(
        workspace=workspace, state=DesktopState.RUNNING, name="bureau", image_profile="full"
    )
    stopped = DesktopFactory(workspace=workspace, state=DesktopState.STOPPED, name="arret")
    gone = DesktopFactory(workspace=workspace, state=DesktopState.STOPPED, name="fini")
    transition(desktop_id=gone.id, sources={"stopped"}, target="destroying", actor=Actor(user=owner.user))
    transition(desktop_id=gone.id, sources={"destroying"}, target="destroyed", actor=SYSTEM)
    services.chat_send(actor=Actor(user=owner.user), desktop=running, message="Range le bureau")
    services.api_key_create(actor=Actor(user=owner.user), workspace_id=workspace.id, name="ci", scope="write")
    client.force_login(owner.user)
    french = {"HTTP_ACCEPT_LANGUAGE": "fr-FR,fr;q=0.9"}
    # Pages as they come back after an act or a refusal, with their banners.
    shown = {
        "rename": client.post(
            f"/w/{workspace.id}/settings/rename/", {"name": "atelier"}, follow=True, **french
        ),
        "fleet": client.post(
            f"/w/{workspace.id}/desktops/actions/",
            {"action": "stop", "desktops": [running.id, stopped.id]},
            follow=True,
            **french,
        ),
        "taken": client.post(
            f"/w/{workspace.id}/desktops/new/",
            {"name": "arret", "plan": plan.id, "image_profile": "minimal"},
            **french,
        ),
    }
    for url in (
        f"/desktops/{running.id}/",
        f"/desktops/{stopped.id}/",
        f"/desktops/{gone.id}/",
        f"/w/{workspace.id}/settings/",
        f"/w/{workspace.id}/costs/",
        f"/w/{workspace.id}/approvals/",
        f"/w/{workspace.id}/alerts/",
        f"/w/{workspace.id}/audit/",
        f"/api/desktops/{running.id}/chat",
        "/pricing/",
    ):
        shown[url] = client.get(url, **french)
    english = {}
    for name, response in shown.items():
        assert response.status_code in (200, 400), (name, response.status_code)
        if response["Content-Type"].startswith("application/json"):
            read = [
                m.get("failure", {}).get("message", "")
                for m in response.json()["results"]
                if m.get("failure")
            ]
        else:
            parser = _Read()
            parser.feed(response.content.decode())
            read = parser.read
        if found := [line for line in read if ENGLISH.search(line)]:
            english[name] = found
    assert english == {}, f"English on French pages: {english}"


def test_money_reads_one_way_on_a_page_in_each_language(client, members, workspace, plan):
    """French pages wrote "€0,42" in their figures and "0,42 €" in their sentences."""
    DesktopFactory(workspace=workspace, state=DesktopState.RUNNING)
    client.force_login(members[Role.OWNER].user)
    for url in (f"/w/{workspace.id}/desktops/", f"/w/{workspace.id}/costs/", "/pricing/"):
        french = client.get(url, HTTP_ACCEPT_LANGUAGE="fr").content.decode()
        assert re.search(r"\d,\d\d\u00a0€", french) and not re.search(r"€\s?\d", french), url
        english = client.get(url, HTTP_ACCEPT_LANGUAGE="en").content.decode()
        assert re.search(r"€\d+\.\d\d", english) and not re.search(r"\d\s?€", english), url


def test_the_api_docs_page_has_a_way_back_in_the_readers_language(client, members):
    """It was bare English Swagger, with no way back to Mission Control."""
    client.force_login(members[Role.VIEWER].user)
    page = client.get("/api/docs/", HTTP_ACCEPT_LANGUAGE="fr").content.decode()
    assert '<a href="/">← Retour à Mission Control</a>' in page
    assert 'id="swagger-ui"' in page


# What French typography leaves alone: code and addresses (a header, a JSON field, a URL, a time).
NOT_PROSE_PUNCTUATION = re.compile(
    r"`[^`]*`|https?://\S+|\w+://|%\(\w+\)[sd]|\{\w+\}|\d+:\d+|\ball: true\b|X-LeBureau-Signature: sha256="
)


@pytest.mark.parametrize("catalogue", CATALOGUES)
def test_the_french_has_a_space_before_its_double_punctuation(catalogue):
    """French writes "Réglages : …" and "Vraiment ?", where English glues the sign to the word."""
    glued = [
        text
        for entry in entries(ROOT / LOCALE / catalogue)
        for text in entry.translations
        if re.search(r"[^\s«][:;?!](\s|$)", NOT_PROSE_PUNCTUATION.sub(" ", text))
    ]
    assert glued == []
