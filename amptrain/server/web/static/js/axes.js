// A chart's y axis: which ticks fit the height, labels precise enough that no two read the
// same, and the labels themselves as DOM elements beside the plot, so the axis is as wide
// as its widest label (measured, not guessed) and what a person reads is in the DOM.

/** Vertical room one label needs (11 px text and room between): the tick count follows the height. */
const LABEL_PX = 24;
const GAP_PX = 6; // between a label and the plot
const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
const STRIDES = [1, 2, 3, 4, 5, 10, 20, 50, 100]; // powers between labelled ones, plus one

/** Tick values for [min, max]: `log` is null, 10 or 2; `px` the plot's height. */
export function ticks(min, max, { log = null, bytes = false, px = 150 } = {}) {
  if (!(Number.isFinite(min) && Number.isFinite(max))) return [];
  const most = Math.max(2, Math.floor(px / LABEL_PX));
  if (log && min > 0) return logTicks(min, max, log, most);
  const unit = bytes ? 1024 ** byteUnit(Math.max(Math.abs(min), Math.abs(max))) : 1;
  return linearTicks(min / unit, max / unit, most).map((v) => v * unit);
}

function linearTicks(min, max, most) {
  if (!(max > min)) return [min];
  const incr = niceAtLeast((max - min) / most);
  const out = [];
  for (let k = Math.ceil(min / incr - 1e-9); k * incr <= max + incr * 1e-9; k++) out.push(clean(k * incr));
  return out;
}

/** Powers of the base, every n-th when they do not fit; across few powers (base 10) also
 * 2x and 5x (or 3x) where they fit, and linear ticks when even those are too few. */
function logTicks(min, max, base, most) {
  const lg = (v) => Math.log(v) / Math.log(base);
  const e0 = Math.ceil(lg(min) - 1e-9);
  const e1 = Math.floor(lg(max) + 1e-9);
  const n = e1 - e0 + 1;
  if (n >= 3 || (n === 2 && base === 2)) {
    const stride = STRIDES.find((k) => Math.ceil(n / k) <= most) ?? Math.ceil(n / most);
    const out = [];
    // Counted down from the highest power, so the top of the data (a loss scale's 2^16) is named.
    for (let e = e1 - Math.floor((e1 - e0) / stride) * stride; e <= e1; e += stride) out.push(base === 2 ? 2 ** e : clean(10 ** e)); // 2^e is exact
    if (out.length >= 2) return out;
  }
  if (base === 10) {
    for (const mantissas of [[1, 2, 5], [1, 3], [1]]) {
      const out = [];
      for (let e = e0 - 1; e <= e1; e++) for (const m of mantissas) { const v = clean(m * 10 ** e); if (v >= min && v <= max) out.push(v); }
      if (out.length >= 2 && out.length <= most) return out;
    }
  }
  return linearTicks(min, max, Math.min(most, 4)).filter((v) => v > 0);
}

/** The smallest 1, 2 or 5 times a power of ten that is at least x. */
function niceAtLeast(x) {
  const p = 10 ** Math.floor(Math.log10(x));
  for (const m of [1, 2, 5, 10]) if (m * p >= x * (1 - 1e-9)) return m * p;
  return 10 * p;
}

const clean = (v) => Number(v.toPrecision(12)); // 0.1 * 3 reads 0.3, not 0.30000000000000004

function byteUnit(v) {
  let i = 0;
  while (v >= 1024 && i < UNITS.length - 1) { v /= 1024; i++; }
  return i;
}

/** Labels for tick values, in the fewest significant digits that tell them apart (a flat
 * series' ticks 99999990, 1e8, 100000010 once all read "1.00e+8"). Bytes share one unit. */
export function labels(values, { bytes = false, pow2 = false } = {}) {
  if (pow2 && values.every((v) => v > 0 && Number.isInteger(Math.log2(v)))) return values.map((v) => `2^${Math.log2(v)}`);
  const unit = bytes ? byteUnit(Math.max(...values.map(Math.abs))) : 0;
  const scaled = values.map((v) => v / 1024 ** unit);
  for (let digits = 1; digits <= 17; digits++) {
    const out = scaled.map((v) => number(v, digits) + (bytes ? ` ${UNITS[unit]}` : ""));
    if (new Set(out).size === out.length && scaled.every((v, i) => close(v, Number(out[i].split(" ")[0]), digits))) return out;
  }
  return scaled.map((v) => String(v));
}

