// What a chart's legend reads while the cursor is off the plot: each series' newest value
// (uPlot's own legend shows "–" until a step is hovered), and the axis titles every chart
// carries (the x axis' unit, the y axis' metric and unit from the catalog).

/** The newest non-null value of a data column, or null. */
export function newest(ys) {
  for (let i = (ys?.length ?? 0) - 1; i >= 0; i--) if (ys[i] != null) return ys[i];
  return null;
}

/** A uPlot series ``value``: the hovered step's value, or the newest one while no step is
 * hovered (uPlot passes ``idx`` null then). ``fmt`` formats a number. */
export function newestWhenIdle(fmt) {
  return (u, v, si, idx) => {
    const x = idx == null ? newest(u.data[si]) : v;
    return x == null ? "–" : fmt(x);
  };
}

/** After new data: a legend not reading a hovered step shows the newest values again. */
export function refreshLegend(u) {
  if (u && u.cursor.idx == null) u.setLegend({ idx: null });
}

/** A y axis title: a metric's name (or its chart's title) with its unit: "loss",
 * "throughput (samples/s)", "memory (bytes)". */
export function axisTitle(name, unit) {
  return `${name.replaceAll("_", " ")}${unit ? ` (${unit})` : ""}`;
}

/** uPlot axis options for a title of 11 px text (uPlot's default label font is larger). */
export function titled(label) {
  return { label, labelSize: 18, labelFont: "11px sans-serif", labelGap: 2 };
}

/** A uPlot draw hook writing what the canvas shows into `el`'s data-* (tests and tooling
 * read it; the canvas cannot be): ``data-axes`` (the titles, "step|loss"), ``data-x-range``
 * and ``data-y-range`` ("min,max"). */
export function exposeScales(el) {
  const range = (s) => [s.min, s.max].map((v) => (v == null ? "" : String(+v.toPrecision(6)))).join(",");
  return (u) => {
    el.dataset.axes = u.axes.map((a) => a.label || "").join("|");
    el.dataset.xRange = range(u.scales.x);
    el.dataset.yRange = range(u.scales.y);
  };
}
