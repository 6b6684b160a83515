// The workspace's live events (server-sent), one stream per workspace for the whole page: every script
// of the page listens on the same one, as a browser keeps few connections open to one server.
const streams = new Map();

export function workspaceEvents(workspace) {
  if (!streams.has(workspace)) streams.set(workspace, new EventSource(`/events/w/${workspace}/`));
  return streams.get(workspace);
}

// Run `handler` on every (re)connection of the stream, including one made before it was given.
export function onOpen(stream, handler) {
  stream.addEventListener("open", handler);
  if (stream.readyState === EventSource.OPEN) handler();
}

// A part of the page fetched again on events, which come in bursts: of fetches that overlap, only the
// answer to the last one asked is applied, so an older answer never overwrites a newer one.
export function reloader(url, apply) {
  let latest = 0;
  return async () => {
    const asked = ++latest;
    const response = await fetch(url(), { credentials: "same-origin" });
    if (!response.ok) return;
    const html = await response.text();
    if (asked === latest) apply(html);
  };
}
