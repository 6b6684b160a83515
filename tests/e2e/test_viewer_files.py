"""Files and the clipboard in the viewer, in real Chromium, with one real LXC desktop.

Files are dropped on the screen (or chosen with the keyboard's button) and land in the agent's home
with their progress shown; a folder comes out as a zip. Text with accents goes both ways between the
browser and the desktop's clipboard while the person has control, and neither way while watching.
"""

import hashlib
import time
import zipfile

import pytest
from playwright.sync_api import expect

from desktops.models import Role
from tests.conftest import LXC_IMAGE
from tests.e2e.conftest import let_the_network_settle, log_in, screenshot
from tests.factories import MembershipFactory
from tests.support.desktops import copy_in_desktop, desktop_clipboard, provision, run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.e2e,
    pytest.mark.lxc,
    pytest.mark.skipif(not LXC_IMAGE.is_file(), reason="no minimal golden image (make setup builds it)"),
]

MIB = 1024 * 1024


def drop(page, name: str, size: int) -> bytes:
    """Drop a file of `size` bytes on the screen, as the browser does with one dragged from the desktop's
    file manager; returns its content (made on both sides: millions of bytes are slow to hand over)."""
    line = "Le résumé du projet, déjà prêt.\n"
    files = page.evaluate_handle(
        """([name, line, size]) => {
            const bytes = new TextEncoder().encode(line);
            const content = new Uint8Array(size).map((_, i) => bytes[i % bytes.length]);
            const data = new DataTransfer();
            data.items.add(new File([content], name));
            return data;
        }""",
        [name, line, size],
    )
    page.dispatch_event("#screen", "dragover", {"dataTransfer": files})
    page.dispatch_event("#screen", "drop", {"dataTransfer": files})
    encoded = line.encode()
    return (encoded * (size // len(encoded) + 1))[:size]


def until(check, what: str, timeout: float = 10):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def test_files_and_clipboard_in_the_viewer(page, site, lxc_api, workspace, plan):
    plan.transfer_max_mib = 3
    plan.save(update_fields=["transfer_max_mib"])
    desktop = provision(lxc_api, "e2e-files")
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    let_the_network_settle(page)
    log_in(page, site, member.user.email)
    page.goto(f"{site}/desktops/{desktop.id}/")
    expect(page.locator("#screen-status")).to_be_hidden(timeout=30000)
    transfers = page.locator("#transfers li")

    # Watching moves no file: the buttons say to take control first.
    page.click("#files-tab")
    expect(page.locator("#upload-choose")).to_be_disabled()
    expect(page.locator("#upload-choose")).to_have_attribute(
        "title", "Take control to move files in and out of the desktop."
    )
    page.click("#mode-control")
    expect(page.locator("#screen-status")).to_be_hidden(timeout=30000)
    expect(page.locator("#upload-choose")).to_be_enabled()

    # Dropped on the screen, into a folder of the agent's home made for it, shown as it goes.
    page.fill("#upload-folder", "reçus")
    content = drop(page, "résumé.txt", 2 * MIB)
    expect(page.locator("#drop-hint")).to_be_hidden()
    upload = transfers.filter(has_text="résumé.txt")
    expect(upload).to_have_attribute("data-state", "done", timeout=30000)
    expect(upload).to_contain_text("In the desktop: /home/agent/reçus/résumé.txt")
    assert upload.locator("progress").evaluate("bar => bar.value") == 100
    assert run(desktop, "sha256sum ~/reçus/résumé.txt").split()[0] == hashlib.sha256(content).hexdigest()
    screenshot(page, "viewer-files-01-dropped")

    # The keyboard's way: the button opens the browser's file chooser.
    with page.expect_file_chooser() as chooser:
        page.focus("#upload-choose")
        page.keyboard.press("Enter")
    chooser.value.set_files(
        [{"name": "notes.txt", "mimeType": "text/plain", "buffer": "Ça marche.".encode()}]
    )
    expect(transfers.filter(has_text="notes.txt")).to_have_attribute("data-state", "done", timeout=30000)
    assert run(desktop, "cat ~/reçus/notes.txt") == "Ça marche."

    # Past the plan's size: refused in words, by the page when it knows the size, by the API when the
    # plan changed since the page opened; nothing half-written either way.
    drop(page, "trop-gros.bin", 4 * MIB)
    refused = transfers.filter(has_text="trop-gros.bin")
    expect(refused).to_have_attribute("data-state", "error")
    expect(refused).to_contain_text(
        "4.0 MiB is more than this desktop's plan moves at once (3 MiB): nothing was sent."
    )
    plan.transfer_max_mib = 1
    plan.save(update_fields=["transfer_max_mib"])
    drop(page, "limite.bin", 2 * MIB)
    refused = transfers.filter(has_text="limite.bin")
    expect(refused).to_have_attribute("data-state", "error", timeout=30000)
    expect(refused).to_contain_text("(1 MiB). Nothing was written.")
    assert sorted(run(desktop, "ls -A ~/reçus").split()) == ["notes.txt", "résumé.txt"]
    screenshot(page, "viewer-files-02-refused")
    plan.transfer_max_mib = 3
    plan.save(update_fields=["transfer_max_mib"])

    # A folder comes out as a zip, with its progress.
    page.fill("#download-path", "reçus")
    with page.expect_download() as downloading:
        page.click("#download-form button")
    download = downloading.value
    assert download.suggested_filename == "reçus.zip"
    archive = zipfile.ZipFile(download.path())
    assert archive.read("résumé.txt") == content and archive.read("notes.txt") == "Ça marche.".encode()
    saved = transfers.filter(has_text="Download of reçus")
    expect(saved).to_have_attribute("data-state", "done")
    assert saved.locator("progress").evaluate("bar => bar.value") == 100
    # A file comes out as it is.
    page.fill("#download-path", "reçus/notes.txt")
    with page.expect_download() as downloading:
        page.click("#download-form button")
    assert downloading.value.suggested_filename == "notes.txt"
    assert downloading.value.path().read_bytes() == "Ça marche.".encode()
    screenshot(page, "viewer-files-03-downloaded")

    # The clipboard, from the browser to the desktop and back, accents and the euro sign included.
    pasted = "Collé depuis le navigateur : é à ç €"
    page.fill("#clipboard-text", pasted)
    page.click("#clipboard-form button")
    until(
        lambda: desktop_clipboard(desktop) == pasted, "the pasted text never reached the desktop's clipboard"
    )
    # Pastejacking: what the desktop copies shows in the page, and reaches this computer's clipboard
    # only on the person's click, even with the browser letting the page write to it.
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.evaluate("navigator.clipboard.writeText('mine')")
    copied = "Copié dans le bureau : déjà ç €"
    copy_in_desktop(desktop, copied)
    expect(page.locator("#desktop-clipboard")).to_have_value(copied, timeout=10000)
    assert page.evaluate("navigator.clipboard.readText()") == "mine"
    page.click("#desktop-clipboard-copy")
    expect(page.locator("#desktop-clipboard-copy")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == copied
    screenshot(page, "viewer-files-04-clipboard")

    # Watching: nothing crosses either way, and the page says why.
    page.click("#mode-view")
    expect(page.locator("#screen-status")).to_be_hidden(timeout=30000)
    copy_in_desktop(desktop, "copié pendant qu'on regarde")
    page.fill("#clipboard-text", "collé en regardant")
    page.click("#clipboard-form button")
    assert "Take control" in page.locator("#clipboard-text").evaluate("field => field.validationMessage")
    page.wait_for_timeout(1500)
    expect(page.locator("#desktop-clipboard")).to_have_value(copied)
    assert desktop_clipboard(desktop) == "copié pendant qu'on regarde"
    expect(page.locator("#upload-choose")).to_be_disabled()
