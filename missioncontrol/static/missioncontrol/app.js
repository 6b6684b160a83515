// Behaviour every page shares (no inline handlers: the content security policy allows none).
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
