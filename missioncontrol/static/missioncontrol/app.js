// Behaviour every page shares (no inline handlers: the content security policy allows none).
import { onOpen, workspaceEvents } from "./events.js";

// A <select data-autosubmit> sends its form as soon as its choice changes.
document.querySelectorAll("[data-autosubmit]").forEach((field) =>
  field.addEventListener("change", () => field.form.submit()),
);
// A <button data-copy="ID"> puts the text of element ID on the clipboard, and says so on itself.
document.querySelectorAll("[data-copy]").forEach((button) =>
  button.addEventListener("click", async () => {
    await navigator.clipboard.writeText(document.getElementById(button.dataset.copy).textContent.trim());
    button.textContent = button.dataset.copied;
  }),
);
// A <form data-confirm="…"> that loses something is sent only once its question is answered yes.
document.querySelectorAll("form[data-confirm]").forEach((form) =>
  form.addEventListener("submit", (event) => {
    if (!confirm(form.dataset.confirm)) event.preventDefault();
  }),
);

// Toasts: the results of work done in the background (a desktop's step ending, an LLM key's check),
// said on whichever page of the workspace is open. Their words come translated in #toasts' data-*.

const toasts = document.getElementById("toasts");
const SETTLED = new Set(["running", "stopped", "suspended", "destroyed", "error"]);
const SHOWN_FOR = 8000; // a failure stays until it is dismissed
const AT_MOST = 5;

// A toast goes when dismissed, or by itself after a while unless it says something failed.
function dismissible(item) {
  item.querySelector("button").addEventListener("click", () => item.remove());
  if (!item.classList.contains("error")) setTimeout(() => item.remove(), SHOWN_FOR);
}

function toast(text, failed) {
  const item = document.createElement("div");
  item.className = failed ? "toast error" : "toast";
  const words = item.appendChild(document.createElement("span"));
  words.textContent = text;
  const close = item.appendChild(document.createElement("button"));
  close.type = "button";
  close.textContent = "×";
  close.setAttribute("aria-label", toasts.dataset.dismiss);
  dismissible(item);
  toasts.append(item);
  while (toasts.children.length > AT_MOST) toasts.firstElementChild.remove();
}

const said = (template, values) => template.replace(/\{(\w+)\}/g, (_, key) => values[key] ?? "");

if (toasts) {
  toasts.querySelectorAll(".toast").forEach(dismissible); // the page's own messages, where it shows them so
  const events = workspaceEvents(toasts.dataset.workspace);
  onOpen(events, () => (toasts.dataset.listening = "true")); // results from now on are said here
  events.addEventListener("error", () => delete toasts.dataset.listening);
  const seen = new Map(); // desktop id -> the last state this page heard of
  events.addEventListener("desktop", (message) => {
    const event = JSON.parse(message.data);
    const before = seen.get(event.desktop_id);
    seen.set(event.desktop_id, event.state);
    if (!SETTLED.has(event.state) || before === event.state) return;
    const failed = event.state === "error";
    toast(said(toasts.dataset[event.state], { name: event.name, error: event.last_error }), failed);
  });
  events.addEventListener("llm_key", (message) => {
    const event = JSON.parse(message.data);
    const failed = event.verdict === "refused" || event.verdict === "unreachable";
    const template = { accepted: "keyAccepted", refused: "keyRefused", unreachable: "keyUnreachable" }[event.verdict];
    toast(said(toasts.dataset[template || "keyOther"], { name: event.name }), failed);
  });
}
