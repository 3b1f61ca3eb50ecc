// A job's charts on uPlot: synced cursor and zoom, log axes, smoothing with the raw line
// still drawn, NaN/Inf and skipped-step marks, x as step or wall time. Zooming asks the
// owner (onZoom) to fetch the window at full resolution; live updates keep zoom and cursor.
import { fmtBytes, fmtNum, fmtPow2, fmtTime, h } from "./dom.js";
import { drawSpans } from "./segments.js";
import { smooth } from "./series.js";

const uPlot = window.uPlot;
const COLORS = ["#2f6fde", "#d9480f", "#2b8a3e", "#862e9c", "#e67700"];
const NONFINITE = "#c53030";
const SKIPPED = "#dd8a00";
const HEIGHT = 190;
/** Whole-step tick spacings for step axes (uPlot would otherwise tick at 2.5). */
export const STEP_INCRS = [1, 2, 5].flatMap((m) => [1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7].map((p) => m * p)).sort((a, b) => a - b);

/** The chart definitions, from the server's one metric table (`GET /catalog`'s `charts` and
 * `metrics`): each chart draws the metrics whose `chart` is its key. A chart that marks
 * skipped and non-finite steps also needs the `skipped` flag. */
export function chartDefs({ charts, metrics }) {
  return charts.map((c) => {
    const mine = metrics.filter((m) => m.chart === c.key);
    return {
      key: c.key, title: c.title, fields: mine.map((m) => m.name),
      extra: c.marks ? ["skipped"] : [], smooth: c.smooth, marks: c.marks,
      log: c.log === "log2" ? 2 : c.log, empty: c.empty,
      bytes: mine.length > 0 && mine.every((m) => m.unit === "bytes"),
    };
  });
}

/** The charts of one page, sharing cursor, zoom, x mode and smoothing. */
export class ChartGroup {
  constructor(syncKey, { onZoom }) {
    this.syncKey = syncKey;
    this.onZoom = onZoom;
    this.charts = [];
    this.xMode = "step";
    this.smoothing = 0.8;
    this.zoom = null; // {min, max} in x units, null when showing everything
    this.propagating = false;
    this.pending = false;
    this.zoomTimer = null;
    this.spans = []; // the job's precisions over its steps (segments.js)
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
  }

  setSmoothing(weight) {
    this.smoothing = weight;
    this.rebuild();
  }

