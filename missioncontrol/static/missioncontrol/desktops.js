// The desktops list, live: one server-sent event stream for the workspace updates each row.
// Its words come from Django's JavaScript catalogue (gettext, ngettext, interpolate), loaded before it.
import { confirmDestroy } from "./destroy_dialog.js";
import { onOpen, reloader, workspaceEvents } from "./events.js";
import { showState } from "./states.js";

const table = document.getElementById("desktops-table");
const workspace = table.dataset.workspace;
const live = document.getElementById("live");
const rows = document.getElementById("desktop-rows");
const TRANSIENT = new Set(["provisioning", "starting", "stopping", "suspending", "resuming", "destroying"]);

// The banner of a desktop just asked for ("… is being provisioned") says what became of it, once it did.
function settleCreations() {
  document.querySelectorAll(".messages li.creating").forEach((note) => {
    const row = rows.querySelector(`tr[data-desktop="${[...note.classList].find((c) => c.startsWith("dsk_"))}"]`);
    const state = row?.querySelector('[data-field="state"]').dataset.state;
    const said = {
      running: gettext("%(name)s is running."),
      error: gettext("%(name)s could not be made: its row says why."),
    }[state];
    if (!said) return;
    note.textContent = interpolate(said, { name: row.dataset.name }, true);
    note.classList.remove("creating");
    note.classList.toggle("error", state === "error");
  });
}

function setText(row, field, text) {
  const el = row.querySelector(`[data-field="${field}"]`);
  if (el) el.textContent = text;
}

// Rows and summary as the server has them now (a new desktop, an agent's outcome), filters kept.
const reloadRows = reloader(
  () => location.href,
  (html) => {
    const fresh = new DOMParser().parseFromString(html, "text/html");
    const checked = new Set([...rows.querySelectorAll('input[name="desktops"]:checked')].map((b) => b.value));
    rows.replaceChildren(...fresh.getElementById("desktop-rows").children);
    rows.querySelectorAll('input[name="desktops"]').forEach((b) => (b.checked = checked.has(b.value)));
    for (const id of ["fleet-summary", "desktop-count"]) {
      document.getElementById(id).replaceWith(fresh.getElementById(id));
    }
    bindSelection();
    settleCreations();
  },
);

// Many events can come at once (a bulk start, a streaming answer): one reload for a burst of them.
let reloadTimer = null;
function reloadSoon() {
  clearTimeout(reloadTimer);
  reloadTimer = setTimeout(reloadRows, 500);
}

function apply(event) {
  const row = rows.querySelector(`tr[data-desktop="${event.desktop_id}"]`);
  if (!row) return reloadRows();
  showState(row.querySelector('[data-field="state"]'), event.state);
  settleCreations();
  setText(row, "progress", TRANSIENT.has(event.state) && event.progress ? `${event.progress}…` : "");
  setText(row, "last_error", event.state === "error" ? event.last_error : "");
  setText(row, "private_ip", event.private_ip || "—");
  setText(row, "uptime", event.state === "running" ? gettext("just now") : "—");
  row.classList.remove("flash");
  void row.offsetWidth; // restart the highlight
  row.classList.add("flash");
  reloadSoon(); // the summary's counts
}

function connect() {
  const stream = workspaceEvents(workspace);
  onOpen(stream, () => {
    live.textContent = gettext("live");
    live.classList.remove("down");
    reloadRows(); // catch up with what changed before the stream was open (a quick step) or while down
  });
  stream.addEventListener("desktop", (message) => apply(JSON.parse(message.data)));
  stream.addEventListener("approval", reloadRows); // a desktop's requests waiting for an answer
  // An agent's turn started or ended: its row's outcome changes (not each streamed piece).
  stream.addEventListener("chat", (message) => {
    const event = JSON.parse(message.data);
    if (event.status !== "running" || event.at === 0) reloadSoon();
  });
  stream.addEventListener("error", () => {
    // EventSource reconnects by itself and resumes from the last event it saw.
    live.textContent = gettext("reconnecting…");
    live.classList.add("down");
  });
}

// Live thumbnails: each running desktop's screen, taken anew every few seconds for the rows in view,
// only while the page is visible (each one is a screenshot the desktop's screen server encodes).
const THUMBNAIL_EVERY = 10000;

function refreshThumbnails() {
  if (document.visibilityState !== "visible") return;
  rows.querySelectorAll("img.thumb").forEach((img) => {
    const box = img.getBoundingClientRect();
    if (box.bottom < 0 || box.top > window.innerHeight || box.width === 0) return;
    img.src = `${img.dataset.thumb}&at=${Date.now()}`;
  });
}

// A screen that cannot be read (its desktop stopping) leaves an empty frame, not a broken image.
rows.addEventListener("error", (e) => e.target.matches?.("img.thumb") && e.target.classList.add("unavailable"), true);
rows.addEventListener("load", (e) => e.target.matches?.("img.thumb") && e.target.classList.remove("unavailable"), true);
setInterval(refreshThumbnails, THUMBNAIL_EVERY);
document.addEventListener("visibilitychange", refreshThumbnails);

// Fleet actions: select many, act once; destroy asks for the names of the desktops it wipes.

function bindSelection() {
  const boxes = [...rows.querySelectorAll('input[name="desktops"]')];
  const count = document.getElementById("selected-count");
  const update = () => {
    const n = boxes.filter((b) => b.checked).length;
    if (count) count.textContent = interpolate(ngettext("%(n)s selected", "%(n)s selected", n), { n }, true);
    document.querySelectorAll("[data-needs-selection]").forEach((b) => (b.disabled = n === 0));
  };
  boxes.forEach((b) => b.addEventListener("change", update));
  const all = document.getElementById("select-all");
  if (all) {
    all.checked = false;
    all.onchange = () => {
      boxes.forEach((b) => (b.checked = all.checked));
      update();
    };
  }
  update();
}

const fleet = document.getElementById("fleet");
let namesTyped = false;
fleet.addEventListener("submit", async (event) => {
  const button = event.submitter;
  if (button?.value !== "destroy" || namesTyped) return;
  event.preventDefault();
  const chosen = [...rows.querySelectorAll('input[name="desktops"]:checked')];
  const typed = await confirmDestroy(chosen.map((box) => ({ name: box.dataset.name, disk: box.dataset.disk })));
  if (typed === null) return;
  // The server checks the names again: nothing is destroyed unless they are the selected desktops'.
  document.getElementById("confirm").value = typed;
  namesTyped = true;
  fleet.requestSubmit(button);
});

bindSelection();
settleCreations(); // one that ran before the page came
connect();
