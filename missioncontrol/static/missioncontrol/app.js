// Behaviour every page shares (no inline handlers: the content security policy allows none).
// A <select data-autosubmit> sends its form as soon as its choice changes.
document.querySelectorAll("[data-autosubmit]").forEach((field) =>
  field.addEventListener("change", () => field.form.submit()),
);
