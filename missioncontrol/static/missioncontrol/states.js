// A desktop's states as a person reads them, in the page's language (the page carries their labels,
// `{% state_labels %}`); the page's logic and the API keep the values ("running"), in the badge's data-state.
const LABELS = JSON.parse(document.getElementById("state-labels").textContent);

export const stateLabel = (state) => LABELS[state] ?? state;

export function showState(badge, state) {
  badge.textContent = stateLabel(state);
  badge.dataset.state = state;
  badge.className = `badge ${state}`;
}
