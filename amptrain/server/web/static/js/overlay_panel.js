// The compare view's "Overlay runs" card: the picked jobs' lines for one metric (every step
// metric a chart shows, every evaluation metric), smoothed and on a log axis as on the job
// page, x as step or elapsed time, seed runs as one mean with a min-max band, and beneath
// it each run's difference to a chosen baseline run (by default the first picked fp32 run),
// for any number of runs. The choices live in the link (#/compare?jobs=a,b&metric=loss&...),
// so it shows what its sender saw.
import { api, catalog } from "./api.js";
import { FINISHED, h } from "./dom.js";
import { JobPicker } from "./job_picker.js";
import { axisTitle } from "./legend.js";
import { OverlayPlot, dashName, lineStyle } from "./overlay.js";
import { baselineIndex, difference, groupLabels, linePoints, meanBand, seedGroups } from "./overlay_data.js";
import { readState, writeState } from "./urlstate.js";

const EVAL = "eval:"; // metric values of evaluation series: "eval:accuracy"
const POINTS_PER_PIXEL = 2;
const MAX_POINTS = 10_000; // the API's max_points bound
const FRESH_MS = 5000;
const SMOOTHING = 0.8; // the job page's default weight

/** Every metric the overlay can draw, from GET /catalog's one metric table. */
function metricDefs(cat) {
  const charts = Object.fromEntries(cat.charts.map((c) => [c.key, c]));
  const step = cat.metrics.filter((m) => m.chart && charts[m.chart]).map((m) => {
    const c = charts[m.chart];
    const title = c.title + (cat.metrics.filter((x) => x.chart === m.chart).length > 1 ? `: ${m.name}` : "");
    return { value: m.name, field: m.name, unit: m.unit, title, evals: false, smooth: Boolean(c.smooth), log: c.log,
      kind: m.unit === "bytes" ? "bytes" : c.log === "log2" ? "log2" : "" };
  });
  const evals = (cat.eval_metrics || []).map((m) => ({ value: EVAL + m.name, field: m.name, title: `eval: ${m.label || m.name}`,
    evals: true, smooth: false, log: "toggle", kind: "", bounds: m.bounds || null }));
  return { step, evals, all: [...step, ...evals] };
}

