// The public HTTP API, as the dashboard calls it. The token lives in this tab's
// sessionStorage only: sent as `Authorization: Bearer` over HTTP and as the
// `bearer, TOKEN` subprotocol pair on WebSockets, never in a URL.

const KEY = "amptrain.token";

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

/** An answer other than 2xx: `status`, the API's `code` and `detail`. */
export class ApiError extends Error {
  constructor(status, code, detail) {
    super(typeof detail === "string" ? detail : `${status} ${code}`);
    this.status = status;
    this.code = code;
    this.detail = detail;
  }

  /** 422 problems as {field: message}. */
  fieldErrors() {
    const out = {};
    if (this.status === 422 && Array.isArray(this.detail)) {
      for (const p of this.detail) out[p.field] = out[p.field] ? `${out[p.field]}; ${p.message}` : p.message;
    }
    return out;
  }
}

let onUnauthorized = () => {};
export function whenUnauthorized(fn) {
  onUnauthorized = fn;
}

/** JSON request with the tab's token. Throws ApiError; a 401 also signs the tab out. */
export async function api(path, { method = "GET", body, signal, params, auth = token.get() } = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, v);
  }
  const headers = { Accept: "application/json" };
  if (auth) headers.Authorization = `Bearer ${auth}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(url, {
    method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (res.ok) return res.status === 204 ? null : res.json();
  let payload = {};
  try { payload = await res.json(); } catch { /* not JSON */ }
  const err = new ApiError(res.status, payload.error || "error", payload.detail ?? res.statusText);
  if (res.status === 401 && auth === token.get()) onUnauthorized();
  throw err;
}

let catalogAnswer = null;
/** `GET /catalog`, once per page load: components, limits, and the metric table (the
 * metrics a job records and the charts that show them). */
export function catalog() {
  catalogAnswer ??= api("/catalog").catch((e) => { catalogAnswer = null; throw e; });
  return catalogAnswer;
}

/** A file download that needs the Authorization header (checkpoints). */
export async function download(path, filename) {
  const res = await fetch(path, { headers: { Authorization: `Bearer ${token.get()}` } });
  if (!res.ok) throw new ApiError(res.status, "download_failed", `${res.status} ${res.statusText}`);
  const url = URL.createObjectURL(await res.blob());
  const a = Object.assign(document.createElement("a"), { href: url, download: filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/** `ws://host/jobs/ID/ws?after=CURSOR&batch=true`, authenticated by subprotocol (browsers
 * cannot set headers). `batch`: records arrive grouped in `batch` frames. */
export function openJobSocket(jobId, after, { batch = false } = {}) {
  const url = new URL(`/jobs/${encodeURIComponent(jobId)}/ws`, location.origin);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  if (after) url.searchParams.set("after", after);
  if (batch) url.searchParams.set("batch", "true");
  return new WebSocket(url, ["bearer", token.get()]);
}
