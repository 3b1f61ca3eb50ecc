// Compare runs: overlay any metric of any jobs (overlay_panel.js), or run a precision A/B
// comparison (POST /comparisons: one spec, one job per precision) and read its ratio table,
// the accuracy verdict and the held-out curves of every arm side by side.
import { api, ApiError, catalog } from "../api.js";
import { FINISHED, clear, fmtAge, fmtBytes, fmtNum, h, statusBadge } from "../dom.js";
import { axisTitle } from "../legend.js";
import { OverlayPlot, lineStyle } from "../overlay.js";
import { overlayPanel } from "../overlay_panel.js";
import { describeSpans, precisionSpans } from "../segments.js";
import { specForm } from "../spec_form.js";

const POLL_MS = 3000;

export function mount(root, args) {
  return args.id ? report(root, args.id) : overview(root, args.jobs ? args.jobs.split(",") : []);
}

/** The comparison in one line, from its verdict data: each arm's throughput against the
 * baseline's (the API's samples/s) and whether it kept its accuracy, e.g.
 * "bf16: 1.03× fp32's throughput, accuracy kept". */
export function headline(c) {
  if (!c.baseline) return "No fp32 run: nothing to compare against.";
  const arms = c.runs.filter((r) => r.precision !== c.baseline);
  const parts = arms.map((r) => {
    const speed = r.ratios.throughput == null ? "throughput not measured yet" : `${r.ratios.throughput.toFixed(2)}× ${c.baseline}'s throughput`;
    const kept = r.verdict.kept_accuracy;
    const accuracy = kept === true ? "accuracy kept" : kept === false ? "accuracy lost" : r.status === "failed" ? "failed" : "accuracy not evaluated yet";
    return `${r.precision}: ${speed}, ${accuracy}`;
  });
  return parts.join(" · ") || `Only ${c.baseline} was run.`;
}

function overview(root, preselected) {
  const panel = overlayPanel(preselected);
  const abSlot = h("div", { id: "ab-form" });
  const listEl = h("div", { id: "comparisons" });
  root.append(
    h("h1", {}, "Compare"),
    h("div", { class: "grid2" }, panel.card, panel.pickerCard),
    h("div", { class: "grid2" },
      h("div", { class: "card" }, h("h2", {}, "Precision A/B"),
        h("p", { class: "small muted" }, "Train one spec once per precision and compare throughput, peak memory, final loss and held-out accuracy against fp32."), abSlot),
      h("div", { class: "card" }, h("h2", {}, "Comparisons"), listEl)));

  (async () => {
    const comparisons = (await api("/comparisons")).items;
    clear(listEl, comparisons.length ? h("ul", {}, comparisons.map((c) => h("li", {},
      h("a", { href: `#/compare/${encodeURIComponent(c.id)}` }, c.name), h("span", { class: "muted small" }, ` ${c.runs.map((r) => r.precision).join(" / ")} · ${fmtAge(c.created_at)}`))))
      : h("span", { class: "muted" }, "None yet."));
    const [catalog, workers] = await Promise.all([api("/catalog"), api("/workers").catch(() => ({ items: [] }))]);
    // TF32 (fp32 with tensor-core matmuls) is an arm worth measuring only where it exists:
    // a CUDA device of compute capability 8.0 or newer among the live workers.
    const tf32 = workers.items.some((w) => (w.devices || []).some((d) => d.type === "cuda" && parseFloat(d.compute_capability) >= 8));
    const arms = tf32 ? ["fp32", "tf32", "bf16", "fp16"] : ["fp32", "bf16", "fp16"];
    const precisions = h("fieldset", {}, h("legend", {}, "Precisions"), arms.map((p) =>
      h("label", { style: "margin-right:12px" }, h("input", { type: "checkbox", value: p, checked: true, class: "ab-precision" }), ` ${p}`)));
    abSlot.append(specForm(catalog, {
      submitLabel: "Run comparison",
      omit: ["precision"],
      extra: precisions,
      onSubmit: async (spec) => {
        const chosen = [...precisions.querySelectorAll("input:checked")].map((i) => i.value);
        try {
          const c = await api("/comparisons", { method: "POST", body: { spec, precisions: chosen, add_tf32: false } }); // the form lists tf32 itself
          location.hash = `#/compare/${encodeURIComponent(c.id)}`;
        } catch (e) {
          if (e instanceof ApiError && Array.isArray(e.detail)) e.detail = e.detail.map((p) => ({ ...p, field: p.field.replace(/^spec\./, "") }));
          throw e;
        }
      },
    }));
  })().catch((e) => listEl.replaceChildren(h("span", { class: "error" }, e.message)));

  return () => panel.destroy();
}

