// Tiny DOM and formatting helpers; no framework.

/** h("div", {class: "x", onclick: fn}, child, "text", [more]) */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function fmtNum(v, digits = 4) {
  if (v === null || v === undefined) return "–";
  if (!Number.isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
  // A whole number is shown whole: rounding 65536 to 4 digits read "65540".
  if (Number.isInteger(v)) return String(v);
  return Number(v.toPrecision(digits)).toString();
}

// A value on a base-2 scale (the fp16 loss scale): powers of two as 2^k, exactly.
export function fmtPow2(v) {
  if (typeof v === "number" && v > 0 && Number.isInteger(Math.log2(v))) return `2^${Math.log2(v)}`;
  return fmtNum(v);
}

export function fmtBytes(v) {
  if (v === null || v === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let x = v;
  while (Math.abs(x) >= 1024 && i < units.length - 1) { x /= 1024; i++; }
  return `${x.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function fmtAge(iso) {
  if (!iso) return "–";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.floor(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

export function fmtTime(unixSeconds) {
  return new Date(unixSeconds * 1000).toLocaleTimeString();
}

/** A date and time to the second ("Dec 3, 12:40:19"): a timeline can span days. */
export function fmtDateTime(unixSeconds) {
  return new Date(unixSeconds * 1000).toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export function statusBadge(status) {
  return h("span", { class: `status ${status}`, dataset: { status } }, status);
}

export function progressBar(step, max) {
  const pct = max ? Math.min(100, (100 * step) / max) : 0;
  return h("span", { class: "progress", title: `${step} / ${max}` }, h("span", { style: `width:${pct.toFixed(1)}%` }));
}

export const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
