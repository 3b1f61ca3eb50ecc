// A job's lifecycle events in plain words, dated: a filter per event type, runs of
// checkpoints as one line, and the events that changed the run's course handed to the
// charts (onMarks) to mark at their steps.
import { fmtBytes, fmtDateTime, h } from "./dom.js";

/** Marked on the charts: what changed a run's course (checkpoints are too many to mark). */
const CHARTED = new Set(["warning", "resumed", "requeued", "micro_batch", "precision_fallback", "failed", "cancelled"]);

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
    case "precision_fallback": return `Precision fell back from ${d.from} to ${d.to} at step ${ev.step}${d.message ? `: ${d.message}` : ""}`;
    case "waiting_for_queue": return `Waiting: ${d.message || `no live worker takes jobs from queue ${d.queue}`}`;
    case "started": return `Attempt ${d.attempt ?? ev.attempt} started${d.worker ? ` on ${d.worker}` : ""} in ${precisionWords(d.precision)}`;
    case "precision": return `Trains in ${precisionWords(d)}`;
    case "resumed": return `Resumed from the checkpoint at step ${d.from_step ?? ev.step}`;
    case "checkpoint": return `Checkpoint saved at step ${ev.step}`;
    case "warning": return `Warning at step ${ev.step}: ${d.message || d.code}`;
    case "rollback": return `Rollback at step ${ev.step}: ${d.message || `loss spike at step ${d.spike_step}`}`;
    case "micro_batch": return `Micro-batch changed at step ${ev.step}${d.micro_batch ? ` to ${d.micro_batch}` : ""}${d.memory ? ` (${fmtBytes(d.memory)})` : ""}`;
    case "requeued": return `Attempt ${ev.attempt} stopped and the job was re-queued${d.error ? `: it ${errorWords(d.error)}` : ""}`;
    case "data": return `Data read by ${d.loader === "processes" ? `${d.loader_workers} loader processes` : `the ${d.loader}`}${d.class_count ? `; ${d.class_count} classes: ${(d.class_names || []).join(", ")}${d.class_count > (d.class_names || []).length ? ", …" : ""}` : ""}`;
    case "data_skipped": return `Skipped ${d.count} file${d.count === 1 ? "" : "s"} that did not decode${d.newest?.length ? `, newest: ${d.newest.join(", ")}` : ""}`;
    case "confusion_matrix": return `Confusion matrix at step ${ev.step} (${d.classes} classes, ${d.samples} samples)`;
    case "succeeded": return `Succeeded at step ${ev.step}`;
    case "failed": return `Failed: the job ${errorWords(d.error)}`;
    case "cancelled": return `Cancelled at step ${ev.step}`;
    default: return `${ev.type}${ev.step != null ? ` at step ${ev.step}` : ""}`;
  }
}

export class Timeline {
  constructor({ onMarks } = {}) {
    this.seen = new Set();
    this.counts = new Map();
    this.hidden = new Set();
    this.marks = [];
    this.onMarks = onMarks;
    this.filters = h("div", { class: "timeline-filters small", id: "timeline-filters" });
    this.list = h("ol", { class: "timeline", id: "timeline" });
    this.el = h("div", {}, this.filters, this.list);
  }

  /** Show `ev` unless already shown; whether it was new. */
  add(ev) {
    const key = `${ev.attempt}|${ev.type}|${ev.step}|${ev.type === "warning" || ev.type === "checkpoint" ? ev.time : ""}`;
    if (this.seen.has(key)) return false;
    this.seen.add(key);
    this.counts.set(ev.type, (this.counts.get(ev.type) || 0) + 1);
    const last = this.list.lastElementChild;
    if (ev.type === "checkpoint" && last?.dataset.type === "checkpoint") this.#extend(last, ev);
    else this.list.append(this.#item(ev));
    this.#renderFilters();
    this.list.scrollTop = this.list.scrollHeight;
    if (CHARTED.has(ev.type) && ev.step != null) {
      this.marks.push({ step: ev.step, type: ev.type, text: describe(ev) });
      this.onMarks?.(this.marks);
    }
    return true;
  }

  #item(ev) {
    const li = h("li", { class: ev.type, dataset: { type: ev.type, count: "1", steps: String(ev.step ?? "") } },
      h("span", { class: "t", title: ev.time ? new Date(ev.time * 1000).toISOString() : "" }, ev.time ? fmtDateTime(ev.time) : ""),
      h("span", { class: "what" }, describe(ev)));
    li.dataset.first = String(ev.time ?? "");
    li.hidden = this.hidden.has(ev.type);
    return li;
  }

  /** A run of checkpoints reads as one line: how many, from which step to which. */
  #extend(li, ev) {
    const steps = `${li.dataset.steps},${ev.step}`;
    const list = steps.split(",");
    li.dataset.steps = steps;
    li.dataset.count = String(list.length);
    li.title = `steps ${list.join(", ")}`;
    const [from, to] = [fmtDateTime(Number(li.dataset.first)), fmtDateTime(ev.time)];
    li.querySelector(".t").textContent = from === to ? from : `${from} – ${to}`;
    li.querySelector(".what").textContent = `${list.length} checkpoints saved, steps ${list[0]}–${ev.step}`;
  }

  #renderFilters() {
    if (this.counts.size < 2) return this.filters.replaceChildren();
    this.filters.replaceChildren(h("span", { class: "muted" }, "show "), ...[...this.counts].map(([type, n]) => h("label", {},
      h("input", { type: "checkbox", checked: !this.hidden.has(type), dataset: { filter: type }, onchange: (e) => this.#show(type, e.target.checked) }),
      ` ${type.replaceAll("_", " ")} (${n})`)));
  }

  #show(type, shown) {
    if (shown) this.hidden.delete(type); else this.hidden.add(type);
    for (const li of this.list.children) if (li.dataset.type === type) li.hidden = !shown;
  }
}
