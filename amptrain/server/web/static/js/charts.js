// A job's charts on uPlot: synced cursor and zoom, log axes, smoothing with the raw line
// still drawn, NaN/Inf and skipped-step marks (marks.js), y axes sized to their labels
// (axes.js), x as step or wall time. Zooming asks the owner (onZoom) to fetch the window
// at full resolution; live updates keep zoom and cursor.
import { YLabels, logScale, yAxis } from "./axes.js";
import { fmtBytes, fmtNum, fmtPow2, fmtTime, h } from "./dom.js";
import { axisTitle, exposeScales, newestWhenIdle, refreshLegend, titled } from "./legend.js";
import { EventMarks, describeMarks, drawMarks } from "./marks.js";
import { drawSpans } from "./segments.js";
import { smoothSeries } from "./series.js";

const uPlot = window.uPlot;
const COLORS = ["#2f6fde", "#d9480f", "#2b8a3e", "#862e9c", "#e67700"];
const HEIGHT = 190;
const TIME_LABEL_HALF = 48; // half of "12:51pm 12/3/26" at 11 px: the first time label is whole
/** Whole-step tick spacings for step axes (uPlot would otherwise tick at 2.5). */
export const STEP_INCRS = [1, 2, 5].flatMap((m) => [1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7].map((p) => m * p)).sort((a, b) => a - b);

/** The chart definitions, from the server's one metric table (`GET /catalog`'s `charts` and
 * `metrics`): each chart draws the metrics whose `chart` is its key. A chart that marks
 * skipped and non-finite steps also needs the `skipped` flag, and the field whose nulls
 * mean non-finite (`watch`): its own grad norm (null by design only when skipped), else
 * the loss (never null by design; the loss scale is null outside fp16). */
export function chartDefs({ charts, metrics }) {
  return charts.map((c) => {
    const mine = metrics.filter((m) => m.chart === c.key);
    const fields = mine.map((m) => m.name);
    const units = [...new Set(mine.map((m) => m.unit).filter(Boolean))];
    const name = c.title.toLowerCase();
    return {
      key: c.key, title: c.title, fields, watch: fields.includes("grad_norm") ? "grad_norm" : "loss",
      extra: c.marks ? ["skipped", "loss"] : [], smooth: c.smooth, marks: c.marks,
      log: c.log === "log2" ? 2 : c.log, empty: c.empty,
      bytes: mine.length > 0 && mine.every((m) => m.unit === "bytes"),
      // The y axis' title: the chart's name and its metrics' unit, unless the name is the unit.
      yTitle: units.length === 1 && units[0] !== name ? axisTitle(name, units[0]) : name,
    };
  });
}

/** The charts of one page, sharing cursor, zoom, x mode and smoothing. */
export class ChartGroup {
  constructor(syncKey, { onZoom, onView = () => {} }) {
    this.syncKey = syncKey;
    this.onZoom = onZoom;
    this.onView = onView; // the view (x mode, smoothing, zoom, log axes) changed: e.g. into the URL
    this.logKeys = new Set(); // charts with a log toggle that are on log now
    this.charts = [];
    this.xMode = "step";
    this.smoothing = 0.8;
    this.zoom = null; // {min, max} in x units, null when showing everything
    this.events = []; // [{step, type, text}] marked on every chart (the timeline's)
    this.propagating = false;
    this.pending = false;
    this.zoomTimer = null;
    this.spans = []; // the job's precisions over its steps (segments.js)
    this.precision = null; // the job's precision: named by an empty chart's note
  }

  /** The job's (effective) precision, for the note of a chart it records nothing for. */
  setPrecision(precision) {
    if (precision === this.precision) return;
    this.precision = precision;
    for (const c of this.charts) c.describe();
  }

  /** Mark the steps of each precision (after a fallback) on every chart. */
  setSpans(spans) {
    const key = JSON.stringify(spans);
    if (key === JSON.stringify(this.spans)) return;
    this.spans = spans;
    this.refresh();
  }

  add(def, series) {
    const chart = new Chart(def, series, this);
    this.charts.push(chart);
    return chart;
  }

