// Lists that follow the workspace live (the approval queue, the alerts): each `[data-live]` box is
// fetched again from its data-src whenever one of the events its data-live names happens in the
// workspace (its event stream says so), and every half-minute for the times it shows. Its forms are
// sent without leaving the page, so the desktop viewer keeps its screen and terminal open.
import { onOpen, reloader, workspaceEvents } from "./events.js";

const REFRESH = 30000;

// A field is known across reloads by its form's action and its name (an approval's comment box).
const fieldKey = (field) => `${field.form?.getAttribute("action")} ${field.name}`;

// Put the new list in place without losing what the person was typing: a comment half-written when
// another request arrives (or the half-minute refresh comes) stays, with the focus and the caret.
function replaceKeepingInput(box, html) {
  const typed = new Map();
  for (const field of box.querySelectorAll("input[name], textarea[name]")) {
    if (field.value !== field.defaultValue) typed.set(fieldKey(field), field.value);
  }
  const active = box.contains(document.activeElement) ? document.activeElement : null;
  const focused = active?.name ? fieldKey(active) : null;
  const caret = [active?.selectionStart, active?.selectionEnd];
  box.innerHTML = html;
  for (const field of box.querySelectorAll("input[name], textarea[name]")) {
    const key = fieldKey(field);
    if (typed.has(key)) field.value = typed.get(key);
    if (key === focused) {
      field.focus();
      if (caret[0] != null) field.setSelectionRange(...caret);
    }
  }
}

for (const box of document.querySelectorAll("[data-live]")) {
  const reload = reloader(
    () => box.dataset.src,
    (html) => replaceKeepingInput(box, html),
  );
  box.addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = event.target;
    const body = new FormData(form);
    if (event.submitter) body.append(event.submitter.name, event.submitter.value);
    form.querySelectorAll("button").forEach((button) => (button.disabled = true));
    const response = await fetch(form.action, {
      method: "POST",
      body,
      credentials: "same-origin",
      headers: { "X-Requested-With": "fetch" },
    });
    if (!response.ok) alert(`HTTP ${response.status}`);
    reload();
  });
  const events = workspaceEvents(box.dataset.workspace);
  for (const name of box.dataset.live.split(" ")) events.addEventListener(name, reload);
  onOpen(events, reload); // catch up after a reconnection
  setInterval(reload, REFRESH);
}