function number(v, digits) {
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(digits - 1).replace(/\.?0+e/, "e");
  return String(Number(v.toPrecision(digits)));
}

/** Whether a label keeps the value to its own digits (so 1.5 never reads "2"). */
function close(v, shown, digits) {
  return Math.abs(v - shown) <= Math.abs(v) * 10 ** -Math.max(digits, 3) * 5 + Number.EPSILON;
}

/** uPlot options for `chart`'s y axis: ticks chosen for the plot's height (`fallbackPx`
 * before uPlot knows it), labels measured (YLabels) to size the axis, at least `minPx`
 * wide (room for half of the first x label, which uPlot centres on its tick). */
export function yAxis(chart, fallbackPx, minPx = 0) {
  const { def } = chart;
  const kind = { bytes: def.bytes, pow2: def.log === 2 };
  let values = [];
  return {
    ticks: { show: false },
    splits: (u, _i, min, max) => {
      // Nothing drawn (a loss scale outside fp16): no labels for a range that means nothing.
      if (u.data.slice(1).every((ys) => ys.every((y) => y == null))) return (values = []);
      const px = u.bbox.height ? u.bbox.height / (devicePixelRatio || 1) : fallbackPx;
      values = ticks(min, max, { log: chart.log ? (def.log === 2 ? 2 : 10) : null, bytes: def.bytes, px });
      return values;
    },
    values: (u, splits) => splits.map(() => ""), // the labels are DOM (YLabels)
    size: () => Math.max(minPx, chart.yLabels.set(values, labels(values, kind))),
  };
}

/** A uPlot y range: the data's, padded, kept within the metric's ``bounds`` ([lo, hi] from
 * the catalog, e.g. a fraction's [0, 1]; null: unbounded). */
export function boundedRange(bounds) {
  return (u, min, max) => {
    if (min == null || max == null) return bounds ? [...bounds] : [0, 1];
    // A flat line around its value (uPlot's own range put a line of zeros on 0..100).
    const flat = Math.abs(min) * 0.1 || 1;
    const [lo, hi] = min === max ? [min - flat, max + flat] : window.uPlot.rangeNum(min, max, 0.1, true);
    if (!bounds) return [lo, hi];
    const out = [Math.max(bounds[0], lo), Math.min(bounds[1], hi)];
    return out[1] > out[0] ? out : [...bounds];
  };
}

/** A uPlot x range from step 0 to the run's last step (``last()``: max_steps; no step lies
 * beyond it), else to the data's (uPlot pads a lone point's x range: 60 read 0..120). */
export function runRange(last) {
  return (u, min, max) => {
    const end = last() || max;
    return [0, end > 0 ? end : 1];
  };
}

/** A log scale over the data's own range (uPlot's snaps to whole powers, squashing it). */
export function logScale(base) {
  return {
    distr: 3, log: base,
    range: (u, min, max) => {
      if (!(min > 0 && max > 0)) return [1, base];
      if (min === max) return [min / base, max * base];
      const pad = (max / min) ** 0.05;
      return [min / pad, max * pad];
    },
  };
}

/** The y axis labels of one chart, as spans over its plot (the plot element is their
 * positioned parent); uPlot draws the ticks and grid lines at the same values. */
export class YLabels {
  constructor(plotEl) {
    this.el = document.createElement("div");
    this.el.className = "y-labels";
    plotEl.append(this.el);
    this.values = [];
  }

  /** Show `texts` for `values`; the width the axis needs for them, in CSS pixels. */
  set(values, texts) {
    this.values = values;
    while (this.el.children.length > texts.length) this.el.lastChild.remove();
    while (this.el.children.length < texts.length) this.el.append(document.createElement("span"));
    texts.forEach((t, i) => { this.el.children[i].textContent = t; });
    const widest = Math.max(0, ...[...this.el.children].map((s) => s.getBoundingClientRect().width));
    return Math.ceil(widest) + GAP_PX;
  }

  /** Put each label beside its tick (uPlot's draw hook: the scale and the layout are final). */
  place(u) {
    const over = u.over;
    this.el.style.height = `${over.offsetTop + over.offsetHeight}px`;
    this.values.forEach((v, i) => {
      const s = this.el.children[i];
      s.style.right = `${this.el.clientWidth - over.offsetLeft + GAP_PX - 2}px`;
      s.style.top = `${over.offsetTop + u.valToPos(v, "y")}px`;
      s.dataset.value = String(v);
    });
  }
}
