// A job's lifecycle events in plain words.
import { fmtBytes, fmtTime, h } from "./dom.js";

const ERRORS = {
  oom: "ran out of device memory",
  diverged: "diverged (the loss or the loss scale stopped being usable)",
  worker_lost: "lost its worker",
  cancelled: "was cancelled",
  invalid_spec: "has a spec that cannot run",
  internal: "hit an internal error",
};

function errorWords(error) {
  if (!error) return "";
  const what = ERRORS[error.code] || `failed (${error.code})`;
  const where = error.step ? ` at step ${error.step}` : "";
  return `${what}${where}: ${error.message || ""}`;
}

function precisionWords(p) {
  if (!p) return "";
  return `${p.effective}${p.requested && p.requested !== p.effective ? ` (asked for ${p.requested})` : ""}${p.reason ? ` — ${p.reason}` : ""}`;
}

/** One line for an event: {type, step, attempt, time, data}. */
export function describe(ev) {
  const d = ev.data || {};
  switch (ev.type) {
    case "queued": return `Queued${d.queue ? ` on ${d.queue}` : ""}`;
    case "started": return `Attempt ${d.attempt ?? ev.attempt} started${d.worker ? ` on ${d.worker}` : ""} in ${precisionWords(d.precision)}`;
    case "precision": return `Trains in ${precisionWords(d)}`;
    case "resumed": return `Resumed from the checkpoint at step ${d.from_step ?? ev.step}`;
    case "checkpoint": return `Checkpoint saved at step ${ev.step}`;
    case "warning": return `Warning at step ${ev.step}: ${d.message || d.code}`;
    case "rollback": return `Rollback at step ${ev.step}: ${d.message || `loss spike at step ${d.spike_step}`}`;
    case "micro_batch": return `Micro-batch changed at step ${ev.step}${d.micro_batch ? ` to ${d.micro_batch}` : ""}${d.memory ? ` (${fmtBytes(d.memory)})` : ""}`;
    case "requeued": return `Attempt ${ev.attempt} stopped and the job was re-queued${d.error ? `: it ${errorWords(d.error)}` : ""}`;
    case "succeeded": return `Succeeded at step ${ev.step}`;
    case "failed": return `Failed: the job ${errorWords(d.error)}`;
    case "cancelled": return `Cancelled at step ${ev.step}`;
    default: return `${ev.type}${ev.step != null ? ` at step ${ev.step}` : ""}`;
  }
}

export class Timeline {
  constructor() {
    this.seen = new Set();
    this.el = h("ol", { class: "timeline", id: "timeline" });
  }

  add(ev) {
    const key = `${ev.attempt}|${ev.type}|${ev.step}|${ev.type === "warning" || ev.type === "checkpoint" ? ev.time : ""}`;
    if (this.seen.has(key)) return false;
    this.seen.add(key);
    const cls = ev.type === "warning" ? "warning" : ev.type;
    this.el.append(h("li", { class: cls, dataset: { type: ev.type } },
      h("span", { class: "t" }, ev.time ? fmtTime(ev.time) : ""), describe(ev)));
    this.el.scrollTop = this.el.scrollHeight;
    return true;
  }
}
