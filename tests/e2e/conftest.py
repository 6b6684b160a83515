"""Real headless Chromium (Debian's) driven by Playwright, against the suite's own daphne."""

import os
from pathlib import Path

import pytest

from tests.conftest import web_server
from tests.factories import PASSWORD

# Playwright's sync API keeps an event loop in the test's thread; the ORM calls of these tests are
# still plain synchronous ones, made between browser steps.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# Per module: Playwright's sync API keeps an event loop running in this thread while it is open,
# which the asyncio tests of other modules must not inherit.
@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, request):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    page.on("pageerror", lambda error: console.append(f"pageerror: {error}"))
    yield page
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"{request.node.name}-last.png")
    (ARTIFACTS / f"{request.node.name}-console.log").write_text("\n".join(console))
    context.close()


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"{name}.png")


@pytest.fixture(scope="module")
def site(tmp_path_factory, driver_dir, django_db_setup):
    """The suite's daphne for one test module (a module needing other settings defines its own).

    After the test database is set up, whose name it is given: a module that starts no worker
    would otherwise start it on the development database's.
    """
    with web_server(driver_dir, tmp_path_factory.getbasetemp()) as url:
        yield url


def log_in(page, base_url: str, email: str, password: str = PASSWORD) -> None:
    page.goto(f"{base_url}/accounts/login/")
    page.fill("input[name=login]", email)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/w/*/desktops/")


@pytest.fixture(autouse=True)
def _hashers_the_web_server_knows(settings):
    """Users made here log in through the suite's daphne, which only knows the real hashers."""
    from django.conf import global_settings

    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS


def let_the_network_settle(page) -> None:
    """Chromium drops its requests for a moment whenever the host's interfaces change, and a new
    desktop's veth keeps changing (IPv6 address states) for a second or two after it answers: an
    artefact of the browser running on the desktops' own host, which a remote browser never sees."""
    page.wait_for_timeout(3000)
