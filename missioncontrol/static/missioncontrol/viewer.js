// The desktop viewer: live screen (noVNC), terminal (xterm.js), view / control toggle.
// Its words come from Django's JavaScript catalogue (gettext, interpolate), loaded before it.
// Each relay opens with its own single-use ticket, minted by the API for this browser session and
// sent as a WebSocket subprotocol (never in the URL).
import RFB from "../vendor/novnc/core/rfb.js";
import { Terminal } from "../vendor/xterm/xterm.mjs";
import { FitAddon } from "../vendor/xterm/addon-fit.mjs";
import { confirmDestroy } from "./destroy_dialog.js";
import { onOpen, reloader, workspaceEvents } from "./events.js";
import { showState, stateLabel } from "./states.js";

const root = document.getElementById("viewer");
const desktopId = root.dataset.desktop;
const canControl = root.dataset.canControl === "true";
const csrf = document.querySelector("[name=csrfmiddlewaretoken]").value;
const wsBase = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}`;
const ACK_EVERY = 32 * 1024; // the terminal relay pauses when too much output is unacknowledged

// Watching first: taking control (and with it the desktop's files and keys) is an explicit act.
let mode = "view";
let rfb = null;
let terminalSocket = null;
const FIRST_RETRY = 500; // a blip is usually over by then; longer outages back off to 15 s
let retryDelay = FIRST_RETRY;
let retryTimer = null;

const screenStatus = document.getElementById("screen-status");
const terminalStatus = document.getElementById("terminal-status");
const stateBadge = document.getElementById("state");

function show(el, text) {
  el.textContent = text;
  el.hidden = !text;
}

async function api(path, options = {}) {
  const response = await fetch(`/api/desktops/${desktopId}${path}`, {
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRFToken": csrf },
    ...options,
  });
  const body = response.status === 204 ? {} : await response.json();
  if (!response.ok) throw new Error(body.error ? body.error.message : `HTTP ${response.status}`);
  return body;
}

async function desktopState() {
  const desktop = await api("");
  applyState(desktop.state);
  return desktop.state;
}

// What the page offers follows the desktop's state: the lifecycle actions that apply, and sending,
// taking control and pasting only while it runs (disabled with the reason otherwise).
const notRunning = document.getElementById("not-running");
const lifecycle = document.getElementById("lifecycle");
const controlButton = document.getElementById("mode-control");
const controlTitle = controlButton.title;
const needRunning = () => [
  controlButton,
  ...document.querySelectorAll("#clipboard-form button, #clipboard-form input, #chat-form button, #chat-form textarea"),
];

function applyState(state) {
  showState(stateBadge, state);
  const running = state === "running";
  notRunning.hidden = running;
  notRunning.textContent = ["suspending", "suspended"].includes(state)
    ? gettext("The desktop is suspended: resume it to send messages, take control or paste.")
    : gettext("The desktop is not running: start it to send messages, take control or paste.");
  for (const el of needRunning()) {
    el.disabled = !running || (el === controlButton && !canControl);
    if (el.tagName === "BUTTON") el.title = running ? (el === controlButton ? controlTitle : "") : notRunning.textContent;
  }
  lifecycle?.querySelectorAll("[data-action]").forEach((button) => {
    button.hidden = !button.dataset.when.split(" ").includes(state);
    button.disabled = false;
  });
  applyFiles();
}

lifecycle?.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-action]");
  if (!button) return;
  const action = button.dataset.action;
  if (action === "destroy" && (await confirmDestroy([{ name: root.dataset.name, disk: lifecycle.dataset.disk }])) === null) {
    return;
  }
  button.disabled = true;
  try {
    await api(action === "destroy" ? "" : `/${action}`, { method: action === "destroy" ? "DELETE" : "POST" });
  } catch (error) {
    button.disabled = false;
    return alert(error.message);
  }
  if (action === "destroy") location.assign(lifecycle.dataset.listUrl);
  else connect(); // follows the desktop through its transition
});

// The screen

const ticketProtocol = (ticket) => `lebureau.ticket.${ticket}`;

function connectScreen(session) {
  const screen = new RFB(document.getElementById("screen"), `${wsBase}${session.vncUrl}`, {
    shared: true,
    wsProtocols: ["binary", ticketProtocol(session.vncTicket)],
  });
  rfb = screen;
  screen.viewOnly = mode === "view";
  screen.scaleViewport = true;
  screen.background = "#111";
  screen.addEventListener("connect", () => {
    retryDelay = FIRST_RETRY;
    show(screenStatus, "");
    screen.focus();
  });
  screen.addEventListener("clipboard", (event) => copiedInTheDesktop(event.detail.text));
  screen.addEventListener("disconnect", () => {
    if (rfb !== screen) return; // replaced on purpose (mode switch, reconnect)
    rfb = null;
    scheduleReconnect(gettext("The screen connection was lost."));
  });
}

// The terminal

const term = new Terminal({ cursorBlink: true, fontSize: 13, scrollback: 5000 });
const fit = new FitAddon();
term.loadAddon(fit);
term.open(document.getElementById("terminal"));
fit.fit();
window.addEventListener("resize", () => fit.fit());

let drawnSinceAck = 0;
term.onData((data) => send({ type: "input", data }));
term.onResize(({ cols, rows }) => send({ type: "resize", cols, rows }));

function send(message) {
  if (terminalSocket && terminalSocket.readyState === WebSocket.OPEN) terminalSocket.send(JSON.stringify(message));
}

function connectTerminal(session) {
  const url = `${wsBase}${session.terminalUrl}?cols=${term.cols}&rows=${term.rows}`;
  const socket = new WebSocket(url, ["lebureau.relay", ticketProtocol(session.terminalTicket)]);
  socket.binaryType = "arraybuffer";
  terminalSocket = socket;
  term.options.disableStdin = mode === "view";
  // Every terminal of the desktop is one shared session: watching shows it, only control types in it.
  document.getElementById("terminal-view-only").hidden = mode !== "view";
  socket.onopen = () => show(terminalStatus, "");
  socket.onmessage = (event) => {
    const chunk = new Uint8Array(event.data);
    // Acknowledge only once xterm.js has drawn the bytes: that is the page keeping up.
    term.write(chunk, () => {
      drawnSinceAck += chunk.length;
      if (drawnSinceAck >= ACK_EVERY) {
        send({ type: "ack", bytes: drawnSinceAck });
        drawnSinceAck = 0;
      }
    });
  };
  socket.onclose = (event) => {
    if (terminalSocket !== socket) return;
    terminalSocket = null;
    show(terminalStatus, event.reason || gettext("The terminal connection was lost."));
    if (event.code !== 4403 && event.code !== 4401) scheduleReconnect(event.reason);
  };
}

// Connecting, and reconnecting after a blip

function disconnectAll() {
  const screen = rfb;
  rfb = null;
  if (screen) screen.disconnect();
  if (terminalSocket) {
    const socket = terminalSocket;
    terminalSocket = null;
    socket.close();
  }
}

async function connect() {
  clearTimeout(retryTimer);
  disconnectAll();
  let state;
  try {
    state = await desktopState();
  } catch (error) {
    return scheduleReconnect(
      interpolate(gettext("Mission Control is not reachable (%(why)s)."), { why: error.message }, true),
    );
  }
  if (state !== "running") {
    const message = interpolate(
      gettext("The desktop is %(state)s. The screen and terminal come back when it runs again."),
      { state: stateLabel(state) },
      true,
    );
    show(screenStatus, message);
    show(terminalStatus, message);
    retryTimer = setTimeout(connect, 5000);
    return;
  }
  show(screenStatus, gettext("Connecting to the screen…"));
  show(terminalStatus, gettext("Connecting to the terminal…"));
  try {
    const session = await api("/sessions", { method: "POST", body: JSON.stringify({ mode }) });
    connectScreen(session);
    connectTerminal(session);
  } catch (error) {
    show(screenStatus, error.message);
    show(terminalStatus, error.message);
  }
}

function scheduleReconnect(reason) {
  clearTimeout(retryTimer);
  const again = interpolate(gettext("Reconnecting in %(seconds)s s…"), { seconds: Math.round(retryDelay / 1000) }, true);
  show(screenStatus, `${reason || gettext("Disconnected.")} ${again}`);
  retryTimer = setTimeout(connect, retryDelay);
  retryDelay = Math.min(retryDelay * 2, 15000);
}

// Controls

function setMode(next) {
  mode = next;
  document.getElementById("mode-view").setAttribute("aria-pressed", String(mode === "view"));
  document.getElementById("mode-control").setAttribute("aria-pressed", String(mode === "control"));
  applyFiles();
  connect(); // a new token for the new mode: the relays enforce it, not this page
}
document.getElementById("mode-view").addEventListener("click", () => setMode("view"));
document.getElementById("mode-control").addEventListener("click", () => canControl && setMode("control"));
document.getElementById("fullscreen").addEventListener("click", () => document.getElementById("screen").requestFullscreen());
// The clipboard, in control only (the relay drops a watcher's, and the desktop sends a watcher none).
// noVNC and the desktop's TigerVNC both speak the extended clipboard, whose text is UTF-8.
const clipboardField = document.getElementById("clipboard-text");
clipboardField.addEventListener("input", () => clipboardField.setCustomValidity(""));
document.getElementById("clipboard-form").addEventListener("submit", (event) => {
  event.preventDefault();
  if (mode !== "control") {
    clipboardField.setCustomValidity(gettext("Take control to paste into the desktop."));
    clipboardField.reportValidity();
    return;
  }
  if (!rfb) return; // reconnecting: the text stays in the field for another try
  rfb.clipboardPasteFrom(clipboardField.value);
  clipboardField.value = "";
});

// What the desktop copies reaches this computer's clipboard only when the person asks, having read it:
// a compromised desktop could otherwise plant a command for them to paste into a local terminal.
const desktopClipboard = document.getElementById("desktop-clipboard");
const clipboardNote = document.getElementById("clipboard-note");
const clipboardCopy = document.getElementById("desktop-clipboard-copy");

function copiedInTheDesktop(text) {
  if (!desktopClipboard) return;
  desktopClipboard.value = text;
  clipboardCopy.disabled = !text;
  clipboardCopy.textContent = clipboardCopy.dataset.label;
  show(clipboardNote, gettext("Copied in the desktop: read it, then put it in your clipboard with the button."));
}
clipboardCopy?.addEventListener("click", async () => {
  try {
    await navigator.clipboard.writeText(desktopClipboard.value);
    clipboardCopy.textContent = clipboardCopy.dataset.copied;
  } catch {
    show(clipboardNote, gettext("Your browser keeps its clipboard from this page: copy the text from the field."));
  }
});

// Files: into the agent's home (or a folder of it) by dropping them on the screen or choosing them,
// out as a file or a folder's zip; each transfer with its progress. The API does the checking.

const MIB = 1024 * 1024;
const transfers = document.getElementById("transfers");
const dropHint = document.getElementById("drop-hint");
const filesUrl = (path) => `/api/desktops/${desktopId}/files?path=${encodeURIComponent(path)}`;

// Why files cannot move now, or "" when they can.
function filesBlocked() {
  if (!canControl) return document.getElementById("mode-control").title;
  if (stateBadge.dataset.state !== "running") return notRunning.textContent;
  if (mode !== "control") return gettext("Take control to move files in and out of the desktop.");
  return "";
}

function applyFiles() {
  const why = filesBlocked();
  document.querySelectorAll("#upload-form button, #download-form button").forEach((button) => {
    button.disabled = Boolean(why);
    button.title = why;
  });
}

function errorOf(status, body) {
  try {
    return JSON.parse(body).error.message;
  } catch {
    return interpolate(gettext("Mission Control answered with an error (HTTP %(status)s)."), { status }, true);
  }
}

// One transfer's line in the panel: its name, a progress bar and where it stands.
function transfer(label) {
  const item = document.createElement("li");
  const name = document.createElement("span");
  const bar = document.createElement("progress");
  const status = document.createElement("span");
  name.textContent = label;
  bar.max = 100;
  bar.value = 0;
  bar.setAttribute("aria-label", label);
  status.className = "transfer-status";
  item.dataset.state = "running";
  item.append(name, bar, status);
  transfers.prepend(item);
  document.getElementById("files-tab").click(); // where the progress shows
  const settle = (state, text) => {
    item.dataset.state = state;
    status.textContent = text;
  };
  return {
    progress(fraction, bytes) {
      if (fraction === null) bar.removeAttribute("value"); // a folder's zip: its size is known at the end
      else bar.value = Math.round(fraction * 100);
      status.textContent = interpolate(gettext("%(mib)s MiB"), { mib: (bytes / MIB).toFixed(1) }, true);
    },
    status: (text) => (status.textContent = text),
    done(text) {
      bar.value = 100;
      settle("done", text);
    },
    fail(text) {
      bar.value = 0; // what was sent, if anything, was not kept
      settle("error", text);
    },
  };
}

function upload(file, folder) {
  const path = folder ? `${folder.replace(/\/+$/, "")}/${file.name}` : file.name;
  const entry = transfer(interpolate(gettext("Upload of %(name)s"), { name: file.name }, true));
  const why = filesBlocked();
  if (why) return Promise.resolve(entry.fail(why));
  const cap = Number(root.dataset.transferMaxMib);
  if (file.size > cap * MIB) {
    const size = (file.size / MIB).toFixed(1);
    const text = gettext("%(size)s MiB is more than this desktop's plan moves at once (%(cap)s MiB): nothing was sent.");
    return Promise.resolve(entry.fail(interpolate(text, { size, cap }, true)));
  }
  return new Promise((resolve) => {
    const request = new XMLHttpRequest();
    request.open("PUT", filesUrl(path));
    request.setRequestHeader("X-CSRFToken", csrf);
    request.setRequestHeader("Content-Type", "application/octet-stream");
    request.upload.onprogress = (event) => event.lengthComputable && entry.progress(event.loaded / event.total, event.loaded);
    // Sent: the desktop takes it under its own name only once the whole file is there.
    request.upload.onload = () => entry.status(gettext("Writing it in the desktop…"));
    request.onload = () => {
      if (request.status === 201) {
        const written = JSON.parse(request.responseText).path;
        entry.done(interpolate(gettext("In the desktop: %(path)s"), { path: written }, true));
      } else {
        entry.fail(`${errorOf(request.status, request.responseText)} ${gettext("Nothing was written.")}`);
      }
      resolve();
    };
    request.onerror = request.onabort = () => {
      entry.fail(gettext("The upload was cut off: nothing was written in the desktop."));
      resolve();
    };
    request.send(file);
  });
}

async function uploadAll(files) {
  const folder = document.getElementById("upload-folder")?.value.trim() || "";
  for (const file of files) await upload(file, folder);
}

// The name the server gave the download (RFC 6266, as Django writes it).
function savedName(header, path) {
  const encoded = /filename\*=utf-8''([^;]+)/i.exec(header || "");
  if (encoded) return decodeURIComponent(encoded[1]);
  const plain = /filename="((?:\\.|[^"])*)"/.exec(header || "");
  return plain ? plain[1].replace(/\\(.)/g, "$1") : path.split("/").pop();
}

function download(path) {
  const entry = transfer(interpolate(gettext("Download of %(path)s"), { path }, true));
  const why = filesBlocked();
  if (why) return entry.fail(why);
  const request = new XMLHttpRequest();
  request.open("GET", filesUrl(path));
  request.responseType = "blob";
  request.onprogress = (event) => entry.progress(event.lengthComputable ? event.loaded / event.total : null, event.loaded);
  request.onload = async () => {
    if (request.status !== 200) return entry.fail(errorOf(request.status, await request.response.text()));
    const name = savedName(request.getResponseHeader("Content-Disposition"), path);
    const link = document.createElement("a");
    link.href = URL.createObjectURL(request.response);
    link.download = name;
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 60000);
    entry.done(interpolate(gettext("Saved as %(name)s."), { name }, true));
  };
  request.onerror = () => entry.fail(gettext("The download was cut off."));
  request.send();
}

if (transfers) {
  const input = document.getElementById("upload-input");
  document.getElementById("upload-choose").addEventListener("click", () => input.click());
  input.addEventListener("change", () => {
    uploadAll([...input.files]);
    input.value = "";
  });
  document.getElementById("download-form").addEventListener("submit", (event) => {
    event.preventDefault();
    download(document.getElementById("download-path").value.trim());
  });
}

// Dropping on the screen: files only (a folder is refused by name), with what would happen shown
// while they hover.
const screenPane = document.getElementById("screen");
const dragsFiles = (event) => event.dataTransfer?.types.includes("Files");
screenPane.addEventListener("dragover", (event) => {
  if (!dragsFiles(event)) return;
  event.preventDefault(); // else the browser opens the file in place of the page
  const why = transfers ? filesBlocked() : document.getElementById("mode-control").title;
  const folder = document.getElementById("upload-folder")?.value.trim();
  show(
    dropHint,
    why ||
      (folder
        ? interpolate(gettext("Drop to put the files in %(folder)s"), { folder }, true)
        : gettext("Drop to put the files in the agent's home")),
  );
});
screenPane.addEventListener("dragleave", (event) => {
  if (!screenPane.contains(event.relatedTarget)) show(dropHint, "");
});
screenPane.addEventListener("drop", (event) => {
  if (!dragsFiles(event)) return;
  event.preventDefault();
  show(dropHint, "");
  if (!transfers) return alert(document.getElementById("mode-control").title);
  const folders = [...event.dataTransfer.items].map((item) => item.webkitGetAsEntry?.()).filter((e) => e?.isDirectory);
  for (const folder of folders) {
    transfer(folder.name).fail(gettext("A folder cannot be dropped: drop the files in it, or a zip of it."));
  }
  const names = new Set(folders.map((folder) => folder.name));
  uploadAll([...event.dataTransfer.files].filter((file) => !names.has(file.name)));
});

applyState(stateBadge.dataset.state);

// The chat: the stored conversation, then answers streamed live as the agent writes them
// (the workspace's event stream carries each new piece with its place in the answer).

const chatLog = document.getElementById("chat-log");
const shown = new Map(); // message id -> { item, content }
let loads = 0; // the latest conversation fetch; an older one that answers late is dropped
let held = null; // events that arrive while a fetch is under way, applied on top of it

// Words the page shows, translated by the template.
const words = root.dataset;

function render(entry, status) {
  const waiting = status === "queued" || status === "running";
  entry.item.classList.toggle("pending", waiting);
  entry.item.classList.toggle("error", status === "error");
  entry.item.classList.toggle("cancelled", status === "cancelled");
  if (entry.failure) return renderFailure(entry);
  // The text in a node of its own: the Stop button beside it stays put while the answer streams in.
  entry.text ||= entry.item.appendChild(document.createElement("span"));
  entry.text.textContent = entry.content || (waiting ? gettext("The agent is working…") : "");
  if (status === "cancelled" && !entry.note) {
    entry.note = entry.item.appendChild(document.createElement("span"));
    entry.note.className = "muted";
    entry.note.textContent = ` (${words.stoppedLabel})`;
  }
  if (waiting && canControl && !entry.stop) {
    // Stops the turn in the desktop (the agent and what it started), or drops it from the queue.
    entry.stop = entry.item.appendChild(document.createElement("button"));
    entry.stop.className = "danger stop-turn";
    entry.stop.textContent = words.stopLabel;
    entry.stop.addEventListener("click", async () => {
      entry.stop.disabled = true;
      try {
        await api(`/chat/${entry.item.dataset.message}/cancel`, { method: "POST" });
      } catch (error) {
        alert(error.message);
      }
      loadChat();
    });
  }
  if (!waiting && entry.stop) {
    entry.stop.remove();
    entry.stop = null;
  }
}

// A failed turn: what happened in words, the fix one click away, sending the message again one click
// away too, the runtime's own words folded (where they say more).
function renderFailure(entry) {
  const { message, fixUrl, detail } = entry.failure;
  const words = document.createElement("p");
  words.className = "failure";
  words.textContent = message;
  const parts = [words];
  if (fixUrl) {
    const fix = document.createElement("a");
    fix.href = fixUrl;
    fix.className = "button";
    fix.textContent = gettext("Open Settings");
    parts.push(fix);
  }
  const asked = shown.get(entry.replyTo);
  if (canControl && asked) {
    const retry = document.createElement("button");
    retry.className = "retry";
    retry.textContent = gettext("Retry");
    retry.addEventListener("click", () => chatSend(asked.content, retry));
    parts.push(retry);
  }
  if (detail) {
    const folded = document.createElement("details");
    const summary = document.createElement("summary");
    summary.textContent = gettext("What the agent runtime said");
    const raw = document.createElement("pre");
    raw.textContent = detail;
    folded.append(summary, raw);
    parts.push(folded);
  }
  entry.item.replaceChildren(...parts);
}

// After a failed turn, the queue goes on with the next message: the failure says so where one waits.
function noteWhatGoesOn(entries) {
  entries.forEach((entry, i) => {
    if (!entry.failure) return;
    const next = entries.slice(i + 1).find((later) => later.item.classList.contains("pending"));
    if (!next) return;
    const note = entry.item.appendChild(document.createElement("p"));
    note.className = "muted goes-on";
    note.textContent = gettext("The next message in the queue went on to the agent all the same.");
  });
}

async function chatSend(message, button) {
  if (button) button.disabled = true;
  try {
    await api("/chat", { method: "POST", body: JSON.stringify({ message }) });
    return true;
  } catch (error) {
    alert(error.message);
    return false;
  } finally {
    if (button) button.disabled = false;
    loadChat();
  }
}

async function loadChat() {
  const load = ++loads;
  held = held || [];
  try {
    // The newest page: a long conversation's latest messages are the ones that move.
    const page = await api("/chat?pageSize=200&page=last");
    if (load !== loads) return;
    shown.clear();
    const entries = page.results.map((m) => {
      const entry = { item: document.createElement("li"), content: m.content, failure: m.failure, replyTo: m.replyTo };
      entry.item.className = m.author;
      entry.item.dataset.message = m.id;
      shown.set(m.id, entry); // before rendering: a failed reply offers to send its message again
      render(entry, m.status);
      return entry;
    });
    noteWhatGoesOn(entries);
    chatLog.replaceChildren(...entries.map((entry) => entry.item));
    if (!page.results.length) {
      const empty = document.createElement("li");
      empty.className = "muted";
      empty.textContent = gettext("No message yet.");
      chatLog.replaceChildren(empty);
    }
    chatLog.scrollTop = chatLog.scrollHeight;
  } catch (error) {
    if (load !== loads) return;
    const item = document.createElement("li");
    item.className = "error";
    item.textContent = interpolate(gettext("The conversation could not be loaded (%(why)s)."), { why: error.message }, true);
    chatLog.replaceChildren(item);
  }
  const events = held;
  held = null;
  events.forEach(applyChat);
}

function applyChat(event) {
  if (event.desktop_id !== desktopId) return;
  if (held) return held.push(event);
  const entry = shown.get(event.message_id);
  const finished = ["done", "error", "cancelled"].includes(event.status);
  if (!entry) return loadChat(); // a message this page has not seen yet
  if (event.status === "error") {
    return loadChat(); // why it failed, in words, comes with the stored message
  } else if (finished) {
    entry.content = event.text;
  } else if (event.at + event.text.length <= entry.content.length) {
    return; // already in what was fetched
  } else if (event.at === entry.content.length) {
    entry.content += event.text;
  } else {
    return loadChat(); // a piece went missing: fetch the whole answer
  }
  render(entry, event.status);
  chatLog.scrollTop = chatLog.scrollHeight;
}

// Who watches and who has control: fetched anew whenever someone opens or closes a relay here.
const watchers = document.getElementById("watchers");
const loadWatchers = reloader(
  () => watchers.dataset.url,
  (html) => (watchers.innerHTML = html),
);

const chatStream = workspaceEvents(root.dataset.workspace);
chatStream.addEventListener("chat", (message) => applyChat(JSON.parse(message.data)));
chatStream.addEventListener("desktop", (message) => {
  const event = JSON.parse(message.data);
  if (event.desktop_id !== desktopId) return;
  const was = stateBadge.dataset.state;
  applyState(event.state);
  // Back: no need to wait for the next look; gone: the overlays say what it is now, not what it was.
  if (event.state !== was) connect();
});
chatStream.addEventListener("watchers", (message) => {
  if (JSON.parse(message.data).desktop_id === desktopId) loadWatchers();
});
// On every (re)connection, catch up with what was said and who came meanwhile.
onOpen(chatStream, () => {
  loadChat();
  loadWatchers();
});

const chatForm = document.getElementById("chat-form");
if (chatForm) {
  // Enter sends, Shift+Enter starts a new line (and Enter while composing an accent is the IME's).
  document.getElementById("chat-text").addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    chatForm.requestSubmit();
  });
  chatForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = document.getElementById("chat-text");
    if (await chatSend(text.value)) text.value = ""; // refused, what was typed stays to send again
  });
}

// The side panel's tabs: chat, timeline, details, schedules.
document.querySelectorAll("[data-tab]").forEach((tab) =>
  tab.addEventListener("click", () => {
    document.querySelectorAll("[data-tab]").forEach((other) => {
      other.setAttribute("aria-selected", String(other === tab));
      document.getElementById(other.dataset.tab).hidden = other !== tab;
    });
  }),
);
// Back from a schedule's form, on the tab it was sent from (or the form back with what is wrong in it).
document.querySelector(`[data-tab="${root.dataset.openTab || location.hash.slice(1)}"]`)?.click();

connect();
