// The desktops list, live: one server-sent event stream for the workspace updates each row.
const table = document.getElementById("desktops-table");
const workspace = table.dataset.workspace;
const live = document.getElementById("live");
const rows = document.getElementById("desktop-rows");
const TRANSIENT = new Set(["provisioning", "starting", "stopping", "suspending", "resuming", "destroying"]);

function setText(row, field, text) {
  const el = row.querySelector(`[data-field="${field}"]`);
  if (el) el.textContent = text;
}

async function reloadRows() {
  // A desktop this page has not seen (made elsewhere): fetch the rows again, keeping the filters.
  const url = new URL(location.href);
  url.searchParams.set("rows", "1");
  const response = await fetch(url, { credentials: "same-origin" });
  if (response.ok) {
    rows.innerHTML = await response.text();
    bindSelection();
  }
}

function apply(event) {
  const row = rows.querySelector(`tr[data-desktop="${event.desktop_id}"]`);
  if (!row) return reloadRows();
  const badge = row.querySelector('[data-field="state"]');
  badge.textContent = event.state;
  badge.className = `badge ${event.state}`;
  setText(row, "progress", TRANSIENT.has(event.state) && event.progress ? `${event.progress}…` : "");
  setText(row, "last_error", event.state === "error" ? event.last_error : "");
  setText(row, "private_ip", event.private_ip || "—");
  setText(row, "uptime", event.state === "running" ? "just now" : "—");
  row.classList.remove("flash");
  void row.offsetWidth; // restart the highlight
  row.classList.add("flash");
}

function connect() {
  const stream = new EventSource(`/events/w/${workspace}/`);
  stream.addEventListener("open", () => {
    live.textContent = "live";
    live.classList.remove("down");
  });
  stream.addEventListener("desktop", (message) => apply(JSON.parse(message.data)));
  stream.addEventListener("approval", reloadRows); // a desktop's requests waiting for an answer
  stream.addEventListener("error", () => {
    // EventSource reconnects by itself and resumes from the last event it saw.
    live.textContent = "reconnecting…";
    live.classList.add("down");
  });
}

// Fleet actions: select many, act once; destroy asks for the count.

function bindSelection() {
  const boxes = [...rows.querySelectorAll('input[name="desktops"]')];
  const count = document.getElementById("selected-count");
  const update = () => {
    const n = boxes.filter((b) => b.checked).length;
    if (count) count.textContent = `${n} selected`;
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
fleet.addEventListener("submit", (event) => {
  const button = event.submitter;
  if (!button || !("confirmCount" in button.dataset)) return;
  const n = rows.querySelectorAll('input[name="desktops"]:checked').length;
  const typed = prompt(`Destroy ${n} desktop(s) and wipe their disks? Type ${n} to confirm.`);
  if (typed === null) return event.preventDefault();
  document.getElementById("confirm").value = typed.trim();
});

bindSelection();
connect();
