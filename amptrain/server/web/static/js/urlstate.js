// A page's view state in the URL fragment's query (#/jobs/ID?x=time&smooth=0.5&from=100&to=500),
// so a link shows what its sender saw. Written with history.replaceState: no hashchange (the
// page is not mounted again), no history entry per drag or keystroke.

/** The fragment's query as URLSearchParams (empty when it has none). */
export function readState() {
  return new URLSearchParams(location.hash.split("?")[1] || "");
}

/** Set (or, for null and "", remove) keys of the fragment's query, keeping the others. */
export function writeState(updates) {
  const [path] = location.hash.split("?");
  const params = readState();
  for (const [key, value] of Object.entries(updates)) {
    if (value === null || value === undefined || value === "") params.delete(key);
    else params.set(key, String(value));
  }
  const query = params.toString();
  history.replaceState(history.state, "", `${location.pathname}${location.search}${path}${query ? `?${query}` : ""}`);
}
