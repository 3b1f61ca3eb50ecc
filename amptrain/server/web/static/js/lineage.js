// Forks on the job page (POST /jobs/{id}/fork): the form a checkpoint row's "Fork" button
// opens (learning rate, max_steps, a name; the server validates the whole spec and names
// the field it refuses), a fork's origin with a link to its parent, the parent's forks,
// and the "loss with its parent" chart: the parent's loss up to the fork step as context,
// its steps after it faint, and the fork's own steps from k+1 over them.
import { api, ApiError } from "./api.js";
import { clear, h } from "./dom.js";
import { OverlayPlot, lineStyle } from "./overlay.js";

const POINTS = 2000; // each run's loss, downsampled by the server to about this many points

/** The small form under a checkpoint row: fork `job` at `step`, then open the fork. */
export function forkForm(job, step, onCancel) {
  const spec = job.spec || {};
  const lr = h("input", { type: "number", name: "lr", step: "any", min: "0", value: String(spec.optimizer?.lr ?? "") });
  const maxSteps = h("input", { type: "number", name: "max_steps", min: String(step + 1), step: "1", value: String(Math.max(spec.max_steps ?? 0, step + 1)) });
  const name = h("input", { type: "text", name: "name", maxlength: "200", placeholder: `${job.name}@${step}` });
  const error = h("div", { class: "error small fork-error" });
  const form = h("form", { class: "fork-form small", dataset: { step: String(step) } },
    h("label", {}, "learning rate ", lr), " ",
    h("label", {}, "max steps ", maxSteps), " ",
    h("label", {}, "name ", name), " ",
    h("button", { type: "submit" }, "Create fork"), " ",
    h("button", { type: "button", class: "link", onclick: onCancel }, "cancel"),
    error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const overrides = {};
    if (lr.value !== "" && Number(lr.value) !== spec.optimizer?.lr) overrides.optimizer = { lr: Number(lr.value) };
    if (maxSteps.value !== "" && Number(maxSteps.value) !== spec.max_steps) overrides.max_steps = Number(maxSteps.value);
    const body = { step, overrides, ...(name.value ? { name: name.value } : {}) };
    try {
      const child = await api(`/jobs/${encodeURIComponent(job.id)}/fork`, { method: "POST", body });
      location.hash = `#/jobs/${encodeURIComponent(child.id)}`;
    } catch (err) {
      error.textContent = describe(err);
    }
  });
  return form;
}

function describe(err) {
  if (!(err instanceof ApiError)) return err.message;
  if (err.status === 422) return Object.entries(err.fieldErrors()).map(([f, m]) => `${f}: ${m}`).join("; ");
  if (err.detail && typeof err.detail === "object" && "forkable_steps" in err.detail) {
    return `${err.detail.message}; forkable steps: ${err.detail.forkable_steps.join(", ") || "none"}`;
  }
  return err.message;
}

/** The fork's origin and the job's forks, as links (for the job page's head). */
export function lineageLinks(job) {
  const from = job.forked_from;
  const forks = job.forks?.items || [];
  if (!from && !forks.length) return null;
  return h("div", { class: "small lineage", id: "lineage" },
    from ? h("div", { id: "forked-from" }, "fork of ",
      h("a", { href: `#/jobs/${encodeURIComponent(from.job)}`, class: "mono" }, from.job), ` at step ${from.step}`) : null,
    forks.length ? h("div", { id: "forks" }, `forks${job.forks.more ? " (newest)" : ""}: `,
      ...forks.flatMap((f, i) => [i ? ", " : "", h("a", { href: `#/jobs/${encodeURIComponent(f.id)}`, dataset: { fork: f.id } }, `${f.name} @${f.step === 0 ? f.fork_step : f.step}`)])) : null);
}

/** A card with the loss of a fork over its parent's (nothing for a job that is no fork). */
export class ParentOverlay {
  constructor() {
    this.el = h("div", { class: "card", id: "parent-overlay", hidden: true });
    this.plot = null;
  }

  async load(job) {
    const from = job.forked_from;
    if (!from) return;
    const params = { fields: "loss", max_points: POINTS };
    const [parent, own] = await Promise.all([
      api(`/jobs/${encodeURIComponent(from.job)}/metrics`, { params }).catch(() => null),
      api(`/jobs/${encodeURIComponent(job.id)}/metrics`, { params }),
    ]);
    const line = (items, keep) => { const kept = items.filter(keep); return [kept.map((i) => i.step), kept.map((i) => i.loss ?? null)]; };
    const lines = [];
    const add = (label, [xs, ys], style) => { if (xs.length) lines.push({ label, xs, ys, ...style }); };
    if (parent) {
      add(`parent up to step ${from.step}`, line(parent.items, (i) => i.step <= from.step), { ...lineStyle(1), width: 2 });
      add("parent after it", line(parent.items, (i) => i.step > from.step), { ...lineStyle(1), color: "#d9480f66", dash: [2, 3], width: 1 });
    }
    add("this fork", line(own.items, () => true), lineStyle(0));
    this.el.hidden = false;
    this.el.dataset.lines = String(lines.length);
    this.el.dataset.forkFirstStep = String(own.items[0]?.step ?? "");
    this.el.dataset.parentLastContextStep = String(lines.find((l) => l.label.startsWith("parent up"))?.xs.at(-1) ?? "");
    if (!this.plot) {
      const body = h("div", {});
      clear(this.el, h("h2", {}, "Loss with its parent"), parent ? null : h("div", { class: "muted small" }, "The parent's history is not visible to you."), body);
      this.plot = new OverlayPlot(body, { height: 220, syncKey: `fork-${job.id}` });
    }
    this.plot.draw(lines, { yLabel: "loss", what: "loss curves" });
  }

  close() {
    this.plot?.close();
  }
}
