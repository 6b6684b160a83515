// The approval queue, live: the list is fetched again whenever a request is made or answered in the
// workspace (its event stream says so), and every half-minute for the waiting times. Answers are sent
// without leaving the page, so the desktop viewer keeps its screen and terminal open.
const REFRESH = 30000;

for (const box of document.querySelectorAll("[data-approvals]")) {
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
  const stream = new EventSource(`/events/w/${box.dataset.workspace}/`);
  stream.addEventListener("approval", reload);
  stream.addEventListener("open", reload); // catch up after a reconnection
  setInterval(reload, REFRESH);
}