/** The card and the picker's card; `destroy()` on unmount. */
export function overlayPanel(preselected) {
  const st = readState();
  const state = { baseline: st.get("baseline") || null, metric: st.get("metric") || "loss", smooth: clampWeight(st.get("smooth")), log: st.get("log") === "1", group: st.get("group") === "1", x: st.get("x") === "time" ? "time" : "step" };
  const plotEl = h("div", { id: "overlay" });
  const diffEl = h("div", { id: "overlay-diff" });
  const note = h("p", { class: "small muted", id: "overlay-note" }, "Pick jobs to overlay their curves.");
  const diffNote = h("p", { class: "small muted", id: "overlay-diff-note" });
  let syncing = false;
  const sync = (other) => (min, max) => { if (syncing) return; syncing = true; try { other().setX(min, max); } finally { syncing = false; } };
  const overlay = new OverlayPlot(plotEl, { height: 280, onScale: sync(() => diff) });
  const diff = new OverlayPlot(diffEl, { height: 160, onScale: sync(() => overlay) });
  const picker = new JobPicker(preselected, () => draw());
  const cache = new Map(); // "id|metric" -> {at, items}
  let defs = null;
  let seq = 0;

  const metricSel = h("select", { id: "overlay-metric", "aria-label": "metric", onchange: () => { state.metric = metricSel.value; controls(); draw(); } });
  const logBox = h("input", { type: "checkbox", id: "overlay-log", checked: state.log, onchange: () => { state.log = logBox.checked; draw(); } });
  const smoothing = h("input", { type: "range", id: "overlay-smoothing", min: "0", max: "0.99", step: "0.01", value: String(state.smooth),
    oninput: () => { state.smooth = Number(smoothing.value); smoothValue.textContent = smoothing.value; draw(); } });
  const smoothValue = h("span", { class: "mono" }, String(state.smooth));
  const groupBox = h("input", { type: "checkbox", id: "overlay-group", checked: state.group, onchange: () => { state.group = groupBox.checked; draw(); } });
  const xSel = h("select", { id: "overlay-x", "aria-label": "x axis", onchange: () => { state.x = xSel.value; draw(); } },
    h("option", { value: "step" }, "x: step"), h("option", { value: "time" }, "x: elapsed time"));
  xSel.value = state.x;
  const baseSel = h("select", { id: "overlay-baseline", "aria-label": "baseline", onchange: () => { state.baseline = baseSel.value; draw(); } });

  const card = h("div", { class: "card" }, h("h2", {}, "Overlay runs"),
    h("div", { class: "toolbar" }, metricSel, xSel, h("label", {}, logBox, " log"),
      h("label", {}, "smoothing ", smoothing, " ", smoothValue), h("label", { title: "Runs whose specs differ only by seed: their mean, and a band from their min to their max" }, groupBox, " group by seed")),
    note, plotEl,
    h("div", { class: "row" }, h("h3", { class: "small" }, "Difference to the baseline"), h("label", { class: "small" }, "baseline ", baseSel)),
    diffNote, diffEl);
  const pickerCard = h("div", { class: "card" }, h("h2", {}, "Jobs"), picker.el);

  /** Enable the controls the metric has (as its chart on the job page). */
  function controls() {
    const def = defs.all.find((d) => d.value === state.metric) || defs.all[0];
    state.metric = def.value;
    metricSel.value = def.value;
    logBox.disabled = def.log !== "toggle";
    smoothing.disabled = !def.smooth;
    return def;
  }

  /** A job's points of one metric. A finished job's are read once; an unfinished one's
   * again after FRESH_MS, so a redraw shows the steps it trained since. */
  async function series(job, def) {
    const key = `${job.id}|${def.value}`;
    const hit = cache.get(key);
    if (!hit || (!FINISHED.has(job.status) && performance.now() - hit.at > FRESH_MS)) {
      const max = Math.min(MAX_POINTS, Math.max(200, Math.round((plotEl.clientWidth || 800) * POINTS_PER_PIXEL)));
      const path = `/jobs/${encodeURIComponent(job.id)}/${def.evals ? "evals" : "metrics"}`;
      const params = def.evals ? { max_points: max } : { max_points: max, fields: `${def.field},time` };
      cache.set(key, { at: performance.now(), items: api(path, { params }).then((p) => p.items).catch((e) => { cache.delete(key); throw e; }) });
    }
    return cache.get(key).items;
  }

  async function draw() {
    if (!defs) return;
    const mine = ++seq;
    const def = controls();
    const jobs = picker.picked();
    // The baseline: the chosen run while it is picked, else the first fp32 one (or the first).
    const chosen = jobs.findIndex((j) => j.id === state.baseline);
    const baseRun = chosen === -1 ? baselineIndex(jobs) : chosen;
    baseSel.replaceChildren(...jobs.map((j) => h("option", { value: j.id }, j.name)));
    if (jobs.length) baseSel.value = jobs[baseRun].id;
    baseSel.disabled = jobs.length < 2;
    writeState({ jobs: jobs.map((j) => j.id).join(","), baseline: chosen === -1 ? null : state.baseline, metric: def.value, smooth: state.smooth === SMOOTHING ? null : state.smooth,
      log: state.log ? 1 : null, group: state.group ? 1 : null, x: state.x === "step" ? null : state.x });
    const answers = await Promise.all(jobs.map((j) => series(j, def)));
    if (mine !== seq) return; // a newer choice is being drawn
    const weight = def.smooth ? state.smooth : 0;
    const runs = jobs.map((job, i) => ({ job, line: linePoints(answers[i], def.field, { evals: def.evals, weight, origin: state.x === "time" ? origin(job, answers[i]) : null }) }));
    const { lines, groups } = state.group ? grouped(runs) : single(runs);
    const log = def.log === "log2" ? 2 : def.log === "toggle" && state.log ? 10 : 0;
    const xLabel = state.x === "time" ? "seconds" : "step";
    const what = def.field.replaceAll("_", " ");
    // By step, the x axis spans the longest run (a lone evaluation at its end is not drawn
    // at the middle of an axis twice its length).
    const xMax = state.x === "step" ? Math.max(0, ...jobs.map((j) => j.max_steps || 0)) || null : null;
    overlay.draw(lines, { kind: def.kind, log, xLabel, xMax, yLabel: axisTitle(def.field, def.unit), bounds: def.bounds, what: `${what} curves` });
    // Run by run (a seed group's runs too), each minus the baseline run.
    const base = runs[baseRun];
    const diffs = runs.filter((_, i) => i !== baseRun).map((r, i) => {
      const [xs, ys] = difference(r.line, base?.line);
      return { ...lineStyle(i + 1), label: `${r.job.name} − ${base.job.name}`, xs, ys };
    });
    diff.draw(diffs, { kind: def.kind === "bytes" ? "bytes" : "", zero: true, xLabel, xMax, yLabel: `Δ ${axisTitle(def.field, def.unit)}` });
    note.textContent = jobs.length ? `${def.title}${weight ? `, smoothed at ${weight}${answers.some((a) => a.some((i) => "bucket_last" in i)) ? " over each bucket's last point" : ""}` : ""}.` : "Nothing picked yet.";
    diffNote.textContent = runs.length > 1 ? `Each run minus ${base.job.name} at the same ${state.x === "time" ? "time" : "step"}.` : "Pick a second run to see its difference to this one.";
    Object.assign(plotEl.dataset, { metric: def.value, field: def.field, series: lines.map((l) => l.label).join(","), jobs: jobs.map((j) => j.id).join(","),
      dash: lines.map((l) => dashName(l.dash)).join("|"), bands: String(lines.filter((l) => l.band).length), groups,
      smoothing: String(weight), log: String(log), x: state.x, points: lines.map((l) => l.xs.length).join(",") });
    Object.assign(diffEl.dataset, { series: diffs.map((l) => l.label).join(","), baseline: base?.job.name || "" });
  }

  picker.load().then(async () => {
    defs = metricDefs(await catalog());
    metricSel.append(h("optgroup", { label: "Training (per step)" }, defs.step.map((d) => h("option", { value: d.value }, d.title))),
      h("optgroup", { label: "Evaluation" }, defs.evals.map((d) => h("option", { value: d.value }, d.title))));
    await draw();
  }).catch((e) => picker.list.replaceChildren(h("span", { class: "error" }, e.message)));

  return { card, pickerCard, destroy: () => { seq++; overlay.close(); diff.close(); } };
}