  resetZoom() {
    this.zoom = null;
    for (const c of this.charts) c.update(true);
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
    this.log = def.log === 2;
    this.plot = null;
    this.updating = false;
    this.plotEl = h("div", { class: "plot" });
    this.marksEl = h("div", { class: "marks", dataset: { marksFor: def.key } });
    const logBox = def.log === "toggle"
      ? h("label", { class: "small muted" }, h("input", { type: "checkbox", onchange: (e) => { this.log = e.target.checked; this.build(); } }), " log")
      : def.log === 2 ? h("span", { class: "small muted" }, "log2") : null;
    this.el = h("section", { class: "chart", dataset: { chart: def.key, points: "0", marks: "0" } },
      h("header", {}, h("strong", {}, def.title), logBox), this.plotEl, this.marksEl);
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
      if (this.smoothed()) cols.push(positive(smooth(s.cols[f], this.group.smoothing)));
    }
    return cols;
  }

  tick(v) {
    if (this.def.bytes) return fmtBytes(v);
    if (this.def.log === 2) return fmtPow2(v);
    return fmtNum(v, 3);
  }

  smoothed() { return Boolean(this.def.smooth) && this.group.smoothing > 0; }

  build() {
    if (this.plot) this.plot.destroy();
    const time = this.group.xMode === "time";
    const value = this.def.bytes ? (u, v) => fmtBytes(v) : this.def.log === 2 ? (u, v) => fmtPow2(v) : (u, v) => fmtNum(v);
    const series = [{ label: time ? "time" : "step", value: time ? (u, v) => (v == null ? "–" : fmtTime(v)) : (u, v) => v ?? "–" }];
    this.def.fields.forEach((f, i) => {
      const color = COLORS[i % COLORS.length];
      const raw = { label: this.def.fields.length > 1 ? f.replace("memory_", "") : f, stroke: color, width: 1, value, points: { show: false } };
      if (this.smoothed()) {
        series.push({ ...raw, label: `${raw.label} (raw)`, stroke: `${color}55` });
        series.push({ ...raw, label: `${raw.label} (smoothed)`, width: 1.5 });
      } else {
        series.push(raw);
      }
    });
    const y = this.log ? { distr: 3, log: this.def.log === 2 ? 2 : 10 } : {};
    const opts = {
      width: this.width, height: HEIGHT, series, legend: { live: true },
      scales: { x: { time }, y },
      axes: [time ? { space: 60 } : { space: 60, incrs: STEP_INCRS }, { size: 64, values: (u, vals) => vals.map((v) => this.tick(v)) }],
      cursor: { sync: { key: this.group.syncKey }, drag: { x: true, y: false } },
      hooks: {
        setScale: [(u, key) => { if (key === "x") this.group.scaleChanged(this, u.scales.x.min, u.scales.x.max); }],
        drawClear: [(u) => drawSpans(u, this.group.spans, (step) => this.stepToX(step))],
        draw: [(u) => this.drawMarks(u)],
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
    } finally {
      this.updating = false;
    }
    this.describe();
  }

  /** Steps flagged non-finite or skipped, as indices into the series. */
  flagged() {
    if (!this.def.marks) return [];
    const out = [];
    for (let i = 0; i < this.series.length; i++) {
      const f = this.series.flagsAt(i);
      if (f.nonFinite || f.skipped) out.push([i, f]);
    }
    return out;
  }

  drawMarks(u) {
    if (!this.def.marks) return;
    const ctx = u.ctx;
    const { left, top, width } = u.bbox;
    const xs = this.xs();
    const px = devicePixelRatio || 1;
    ctx.save();
    for (const [i, f] of this.flagged()) {
      const x = u.valToPos(xs[i], "x", true);
      if (!(x >= left && x <= left + width)) continue;
      ctx.fillStyle = f.nonFinite ? NONFINITE : SKIPPED;
      ctx.globalAlpha = 0.25;
      ctx.fillRect(x - px / 2, top, px, u.bbox.height);
      ctx.globalAlpha = 1;
      ctx.beginPath();
      ctx.moveTo(x - 5 * px, top);
      ctx.lineTo(x + 5 * px, top);
      ctx.lineTo(x, top + 8 * px);
      ctx.fill();
    }
    for (const b of this.series.buckets) {
      const [x0, x1] = [b.from_step, b.to_step].map((s) => u.valToPos(this.group.xMode === "time" ? this.series.stepToTime(s) : s, "x", true));
      ctx.fillStyle = b.non_finite ? NONFINITE : SKIPPED;
      ctx.globalAlpha = 0.5;
      ctx.fillRect(Math.max(left, x0), top, Math.max(2 * px, Math.min(left + width, x1) - Math.max(left, x0)), 3 * px);
    }
    ctx.restore();
  }

  /** The mark counts in words under the chart, and data-* for tests and tooling. */
  describe() {
    this.el.dataset.points = String(this.series.length);
    this.el.dataset.precisions = this.group.spans.map((s) => `${s.precision}@${s.from}`).join(" ");
    const empty = this.series.length > 0 && this.def.fields.every((f) => this.series.cols[f].every((v) => v === null));
    if (empty && this.def.empty) {
      this.marksEl.replaceChildren(h("span", { class: "muted" }, this.def.empty));
      return;
    }
    if (!this.def.marks) return;
    const flagged = this.flagged();
    const nonFinite = flagged.filter(([, f]) => f.nonFinite).map(([i]) => this.series.step[i]);
    const skipped = flagged.filter(([, f]) => f.skipped).map(([i]) => this.series.step[i]);
    // Server marks count every flagged step of a bucket, kept or not; add the kept ones
    // outside any bucket (live points, full-resolution windows).
    const buckets = this.series.buckets;
    const outside = (steps) => steps.filter((s) => !buckets.some((b) => s >= b.from_step && s <= b.to_step)).length;
    const nfTotal = outside(nonFinite) + buckets.reduce((a, b) => a + b.non_finite, 0);
    const skTotal = outside(skipped) + buckets.reduce((a, b) => a + b.skipped, 0);
    this.el.dataset.marks = String(flagged.length);
    this.el.dataset.nonFinite = String(nfTotal);
    this.el.dataset.skipped = String(skTotal);
    const list = (steps) => (steps.length > 5 ? `${steps.slice(0, 5).join(", ")}, …` : steps.join(", "));
    const parts = [];
    if (this.def.key === "loss" && nfTotal) {
      parts.push(h("span", { class: "nonfinite" }, `▼ ${nfTotal} NaN/Inf loss step${nfTotal === 1 ? "" : "s"}${nonFinite.length ? ` (step ${list(nonFinite)})` : ""} `));
    }
    if (skTotal) {
      parts.push(h("span", { class: "skip" }, `▼ ${skTotal} skipped step${skTotal === 1 ? "" : "s"}${skipped.length ? ` (step ${list(skipped)})` : ""}`));
    }
    this.marksEl.replaceChildren(...parts);
  }

  destroy() {
    this.resize.disconnect();
    if (this.plot) this.plot.destroy();
    this.plot = null;
  }
}