function ratioCell(value, kind) {
  if (value === null || value === undefined) return h("td", { class: "num muted", dataset: { ratio: kind } }, "–");
  const good = kind === "throughput" ? value > 1.05 : kind === "peak_memory" ? value < 0.95 : Math.abs(value - 1) <= 0.05;
  const bad = kind === "throughput" ? value < 0.95 : kind === "peak_memory" ? value > 1.05 : value > 1.05;
  return h("td", { class: `num ratio ${good ? "good" : bad ? "bad" : ""}`, dataset: { ratio: kind } }, `${value.toFixed(2)}×`);
}

/** Accuracy against the baseline: the final accuracy (or eval loss) and the verdict, its
 * reasons in the tooltip. */
function accuracyCells(r) {
  const acc = r.eval?.accuracy;
  const shown = acc !== undefined && acc !== null ? `${(acc * 100).toFixed(2)}%` : fmtNum(r.eval?.eval_loss, 4);
  const points = r.eval_diff.accuracy_points;
  const kept = r.verdict.kept_accuracy;
  const word = kept === true ? "kept" : kept === false ? "lost" : "–";
  return [
    h("td", { class: "num", dataset: { eval: "final" } }, r.eval ? shown : "–"),
    h("td", { class: "num", dataset: { eval: "points" } }, points === null ? "–" : `${points >= 0 ? "+" : ""}${points.toFixed(2)}`),
    h("td", { class: `ratio ${kept === true ? "good" : kept === false ? "bad" : "muted"}`, dataset: { verdict: String(kept) }, title: r.verdict.reasons.join("; ") }, word),
  ];
}

