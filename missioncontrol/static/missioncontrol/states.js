// A desktop's states as a person reads them, in the page's language; the page's logic and the API keep
// the values ("running"), which the badge carries in its data-state.
const LABELS = {
  provisioning: pgettext("desktop state", "provisioning"),
  running: pgettext("desktop state", "running"),
  stopping: pgettext("desktop state", "stopping"),
  stopped: pgettext("desktop state", "stopped"),
  starting: pgettext("desktop state", "starting"),
  suspending: pgettext("desktop state", "suspending"),
  suspended: pgettext("desktop state", "suspended"),
  resuming: pgettext("desktop state", "resuming"),
  destroying: pgettext("desktop state", "destroying"),
  destroyed: pgettext("desktop state", "destroyed"),
  error: pgettext("desktop state", "error"),
};

export const stateLabel = (state) => LABELS[state] ?? state;

export function showState(badge, state) {
  badge.textContent = stateLabel(state);
  badge.dataset.state = state;
  badge.className = `badge ${state}`;
}