/** Each run its own line. */
function single(runs) {
  const lines = runs.map((r, i) => ({ label: r.job.name, ...lineStyle(i), xs: r.line[0], ys: r.line[1] }));
  return { lines, groups: runs.map((r) => r.job.name).join(",") };
}

/** One line per seed group, named by what its runs share: a lone run as itself, several as
 * their mean and min-max band. */
function grouped(runs) {
  const groups = seedGroups(runs);
  const labels = groupLabels(groups);
  const lines = groups.map((g, i) => {
    const style = lineStyle(i);
    if (g.length === 1) return { label: labels[i], ...style, xs: g[0].line[0], ys: g[0].line[1] };
    const b = meanBand(g.map((r) => r.line));
    return { label: labels[i], ...style, xs: b.xs, ys: b.mean, band: { min: b.min, max: b.max, count: g.length } };
  });
  return { lines, groups: groups.map((g) => g.map((r) => r.job.name).join("+")).join(",") };
}

/** Where a run's elapsed time starts: its start, else its first point. */
function origin(job, items) {
  if (job.started_at) return Date.parse(job.started_at) / 1000;
  return items.length ? items[0].time : 0;
}

function clampWeight(text) {
  const v = Number(text ?? SMOOTHING);
  return Number.isFinite(v) ? Math.min(0.99, Math.max(0, v)) : SMOOTHING;
}