  /** Redraw every chart with its current data on the next frame (batched live updates). */
  refresh() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      for (const c of this.charts) c.update();
    });
  }

  rebuild() {
    for (const c of this.charts) c.build();
  }

  setXMode(mode) {
    this.xMode = mode;
    this.zoom = null;
    this.rebuild();
    this.onView();
  }

  setSmoothing(weight) {
    this.smoothing = weight;
    this.rebuild();
    this.onView();
  }

  /** The view as URL parameters: ``x``, ``smooth``, ``from``/``to`` (the zoom, in x units)
   * and ``log`` (the chart keys on a log axis); defaults left out. */
  viewState() {
    return {
      x: this.xMode === "step" ? null : this.xMode,
      smooth: this.smoothing === 0.8 ? null : this.smoothing,
      from: this.zoom ? +this.zoom.min.toPrecision(12) : null,
      to: this.zoom ? +this.zoom.max.toPrecision(12) : null,
      log: [...this.logKeys].sort().join(",") || null,
    };
  }

  /** Take a view from URL parameters (before the charts are built); bad values are ignored. */
  applyView(params) {
    if (params.get("x") === "time") this.xMode = "time";
    const smooth = Number(params.get("smooth"));
    if (params.has("smooth") && smooth >= 0 && smooth <= 0.99) this.smoothing = smooth;
    const [min, max] = [Number(params.get("from")), Number(params.get("to"))];
    if (params.has("from") && params.has("to") && Number.isFinite(min) && Number.isFinite(max) && min < max) this.zoom = { min, max };
    for (const key of (params.get("log") || "").split(",")) if (key) this.logKeys.add(key);
  }

  setLog(chart, on) {
    if (on) this.logKeys.add(chart.def.key);
    else this.logKeys.delete(chart.def.key);
    chart.log = on;
    chart.build();
    this.onView();
  }

  /** Mark these events on every chart. */
  setEvents(events) {
    this.events = events;
    for (const c of this.charts) c.plot?.redraw(false);
  }

  resetZoom() {
    this.zoom = null;
    for (const c of this.charts) c.update(true);
    this.onView();
  }

  /** A chart's x scale changed (drag to zoom, double click to reset): apply to the others. */
  scaleChanged(source, min, max) {
    if (this.propagating || source.updating) return;
    const [lo, hi] = source.dataRange();
    this.zoom = min > lo || max < hi ? { min, max } : null;
    this.propagating = true;
    try {
      for (const c of this.charts) if (c !== source && c.plot) c.plot.setScale("x", { min, max });
    } finally {
      this.propagating = false;
    }
    clearTimeout(this.zoomTimer);
    if (this.zoom) this.zoomTimer = setTimeout(() => this.onZoom(this.zoom, source), 150);
    this.onView();
  }

  destroy() {
    clearTimeout(this.zoomTimer);
    for (const c of this.charts) c.destroy();
  }
}

class Chart {
  constructor(def, series, group) {
    this.def = def;
    this.series = series;
    this.group = group;
    this.log = def.log === 2 || (def.log === "toggle" && group.logKeys.has(def.key));
    this.plot = null;
    this.updating = false;
    this.plotEl = h("div", { class: "plot" });
    this.yLabels = new YLabels(this.plotEl);
    this.eventMarks = new EventMarks(this.plotEl);
    this.yTicks = [];
    this.marksEl = h("div", { class: "marks", dataset: { marksFor: def.key } });
    this.noteEl = h("p", { class: "muted small empty-note", hidden: true });
    const logBox = def.log === "toggle"
      ? h("label", { class: "small muted" }, h("input", { type: "checkbox", checked: this.log, onchange: (e) => group.setLog(this, e.target.checked) }), " log")
      : def.log === 2 ? h("span", { class: "small muted" }, "log2") : null;
    this.smoothNote = def.smooth ? h("span", { class: "small muted smooth-note" }) : null;
    this.el = h("section", { class: "chart", dataset: { chart: def.key, points: "0", marks: "0" } },
      h("header", {}, h("strong", {}, def.title), this.smoothNote, logBox), this.noteEl, this.plotEl, this.marksEl);
    this.resize = new ResizeObserver(() => {
      if (this.plot && this.plotEl.clientWidth && this.plotEl.clientWidth !== this.plot.width) {
        this.plot.setSize({ width: this.plotEl.clientWidth, height: HEIGHT });
      }
    });
    this.resize.observe(this.plotEl);
  }

  get width() { return this.plotEl.clientWidth || 600; }

  /** The x values of the data, in the group's x mode. */
  xs() { return this.group.xMode === "time" ? this.series.time : this.series.step; }

  stepToX(step) { return this.group.xMode === "time" ? this.series.stepToTime(step) : step; }

  dataRange() {
    const xs = this.xs();
    return xs.length ? [xs[0], xs[xs.length - 1]] : [0, 0];
  }

  data() {
    const s = this.series;
    const cols = [this.xs()];
    const positive = (ys) => (this.log ? ys.map((y) => (y > 0 ? y : null)) : ys);
    for (const f of this.def.fields) {
      cols.push(positive(s.cols[f]));
      if (this.smoothed()) cols.push(positive(smoothSeries(s, f, this.group.smoothing)));
    }
    return cols;
  }

  smoothed() { return Boolean(this.def.smooth) && this.group.smoothing > 0; }