function report(root, id) {
  const head = h("div", { class: "card", id: "comparison" }, h("span", { class: "muted" }, "Loading…"));
  const plotEl = h("div", { id: "comparison-curves" });
  const lossPlot = new OverlayPlot(plotEl, { height: 280, syncKey: `comparison-${id}` });
  const defs = catalog().then((cat) => Object.fromEntries((cat.eval_metrics || []).map((m) => [m.name, m])));
  const evalEl = h("div", { class: "charts", id: "comparison-evals" }, h("p", { class: "muted small" }, "No evaluation yet."));
  root.append(h("div", { class: "small", style: "margin-bottom:6px" }, h("a", { href: "#/compare" }, "← Compare")), head,
    h("div", { class: "card" }, h("h2", {}, "Loss by step"), plotEl),
    h("div", { class: "card" }, h("h2", {}, "Held-out evaluation by step"),
      h("p", { class: "small muted" }, "Every arm evaluated on the same held-out samples, one line per precision."), evalEl));
  let evalPlots = [];
  let evalKey = "";
  let timer = null;
  let stopped = false;
  let lossKey = "";

  /** One chart per eval metric, each arm's series side by side; redrawn when a run evaluated again. */
  async function drawEvals(c) {
    const key = c.runs.map((r) => `${r.job_id}:${r.eval_step}`).join(",");
    if (key === evalKey || !c.runs.some((r) => r.eval_step !== null)) return;
    evalKey = key;
    const [pages, metrics] = await Promise.all([
      Promise.all(c.runs.map((r) => api(`/jobs/${encodeURIComponent(r.job_id)}/evals`, { params: { limit: 10000 } }))), defs]);
    if (stopped) return;
    const names = [...new Set(pages.flatMap((p) => p.items.flatMap((i) => Object.keys(i.values))))];
    evalPlots.forEach((p) => p.close());
    evalPlots = [];
    evalEl.replaceChildren();
    for (const name of names) {
      const lines = pages.map((p, i) => {
        const items = p.items.filter((it) => name in it.values);
        return { label: c.runs[i].precision, ...lineStyle(i), xs: items.map((it) => it.step), ys: items.map((it) => it.values[name]) };
      });
      const plotBox = h("div", {});
      const el = h("div", { class: "card chart", dataset: { evalCurve: name, series: String(c.runs.length) } },
        h("header", {}, h("strong", {}, `eval: ${name.replaceAll("_", " ")}`)), plotBox);
      evalEl.append(el);
      // Each run's points on an axis from step 0 to the runs' length, and within the metric's range.
      const plot = new OverlayPlot(plotBox, { height: 200, syncKey: `comparison-${id}` });
      plot.draw(lines, { xMax: runLength(c), bounds: metrics[name]?.bounds || null, yLabel: axisTitle(name, metrics[name]?.unit),
        what: `${name.replaceAll("_", " ")} curves` });
      evalPlots.push(plot);
    }
  }

  function render(c) {
    const base = c.baseline;
    clear(head, h("h1", {}, c.name), h("p", { class: "headline", id: "comparison-headline" }, headline(c)), h("p", { class: "small muted" },
      base ? `Ratios against the ${base} run. Throughput: mean samples/s after the first 10% of steps; final loss: mean of the last 10% of steps.` : "No fp32 run: no ratios."),
    h("table", { id: "ratio-table" },
      h("thead", {}, h("tr", {}, ["Precision", "Job", "Status", "Trained in", "Samples/s", `× ${base || "base"}`, "Peak memory", `× ${base || "base"}`, "Final loss", `× ${base || "base"}`, "Accuracy", "Δ points", "Accuracy kept"]
        .map((t, i) => h("th", { class: i >= 4 ? "num" : "" }, t)))),
      h("tbody", {}, c.runs.map((r) => h("tr", { dataset: { precision: r.precision } },
        h("td", {}, h("strong", {}, r.precision)),
        h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(r.job_id)}` }, r.name)),
        h("td", {}, statusBadge(r.status), h("span", { class: "small muted" }, ` ${r.step}/${r.max_steps}`)),
        h("td", { title: describeSpans(precisionSpans(r.precision_history)) }, r.effective_precision || "–",
          precisionSpans(r.precision_history).length ? h("span", { class: "small muted" }, ` (${r.precision_history.map((x) => x.precision).join(" → ")})`) : null),
        h("td", { class: "num" }, fmtNum(r.throughput, 4)), ratioCell(r.ratios.throughput, "throughput"),
        h("td", { class: "num" }, fmtBytes(r.peak_memory)), ratioCell(r.ratios.peak_memory, "peak_memory"),
        h("td", { class: "num" }, fmtNum(r.final_loss, 4)), ratioCell(r.ratios.final_loss, "final_loss"),
        ...accuracyCells(r))))),
    h("p", { class: "small muted" }, `Accuracy kept: at most ${c.tolerance.accuracy_points} points of accuracy lost and ${(c.tolerance.eval_loss_relative * 100).toFixed(1)}% more eval loss than ${base || "the baseline"}, on the final evaluation.`));
    // Each arm's color and dash pattern (identical curves are named above the plot).
    const curves = c.loss_curves;
    const lines = Object.keys(curves.loss).map((n, i) => ({ label: n, ...lineStyle(i), xs: curves.step, ys: curves.loss[n] }));
    const key = JSON.stringify(curves);
    if (key !== lossKey) lossPlot.draw(lines, { xMax: runLength(c), yLabel: "loss", what: "loss curves" });
    lossKey = key;
  }

  // After every run finished, the recorder may still be storing the last points: poll
  // until two answers agree.
  let last = "";
  async function poll() {
    try {
      const c = await api(`/comparisons/${encodeURIComponent(id)}`);
      if (stopped) return;
      render(c);
      await drawEvals(c);
      const text = JSON.stringify(c.runs);
      const settled = c.runs.every((r) => FINISHED.has(r.status)) && text === last;
      last = text;
      if (!settled) timer = setTimeout(poll, c.runs.every((r) => FINISHED.has(r.status)) ? 1000 : POLL_MS);
    } catch (e) {
      clear(head, h("div", { class: "error", id: "not-found" }, e.status === 404 ? `No comparison ${id} (or it is not yours).` : e.message));
    }
  }
  poll();
  return () => { stopped = true; clearTimeout(timer); lossPlot.close(); evalPlots.forEach((p) => p.close()); };
}

/** The longest arm's max_steps: the x axes run from 0 to it. */
function runLength(c) {
  return Math.max(0, ...c.runs.map((r) => r.max_steps || 0)) || null;
}
