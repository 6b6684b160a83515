// Destroying asks for the desktops' names, typed: a dialog names each one and what is lost, and its
// button waits until the names typed are exactly those (any order, separated by spaces or commas).
// Its words come from Django's JavaScript catalogue (gettext, ngettext, interpolate), loaded before it.
const dialog = document.getElementById("destroy-dialog");
const typed = document.getElementById("destroy-typed");
const button = document.getElementById("destroy-confirm");
const words = (text) => text.split(/[\s,]+/).filter(Boolean);

// `desktops`: [{name, disk}] (disk in GiB). Resolves to the names as typed, or null when called off.
export function confirmDestroy(desktops) {
  const names = desktops.map((d) => d.name);
  const n = names.length;
  document.getElementById("destroy-title").textContent = interpolate(
    ngettext("Destroy %(n)s desktop?", "Destroy %(n)s desktops?", n), { n }, true);
  document.getElementById("destroy-list").replaceChildren(
    ...desktops.map(({ name, disk }) => {
      const item = document.createElement("li");
      const strong = document.createElement("strong");
      strong.textContent = name;
      item.append(strong, " ", interpolate(gettext("— its %(disk)s GiB disk and everything on it"), { disk }, true));
      return item;
    }),
  );
  document.getElementById("destroy-ask").textContent = interpolate(
    ngettext("Type its name, %(names)s, to confirm:", "Type their names, %(names)s, to confirm:", n),
    { names: names.join(" ") }, true);
  const wanted = new Set(names);
  typed.value = "";
  button.disabled = true;
  typed.oninput = () => {
    const given = new Set(words(typed.value));
    button.disabled = given.size !== wanted.size || [...given].some((name) => !wanted.has(name));
  };
  dialog.returnValue = "";
  dialog.showModal();
  typed.focus();
  return new Promise((resolve) =>
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "destroy" ? typed.value.trim() : null), {
      once: true,
    }),
  );
}
