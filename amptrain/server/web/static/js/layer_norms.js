// The "Layer gradient norms" chart: one line per layer (module path) from
// GET /jobs/{id}/layer-norms and live layer_grad_norm messages, on a log y axis. A model
// may have up to 256 layers: past TOP_N, the lines are the TOP_N layers with the highest
// newest norm (the ones to watch when training blows up). Hidden until the job has any.
import { fmtNum, h } from "./dom.js";
import { STEP_INCRS } from "./charts.js";
import { exposeScales, newestWhenIdle, refreshLegend, titled } from "./legend.js";

const uPlot = window.uPlot;
const TOP_N = 8;
const COLORS = ["#2f6fde", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c", "#5c940d"];

export class LayerNormChart {
  constructor() {
    this.records = new Map(); // step -> {layer: norm | null}
    this.shown = []; // the layers drawn, in legend order
    this.plot = null;
    this.pending = false;
    this.plotEl = h("div", { class: "plot" });
    this.note = h("span", { class: "muted small", dataset: { layerNote: "" } });
    this.el = h("section", { class: "card chart hidden", id: "layer-norms", dataset: { layerChart: "", points: "0", layers: "0" } },
      h("header", {}, h("strong", {}, "Layer gradient norms"), h("span", { class: "small muted" }, " log"), " ", this.note), this.plotEl);
  }

  /** One step's norms ({step, values}); the same step again (history then live) replaces it. */
  add(item) {
    this.records.set(item.step, item.values);
    this.el.classList.remove("hidden");
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.#draw(); });
  }

  #draw() {
    const steps = [...this.records.keys()].sort((a, b) => a - b);
    const newest = this.records.get(steps[steps.length - 1]);
    const layers = Object.keys(newest);
    const shown = layers.length <= TOP_N ? layers
      : [...layers].sort((a, b) => (newest[b] ?? -1) - (newest[a] ?? -1)).slice(0, TOP_N);
    const positive = (v) => (v > 0 ? v : null); // a log axis: zero and null are gaps
    const data = [steps, ...shown.map((l) => steps.map((s) => positive(this.records.get(s)[l])))];
    if (!this.plot || shown.join("\n") !== this.shown.join("\n")) this.#build(shown, data);
    else { this.plot.setData(data); refreshLegend(this.plot); }
    this.el.dataset.points = String(steps.length);
    this.el.dataset.layers = String(layers.length);
    this.el.dataset.shown = shown.join(",");
    this.note.textContent = layers.length > TOP_N ? `top ${TOP_N} of ${layers.length} layers by newest norm` : "";
  }

  #build(shown, data) {
    this.plot?.destroy();
    this.shown = shown;
    const series = [{ label: "step", value: newestWhenIdle(String) }, ...shown.map((l, i) => ({
      label: l, stroke: COLORS[i % COLORS.length], width: 1.25, spanGaps: true, value: newestWhenIdle((v) => fmtNum(v, 4)) }))];
    this.plot = new uPlot({ width: this.plotEl.clientWidth || this.el.clientWidth || 600, height: 220,
      scales: { x: { time: false }, y: { distr: 3, log: 10 } }, series,
      axes: [{ incrs: STEP_INCRS, ...titled("step") }, { size: 64, values: (u, vs) => vs.map((v) => fmtNum(v, 3)), ...titled("gradient norm") }],
      hooks: { draw: [exposeScales(this.el)] } }, data, this.plotEl);
  }

  destroy() {
    this.plot?.destroy();
  }
}
