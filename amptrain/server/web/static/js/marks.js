// Skipped and non-finite steps on a chart: a triangle and a faint line per kept step, a
// strip per server bucket that holds some, and under the chart their counts in words with
// the steps in view (a zoomed chart lists the marks it shows, not the run's first five).
import { h } from "./dom.js";

const NONFINITE = "#c53030";
const SKIPPED = "#dd8a00";
const LISTED = 5;

/** Steps flagged on `chart` (non-finite in its watched field, or skipped), as
 * [index, {nonFinite, skipped}] into its series. A series that never holds a number (a
 * run that does not report grad norms) has nothing non-finite, only nothing reported. */
export function flagged(chart) {
  if (!chart.def.marks) return [];
  const out = [];
  const watched = chart.series.cols[chart.def.watch];
  const reported = chart.def.watch === "loss" || Boolean(watched?.some((v) => v !== null));
  for (let i = 0; i < chart.series.length; i++) {
    const f = chart.series.flagsAt(i, chart.def.watch);
    if (!reported) f.nonFinite = false;
    if (f.nonFinite || f.skipped) out.push([i, f]);
  }
  return out;
}

export function drawMarks(chart, u) {
  if (!chart.def.marks) return;
  const ctx = u.ctx;
  const { left, top, width, height } = u.bbox;
  const xs = chart.xs();
  const px = devicePixelRatio || 1;
  ctx.save();
  for (const [i, f] of flagged(chart)) {
    const x = u.valToPos(xs[i], "x", true);
    if (!(x >= left && x <= left + width)) continue;
    ctx.fillStyle = f.nonFinite ? NONFINITE : SKIPPED;
    ctx.globalAlpha = 0.25;
    ctx.fillRect(x - px / 2, top, px, height);
    ctx.globalAlpha = 1;
    ctx.beginPath();
    ctx.moveTo(x - 5 * px, top);
    ctx.lineTo(x + 5 * px, top);
    ctx.lineTo(x, top + 8 * px);
    ctx.fill();
  }
  for (const b of chart.series.buckets) {
    const [x0, x1] = [b.from_step, b.to_step].map((s) => u.valToPos(chart.group.xMode === "time" ? chart.series.stepToTime(s) : s, "x", true));
    ctx.fillStyle = b.non_finite ? NONFINITE : SKIPPED;
    ctx.globalAlpha = 0.5;
    ctx.fillRect(Math.max(left, x0), top, Math.max(2 * px, Math.min(left + width, x1) - Math.max(left, x0)), 3 * px);
  }
  ctx.restore();
}

/** The mark counts in words under the chart, with the steps in `view` ([lo, hi] steps, or
 * null for all), and data-* for tests and tooling. */
export function describeMarks(chart, view) {
  const { el, marksEl, series, def } = chart;
  const flags = flagged(chart);
  const nonFinite = flags.filter(([, f]) => f.nonFinite).map(([i]) => series.step[i]);
  const skipped = flags.filter(([, f]) => f.skipped).map(([i]) => series.step[i]);
  // Server marks count every flagged step of a bucket, kept or not; add the kept ones
  // outside any bucket (live points, full-resolution windows). They count non-finite
  // losses, so only the charts watching the loss add them.
  const buckets = series.buckets;
  const outside = (steps) => steps.filter((s) => !buckets.some((b) => s >= b.from_step && s <= b.to_step)).length;
  const lossBuckets = def.watch === "loss" ? buckets.reduce((a, b) => a + b.non_finite, 0) : 0;
  const nfTotal = def.watch === "loss" ? outside(nonFinite) + lossBuckets : nonFinite.length;
  const skTotal = outside(skipped) + buckets.reduce((a, b) => a + b.skipped, 0);
  el.dataset.marks = String(flags.length);
  el.dataset.nonFinite = String(nfTotal);
  el.dataset.skipped = String(skTotal);
  const parts = [];
  if (nfTotal && def.key === def.watch) {
    const what = def.watch === "loss" ? "NaN/Inf loss" : `non-finite ${def.watch.replaceAll("_", " ")}`;
    const from = nonFinite.length ? ` from step ${nonFinite[0]}` : "";
    parts.push(h("span", { class: "nonfinite" }, `▼ ${nfTotal} ${what} step${nfTotal === 1 ? "" : "s"}${def.watch === "loss" ? "" : from}${inView(nonFinite, view)} `));
  }
  if (skTotal) parts.push(h("span", { class: "skip" }, `▼ ${skTotal} skipped step${skTotal === 1 ? "" : "s"}${inView(skipped, view)}`));
  marksEl.replaceChildren(...parts);
  marksEl.dataset.listed = [...nonFinite, ...skipped].filter((s) => !view || (s >= view[0] && s <= view[1])).join(",");
}

/** " (step a, b, …)" for the steps in view; while zoomed, says how many are in view. */
function inView(steps, view) {
  const shown = view ? steps.filter((s) => s >= view[0] && s <= view[1]) : steps;
  if (!shown.length) return view && steps.length ? " (none in view)" : "";
  const list = shown.length > LISTED ? `${shown.slice(0, LISTED).join(", ")}, …` : shown.join(", ");
  return view ? ` (${shown.length} in view: step ${list})` : ` (step ${list})`;
}

/** The timeline's course-changing events (warnings, resumes, micro-batch changes…) as
 * dashed lines over one chart's plot, each with a hover glyph naming the event. */
export class EventMarks {
  constructor(plotEl) {
    this.el = h("div", { class: "event-marks" });
    plotEl.append(this.el);
  }

  /** Draw hook: `events` [{step, type, text}] at their x (`toX` maps a step to an x value). */
  place(u, events, toX) {
    const over = u.over;
    const shown = [];
    for (const ev of events) {
      const x = u.valToPos(toX(ev.step), "x");
      if (!(x >= 0 && x <= over.offsetWidth)) continue;
      shown.push(h("span", { class: `event-mark ${ev.type}`, dataset: { type: ev.type, step: String(ev.step) },
        style: `left:${over.offsetLeft + x}px;top:${over.offsetTop}px;height:${over.offsetHeight}px` },
      h("i", { title: `step ${ev.step}: ${ev.text}` }, "◆")));
    }
    this.el.replaceChildren(...shown);
  }
}
