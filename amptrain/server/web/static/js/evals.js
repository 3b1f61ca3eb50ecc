// Evaluation charts: one small chart per metric name of GET /jobs/{id}/evals (a plugin's
// names too: the series are named, not a fixed set), fed by history and live eval messages.
// The x axis spans the run (step 0 to max_steps), and a metric with bounds in the catalog
// (a fraction: 0..1) keeps its y axis within them.
import { YLabels, boundedRange, runRange, yAxis } from "./axes.js";
import { fmtNum, h } from "./dom.js";
import { STEP_INCRS } from "./charts.js";
import { axisTitle, exposeScales, newestWhenIdle, refreshLegend, titled } from "./legend.js";

const uPlot = window.uPlot;

export class EvalCharts {
  /** ``defs``: GET /catalog's eval_metrics (labels, bounds and which way is better). */
  constructor(defs) {
    this.defs = Object.fromEntries(defs.map((m) => [m.name, m]));
    this.order = defs.map((m) => m.name);
    this.el = h("div", { class: "charts", id: "eval-charts" });
    this.charts = new Map(); // name -> {el, steps, values, plot}
    this.maxSteps = null;
  }

  /** The run's length: every chart's x axis ends there. */
  bound(maxSteps) {
    if (maxSteps === this.maxSteps) return;
    this.maxSteps = maxSteps;
    for (const c of this.charts.values()) c.plot.setData([c.steps, c.values]);
  }

  /** One evaluation ({step, values}); the same step again (history then live) replaces it. */
  add(item) {
    for (const [name, value] of Object.entries(item.values)) {
      const c = this.charts.get(name) || this.#chart(name);
      const at = c.steps.findIndex((s) => s >= item.step);
      if (at === -1) { c.steps.push(item.step); c.values.push(value); }
      else if (c.steps[at] === item.step) c.values[at] = value;
      else { c.steps.splice(at, 0, item.step); c.values.splice(at, 0, value); }
      c.el.dataset.points = String(c.steps.length);
      c.plot.setData([c.steps, c.values]);
      refreshLegend(c.plot);
    }
  }

  #chart(name) {
    const def = this.defs[name] || {};
    const label = def.label || name;
    const hint = def.better ? ` (${def.better} is better)` : "";
    const plotEl = h("div", { class: "plot" });
    const axis = { def: {}, log: false, yLabels: new YLabels(plotEl) }; // y labels as on the step charts
    const el = h("div", { class: "card chart", dataset: { evalChart: name, points: "0" } },
      h("header", {}, h("strong", {}, `eval: ${name.replaceAll("_", " ")}`), h("span", { class: "muted small" }, hint)), plotEl);
    // Built-in metrics in the catalog's order, then a plugin's by name.
    const rank = (n) => (this.order.includes(n) ? this.order.indexOf(n) : this.order.length);
    const after = [...this.charts.keys()].find((n) => rank(n) > rank(name) || (rank(n) === rank(name) && n > name));
    this.el.insertBefore(el, after ? this.charts.get(after).el : null);
    // As wide as its own card (the grid's width made it spill over its neighbour), following resizes.
    const plot = new uPlot({ width: plotEl.clientWidth || 600, height: 180,
      scales: { x: { time: false, range: runRange(() => this.maxSteps) }, y: { range: boundedRange(def.bounds || null) } },
      series: [{ label: "step", value: newestWhenIdle(String) },
        { label, stroke: "#2b8a3e", width: 1.5, spanGaps: true, points: { show: true }, value: newestWhenIdle((v) => fmtNum(v, 4)) }],
      axes: [{ incrs: STEP_INCRS, ...titled("step") }, { ...yAxis(axis, 130), ...titled(axisTitle(name, def.unit)) }],
      hooks: { draw: [(u) => axis.yLabels.place(u), exposeScales(el)] } }, [[], []], plotEl);
    const resize = new ResizeObserver(() => {
      if (plotEl.clientWidth && plotEl.clientWidth !== plot.width) plot.setSize({ width: plotEl.clientWidth, height: 180 });
    });
    resize.observe(plotEl);
    const c = { el, steps: [], values: [], plot, resize };
    this.charts.set(name, c);
    return c;
  }

  destroy() {
    for (const c of this.charts.values()) { c.resize.disconnect(); c.plot.destroy(); }
  }
}
