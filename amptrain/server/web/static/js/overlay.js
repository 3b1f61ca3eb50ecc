// The compare view's line charts on uPlot: each line its color AND its dash pattern (three
// near-identical runs stay distinguishable where they overlap), an optional min-max band
// (a seed group), and a legend that draws the pattern and reads the values under the cursor.
// The y axis is the job page's (axes.js: DOM labels, unique, the axis sized to them).
import { YLabels, boundedRange, logScale, runRange, yAxis } from "./axes.js";
import { STEP_INCRS } from "./charts.js";
import { fmtBytes, fmtNum, fmtPow2, h } from "./dom.js";
import { exposeScales, newest, titled } from "./legend.js";
import { identicalLines } from "./overlay_data.js";

const uPlot = window.uPlot;
const COLORS = ["#2f6fde", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285"];
// Five patterns beside six colors: 30 lines before a color and a pattern repeat together.
const DASHES = [[], [10, 4], [2, 3], [12, 4, 2, 4], [5, 5]];
const ZERO = "#888";
// Lines of at most this many points (evaluations) mark each point; denser ones do not, as
// circles would hide the dash patterns.
const SPARSE = 12;

/** The color and dash pattern of the i-th line; the first (solid) line is drawn widest, so
 * the dashed ones on top of it leave it visible through their gaps. */
export function lineStyle(i) {
  return { color: COLORS[i % COLORS.length], dash: DASHES[i % DASHES.length], width: i === 0 ? 2.5 : 1.5 };
}

/** A dash pattern as data-* and tooltips say it: "solid" or "10,4". */
export function dashName(dash) {
  return dash.length ? dash.join(",") : "solid";
}

function valueFormat(kind) {
  if (kind === "bytes") return (v) => fmtBytes(v);
  if (kind === "log2") return (v) => fmtPow2(v);
  return (v) => fmtNum(v, 3);
}

/** A chart of `lines` ([{label, color, dash, width, xs, ys, band: {min, max}?}], sharing
 * their xs when banded) in `el`. `kind`: "bytes", "log2" or "" (the y ticks); `log`: 0, 2
 * or 10; `zero`: draw the y = 0 line (a difference panel); `xLabel`: "step" or "seconds";
 * `yLabel`: the y axis' title; `xMax`: the x axis runs from 0 to it (the runs' length);
 * `bounds`: [lo, hi] the y axis stays within (a fraction's 0..1); `what`: what a line is
 * ("loss curves"), for the note naming lines drawn on top of each other. */
export class OverlayPlot {
  constructor(el, { height = 260, syncKey = "overlay", onScale = () => {} } = {}) {
    this.el = el;
    this.height = height;
    this.syncKey = syncKey;
    this.onScale = onScale;
    this.plot = null;
    this.legendEl = h("div", { class: "overlay-legend small" });
    this.sameEl = h("p", { class: "small overlay-same", hidden: true });
    this.plotEl = h("div", { class: "overlay-plot" });
    this.yLabels = new YLabels(this.plotEl);
    el.replaceChildren(this.sameEl, this.plotEl, this.legendEl);
    this.resize = new ResizeObserver(() => {
      const width = this.plotEl.clientWidth;
      if (this.plot && width && width !== this.plot.width) this.plot.setSize({ width, height: this.height });
    });
    this.resize.observe(this.plotEl);
  }

  draw(lines, { kind = "", log = 0, zero = false, xLabel = "step", yLabel = "", xMax = null, bounds = null, what = null } = {}) {
    this.destroy();
    const positive = (ys) => (log ? ys.map((y) => (y > 0 ? y : null)) : ys);
    const tables = [];
    const series = [{ label: xLabel }];
    const bands = [];
    const legendOf = []; // per line: its series index in the plot
    for (const l of lines) {
      const base = { stroke: l.color, width: l.width, dash: l.dash, spanGaps: true, points: { show: l.xs.length <= SPARSE } };
      legendOf.push(series.length);
      series.push({ ...base, label: l.label });
      if (l.band) {
        tables.push([l.xs, positive(l.ys), positive(l.band.min), positive(l.band.max)]);
        const edge = { stroke: `${l.color}66`, width: 1, spanGaps: true, points: { show: false } };
        series.push({ ...edge, label: `${l.label} min` }, { ...edge, label: `${l.label} max` });
        // 30% opaque: at 20% a seed group's band over a white card was barely seen.
        bands.push({ series: [series.length - 1, series.length - 2], fill: `${l.color}4d` });
      } else {
        tables.push([l.xs, positive(l.ys)]);
      }
    }
    const data = tables.length ? uPlot.join(tables) : [[]];
    const readout = valueFormat(kind);
    // What axes.js reads of a job page chart: its definition, whether log, its labels.
    const axis = { def: { bytes: kind === "bytes", log: log === 2 ? 2 : null }, log: Boolean(log), yLabels: this.yLabels };
    const opts = {
      width: this.plotEl.clientWidth || this.el.clientWidth || 800, height: this.height, series, bands,
      legend: { show: false },
      scales: { x: { time: false, ...(xMax ? { range: runRange(() => xMax) } : {}) },
        y: log ? logScale(log) : bounds || zero ? { range: boundedRange(bounds) } : {} },
      axes: [{ ...titled(xLabel === "step" ? "step" : "elapsed time"), ...(xLabel === "step" ? { incrs: STEP_INCRS, space: 60 } : { space: 60, values: (u, vs) => vs.map((v) => `${fmtNum(v, 3)} s`) }) },
        { ...yAxis(axis, this.height - 50), ...(yLabel ? titled(yLabel) : {}) }],
      cursor: { sync: { key: this.syncKey }, drag: { x: true, y: false } },
      hooks: {
        setCursor: [(u) => this.#readout(u, legendOf, readout)],
        setScale: [(u, key) => { if (key === "x") this.onScale(u.scales.x.min, u.scales.x.max); }],
        draw: [(u) => this.yLabels.place(u), exposeScales(this.el), ...(zero ? [(u) => drawZero(u)] : [])],
      },
    };
    this.plot = new uPlot(opts, data, this.plotEl);
    this.#legend(lines);
    this.#readout(this.plot, legendOf, readout);
    this.#same(lines, what);
  }

  /** Lines with the same points lie on top of each other, so only the last drawn is seen:
   * say so ("3 runs have identical loss curves: a, b, c"). */
  #same(lines, what) {
    const groups = what ? identicalLines(lines) : []; // a difference panel names none
    this.sameEl.hidden = !groups.length;
    this.sameEl.textContent = groups.map((g) => `${g.length} runs have identical ${what}: ${g.map((l) => l.label).join(", ")} (drawn on top of each other).`).join(" ");
    this.sameEl.dataset.groups = groups.map((g) => g.map((l) => l.label).join("+")).join(",");
  }

  /** Show steps min..max (the other panel was zoomed); null for everything. */
  setX(min, max) {
    if (!this.plot) return;
    const xs = this.plot.data[0];
    if (min === null) this.plot.setScale("x", { min: xs[0], max: xs[xs.length - 1] });
    else if (this.plot.scales.x.min !== min || this.plot.scales.x.max !== max) this.plot.setScale("x", { min, max });
  }

  #legend(lines) {
    this.values = lines.map(() => h("span", { class: "mono" }, ""));
    this.legendEl.replaceChildren(...lines.map((l, i) => h("span", { class: "overlay-key", dataset: { dash: dashName(l.dash), label: l.label }, title: `${l.label}: ${l.color}, ${dashName(l.dash)}` },
      swatch(l), ` ${l.label}${l.band ? ` (mean of ${l.band.count}, band min–max)` : ""} `, this.values[i])));
  }

  /** The values at the hovered step, or each line's newest value while none is hovered. */
  #readout(u, legendOf, fmt) {
    const idx = u.cursor.idx;
    legendOf.forEach((s, i) => {
      const v = idx === null || idx === undefined ? newest(u.data[s]) : u.data[s][idx];
      this.values[i].textContent = v === null || v === undefined ? "" : fmt(v);
    });
  }

  destroy() {
    this.plot?.destroy();
    this.plot = null;
  }

  /** On unmount: the plot and the size observer. */
  close() {
    this.destroy();
    this.resize.disconnect();
  }
}

/** A short line in the line's color and dash pattern (what the canvas draws). */
function swatch(l) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", "34");
  svg.setAttribute("height", "10");
  const line = document.createElementNS(ns, "line");
  for (const [k, v] of Object.entries({ x1: 1, y1: 5, x2: 33, y2: 5, stroke: l.color, "stroke-width": l.width, "stroke-dasharray": l.dash.join(" ") })) line.setAttribute(k, v);
  svg.append(line);
  return svg;
}

function drawZero(u) {
  const y = u.valToPos(0, "y", true);
  const { left, top, width, height } = u.bbox;
  if (!(y >= top && y <= top + height)) return;
  const ctx = u.ctx;
  ctx.save();
  ctx.setLineDash([]); // not the last line's pattern
  ctx.strokeStyle = ZERO;
  ctx.lineWidth = devicePixelRatio || 1;
  ctx.beginPath();
  ctx.moveTo(left, y);
  ctx.lineTo(left + width, y);
  ctx.stroke();
  ctx.restore();
}