  build() {
    if (this.plot) this.plot.destroy();
    const time = this.group.xMode === "time";
    // Off the plot, the legend reads each line's newest value (legend.js).
    const value = newestWhenIdle(this.def.bytes ? fmtBytes : this.def.log === 2 ? fmtPow2 : (v) => fmtNum(v));
    const series = [{ label: time ? "time" : "step", value: newestWhenIdle(time ? fmtTime : String) }];
    // A point between gaps (one finite step before a run diverged) has no line: draw it.
    const points = { show: false, filter: isolated };
    this.def.fields.forEach((f, i) => {
      const color = COLORS[i % COLORS.length];
      const raw = { label: this.def.fields.length > 1 ? f.replace("memory_", "") : f, stroke: color, width: 1, value, points: { ...points, fill: color } };
      if (this.smoothed()) {
        series.push({ ...raw, label: `${raw.label} (raw)`, stroke: `${color}55` });
        series.push({ ...raw, label: `${raw.label} (smoothed)`, width: 1.5 });
      } else {
        series.push(raw);
      }
    });
    const opts = {
      width: this.width, height: HEIGHT, series, legend: { live: true },
      scales: { x: { time }, y: this.log ? logScale(this.def.log === 2 ? 2 : 10) : {} },
      axes: [{ ...titled(time ? "wall time" : "step"), ...(time ? { space: 60 } : { space: 60, incrs: STEP_INCRS }) },
        { ...yAxis(this, HEIGHT - 50, time ? TIME_LABEL_HALF : 0), ...titled(this.def.yTitle) }],
      cursor: { sync: { key: this.group.syncKey }, drag: { x: true, y: false } },
      hooks: {
        setScale: [(u, key) => { if (key === "x") { this.group.scaleChanged(this, u.scales.x.min, u.scales.x.max); this.describe(); } }],
        drawClear: [(u) => { this.el.dataset.spanLabels = drawSpans(u, this.group.spans, (step) => this.stepToX(step)).join(" "); }],
        draw: [exposeScales(this.el), (u) => {
          this.yLabels.place(u);
          drawMarks(this, u);
          this.eventMarks.place(u, this.group.events, (step) => this.stepToX(step));
        }],
      },
    };
    this.updating = true;
    try {
      this.plot = new uPlot(opts, this.data(), this.plotEl);
      const z = this.group.zoom;
      if (z) this.plot.setScale("x", z);
    } finally {
      this.updating = false;
    }
    this.describe();
  }

  /** New data; keeps the zoom while zoomed (`reset` forces the full range). */
  update(reset = false) {
    if (!this.plot) return this.build();
    this.updating = true;
    try {
      const keep = this.group.zoom && !reset;
      this.plot.setData(this.data(), !keep);
      if (keep) this.plot.setScale("x", this.group.zoom);
      refreshLegend(this.plot);
    } finally {
      this.updating = false;
    }
    this.describe();
  }

  /** The steps in view while zoomed ([lo, hi]), else null. */
  view() {
    const z = this.group.zoom;
    if (!z) return null;
    if (this.group.xMode !== "time") return [z.min, z.max];
    const s = this.series;
    const inside = s.step.filter((_, i) => s.time[i] >= z.min && s.time[i] <= z.max);
    return inside.length ? [inside[0], inside[inside.length - 1]] : [1, 0];
  }

  /** The counts and smoothing in words, and data-* for tests and tooling. */
  describe() {
    this.el.dataset.points = String(this.series.length);
    this.el.dataset.precisions = this.group.spans.map((s) => `${s.precision}@${s.from}`).join(" ");
    if (this.smoothNote) {
      const every = this.series.bucketSpacing();
      this.smoothNote.textContent = this.smoothed() ? (every > 1 ? `smoothed over 1 point per ${every} steps` : "smoothed over every step") : "";
      this.smoothNote.title = every > 1 ? "The history is downsampled: the smoothed line reads each bucket's last point, not its kept minimum and maximum. Zoom in to smooth over every step." : "";
    }
    // A chart with nothing to draw is a one-line note, not an empty plot: the catalog's
    // reason after the job's precision ("fp32 needs no loss scaling: ..."), else what is missing.
    const empty = this.def.fields.every((f) => this.series.cols[f].every((v) => v === null));
    const note = !empty ? "" : this.series.length === 0 ? "No steps recorded yet."
      : this.def.empty ? `${this.group.precision || "This precision"} ${this.def.empty}` : `No ${this.def.title.toLowerCase()} recorded in this run.`;
    this.noteEl.textContent = note;
    this.noteEl.hidden = !empty;
    this.plotEl.hidden = empty;
    this.el.classList.toggle("empty", empty);
    this.el.dataset.empty = empty ? "1" : "0";
    if (empty) {
      this.marksEl.replaceChildren();
      return;
    }
    if (this.def.marks) describeMarks(this, this.view());
  }

  destroy() {
    this.resize.disconnect();
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }
}

/** uPlot points filter: the indices of non-null values with no neighbour to draw a line to. */
function isolated(u, si) {
  const ys = u.data[si];
  const out = [];
  for (let i = 0; i < ys.length; i++) {
    if (ys[i] != null && (i === 0 || ys[i - 1] == null) && (i === ys.length - 1 || ys[i + 1] == null)) out.push(i);
  }
  return out.length ? out : null;
}
