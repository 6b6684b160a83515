// Lists that follow the workspace live (the approval queue, the alerts): each `[data-live]` box is
// fetched again from its data-src whenever one of the events its data-live names happens in the
// workspace (its event stream says so), and every half-minute for the times it shows. Its forms are
// sent without leaving the page, so the desktop viewer keeps its screen and terminal open.
import { onOpen, workspaceEvents } from "./events.js";

const REFRESH = 30000;

for (const box of document.querySelectorAll("[data-live]")) {
  const reload = async () => {
    const response = await fetch(box.dataset.src, { credentials: "same-origin" });
    if (response.ok) box.innerHTML = await response.text();
  };
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
