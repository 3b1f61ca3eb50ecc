// One job: status and progress, live charts (history first, downsampled to about two
// points per pixel, then the WebSocket from the history's cursor), the event timeline,
// the spec and checkpoint downloads. Zooming fetches the window at full resolution.
import { api, ApiError, catalog, download } from "../api.js";
import { ChartGroup, chartDefs } from "../charts.js";
import { FINISHED, clear, fmtBytes, fmtNum, fmtPow2, h, progressBar, statusBadge } from "../dom.js";
import { EvalCharts } from "../evals.js";
import { LayerNormChart } from "../layer_norms.js";
import { ParentOverlay, forkForm, lineageLinks } from "../lineage.js";
import { LiveFeed } from "../live.js";
import { showOffenders } from "../offenders.js";
import { describeSpans, fallbackReason, precisionSpans } from "../segments.js";
import { Series } from "../series.js";
import { Timeline } from "../timeline.js";
import { readState, writeState } from "../urlstate.js";

const POLL_MS = 2000;
// One history request serves every chart (one pass over the points in the database, not
// one per chart), so its budget is shared: every bucket keeps first, last and the min and
// max of each chart's fields; 8 points per pixel of one chart's width leaves each chart
// about two of its own per pixel.
const POINTS_PER_PIXEL = 8;
const REFETCH_FACTOR = 8; // live points beyond 8x the history budget: downsample again

export function mount(root, { id }) {
  const started = performance.now();
  const path = `/jobs/${encodeURIComponent(id)}`;
  const head = h("div", { class: "card", id: "job-head" }, h("span", { class: "muted" }, "Loading…"));
  const chartsEl = h("div", { class: "charts", id: "charts" });
  const liveState = h("span", { class: "small muted", id: "live-state" });
  const timeline = new Timeline({ onMarks: (events) => group.setEvents(events) });
  const specEl = h("pre", { id: "spec" });
  const checkpointsEl = h("div", { id: "checkpoints", class: "small" });
  // The view (x mode, smoothing, zoom, log axes) is in the link: it opens as its sender saw it.
  const group = new ChartGroup(`job-${id}`, { onZoom: fullResolution, onView: () => writeState(group.viewState()) });
  group.applyView(readState());
  // The charts, the fields they fetch and the header's summary come from the metric table.
  let fields, series, charts, summaryMetrics, evals;
  const evalsSlot = h("div", {});
  const offendersEl = h("div", { class: "offenders small", id: "overflow-offenders" });
  const layers = new LayerNormChart(); // shown once the job has any (telemetry.layer_grad_norms_every)
  const parentOverlay = new ParentOverlay(); // a fork: its loss over its parent's
  const ready = catalog().then((cat) => {
    const defs = chartDefs(cat);
    fields = [...new Set(defs.flatMap((c) => [...c.fields, ...c.extra]))];
    series = new Series(fields);
    charts = defs.map((c) => group.add(c, series));
    chartsEl.append(...charts.map((c) => c.el));
    // Beside the loss scale: which parameters made the skipped steps overflow.
    charts.find((c) => c.def.key === "loss_scale")?.el.append(offendersEl);
    const log2 = new Set(cat.charts.filter((c) => c.log === "log2").map((c) => c.key));
    summaryMetrics = cat.metrics.filter((m) => m.summary).map((m) => ({ ...m, pow2: log2.has(m.chart) }));
    evals = new EvalCharts(cat.eval_metrics || []);
    evalsSlot.append(evals.el);
  });
  let job = null;
  let feed = null;
  let stopped = false;
  let pollTimer = null;
  let liveSinceLoad = 0;

  const xMode = h("select", { id: "x-mode", onchange: () => group.setXMode(xMode.value) },
    h("option", { value: "step" }, "x: step"), h("option", { value: "time" }, "x: wall time"));
  xMode.value = group.xMode;
  const smoothing = h("input", { type: "range", id: "smoothing", min: "0", max: "0.99", step: "0.01", value: String(group.smoothing),
    oninput: () => { smoothValue.textContent = smoothing.value; group.setSmoothing(Number(smoothing.value)); } });
  const smoothValue = h("span", { class: "mono" }, smoothing.value);
  root.append(
    h("div", { class: "row small", style: "margin-bottom:6px" }, h("a", { href: "#/jobs" }, "← Jobs")),
    head,
    h("div", { class: "toolbar" }, xMode, h("label", {}, "smoothing ", smoothing, " ", smoothValue),
      h("button", { type: "button", onclick: () => group.resetZoom() }, "Reset zoom"),
      h("span", { class: "muted small" }, "drag to zoom, double-click to reset"), liveState),
    chartsEl,
    parentOverlay.el,
    evalsSlot,
    layers.el,
    h("div", { class: "grid2", style: "margin-top:14px" },
      h("div", { class: "card" }, h("h2", {}, "Events"), timeline.el),
      h("div", {}, h("div", { class: "card" }, h("h2", {}, "Checkpoints"), checkpointsEl),
        h("div", { class: "card" }, h("h2", {}, "Spec"), specEl))));

  function budget() { return Math.min(10_000, Math.max(400, Math.round(charts[0].width * POINTS_PER_PIXEL))); }

  function metrics(extra = {}) {
    return api(`${path}/metrics`, { params: { max_points: budget(), fields: [...fields, "time"].join(","), ...extra } });
  }

  async function loadHistory() {
    await ready;
    const page = await metrics();
    series.load(page.items, page.marks);
    group.rebuild();
    liveSinceLoad = 0;
    await new Promise((frame) => requestAnimationFrame(frame)); // uPlot draws in a microtask
    root.dataset.drawnMs = String(Math.round(performance.now() - started));
    root.dataset.drawnAt = String(Math.round(performance.now()));
    chartsEl.dataset.ready = "1";
    // A zoom the link asked for: that window at full resolution, as a drag would fetch it.
    if (group.zoom) fullResolution(group.zoom, charts[0]).catch(() => {});
    return page.next_cursor;
  }

  async function fullResolution(zoom, source) {
    let [from, to] = [zoom.min, zoom.max];
    if (group.xMode === "time") {
      const s = source.series;
      const inside = s.step.filter((_, i) => s.time[i] >= from && s.time[i] <= to);
      if (!inside.length) return;
      [from, to] = [inside[0], inside[inside.length - 1]];
    }
    from = Math.max(0, Math.floor(from));
    to = Math.ceil(to);
    if (!series.coarseWithin(from, to)) return;
    const page = await metrics({ from_step: from, to_step: to });
    if (stopped) return;
    series.splice(from, to, page.items, page.marks);
    group.refresh();
  }

  function onMetric(point) {
    series.append(point);
    setStep(point.step);
    group.refresh();
    if (++liveSinceLoad > REFETCH_FACTOR * budget() && !group.zoom) {
      liveSinceLoad = 0;
      loadHistory().catch(() => {});
    }
  }

  function setStep(step) {
    const el = document.getElementById("step");
    if (el && job && step > Number(el.dataset.step || 0)) {
      el.dataset.step = String(step);
      el.textContent = `step ${step} / ${job.max_steps}`;
    }
  }

  // What the live stream said since the last poll: an attempt's ``started`` event names its
  // precision before the header's next poll of the job (which showed "not started" beside
  // drawn steps).
  let liveStart = null;

  function onLifecycle(ev) {
    if (ev.type !== "started" || !job) return;
    const attempt = ev.data?.attempt || 0;
    if (liveStart && attempt < liveStart.attempt) return;
    liveStart = { attempt, precision: ev.data?.precision || {} };
    renderHead();
  }

  function headPrecision() {
    const polled = job.precision || {};
    if (!liveStart || (polled.effective && job.attempt >= liveStart.attempt)) return polled;
    return { ...polled, ...liveStart.precision };
  }

  function renderHead() {
    const p = headPrecision();
    const s = job.summary || {};
    const spans = precisionSpans(job.precision_history);
    group.setSpans(spans);
    group.setPrecision(p.effective || (p.requested !== "auto" ? p.requested : null));
    evals.bound(job.max_steps);
    // A fallback's reason in one sentence from its fields; the policy's own text in the tooltip.
    const why = fallbackReason(spans) || p.reason || "–";
    const status = liveStart && liveStart.attempt > job.attempt ? "running" : job.status;
    const cancellable = !FINISHED.has(status) && status !== "cancelling";
    clear(head, h("div", { class: "job-head" },
      h("div", {}, h("h1", { id: "job-name" }, job.name), h("div", { class: "small muted mono" }, job.id),
        h("div", { style: "margin-top:6px" }, statusBadge(status), " ",
          cancellable ? h("button", { class: "danger", onclick: cancel }, "Cancel") : null, " ",
          h("a", { href: `#/compare?jobs=${encodeURIComponent(job.id)}`, class: "small" }, "compare…")),
        lineageLinks(job)),
      h("div", {}, h("div", { class: "big", id: "step", dataset: { step: String(job.step) } }, `step ${job.step} / ${job.max_steps}`),
        progressBar(job.step, job.max_steps)),
      h("dl", { class: "kv" },
        h("dt", {}, "precision"), h("dd", { id: "precision", title: p.reason || "" }, p.effective ? `${p.effective} (asked ${p.requested})` : `${p.requested} (not started)`),
        h("dt", {}, "why"), h("dd", { class: "small", id: "precision-why", title: p.reason || "" }, why),
        spans.length ? h("dt", {}, "precisions") : null,
        spans.length ? h("dd", { id: "precision-history", class: "small" }, describeSpans(spans)) : null,
        h("dt", {}, "attempt"), h("dd", {}, `${Math.max(job.attempt, liveStart?.attempt || 0)}${job.worker ? ` on ${job.worker}` : ""}`),
        job.nodes ? h("dt", {}, "nodes") : null,
        job.nodes ? h("dd", { id: "nodes", class: "small" }, describeNodes(job)) : null,
        h("dt", {}, "owner"), h("dd", {}, job.owner)),
      h("dl", { class: "kv" }, summaryMetrics.flatMap((m) => [
        h("dt", {}, m.name.replaceAll("_", " ")),
        h("dd", { dataset: { summary: m.name } }, m.unit === "bytes" ? fmtBytes(s[m.name]) : m.pow2 ? fmtPow2(s[m.name]) : fmtNum(s[m.name], m.unit ? 3 : 4)),
      ])),
      s.eval ? h("dl", { class: "kv", id: "eval-summary" }, h("dt", {}, "evaluated"), h("dd", {}, `step ${s.eval.step}`),
        ...Object.entries(s.eval.values).flatMap(([name, v]) => [
          h("dt", {}, name.replaceAll("_", " ")), h("dd", { dataset: { evalSummary: name } }, fmtNum(v, 4))])) : null,
      job.error ? h("div", { class: "error", id: "job-error" }, `${job.error.code}: ${job.error.message}`) : null));
  }

  async function poll() {
    clearTimeout(pollTimer);
    try {
      job = await api(path);
      if (stopped) return;
      renderHead();
      showOffenders(offendersEl, job.summary?.overflow_counts);
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        clear(head, h("div", { class: "error", id: "not-found" }, `No job ${id} (or it is not yours).`));
        return;
      }
    }
    if (!stopped && job && !FINISHED.has(job.status)) pollTimer = setTimeout(poll, POLL_MS);
  }

  async function cancel() {
    try { await api(`${path}/cancel`, { method: "POST" }); } catch (e) { liveState.textContent = e.message; }
    poll();
  }

  async function loadEvents() {
    let after = 0;
    for (;;) {
      const page = await api(`${path}/events`, { params: { after, limit: 1000 } });
      page.items.forEach((ev) => { timeline.add(ev); onLifecycle(ev); });
      if (page.items.length < 1000) return;
      after = page.next_cursor;
    }
  }

  async function loadEvals() {
    // Downsampled in the database like the step charts (each bucket's first, last and every
    // name's min and max), whole when the run's evaluations fit the charts' budget.
    const page = await api(`${path}/evals`, { params: { max_points: budget() } });
    page.items.forEach((e) => evals.add(e));
  }

  async function loadLayerNorms() {
    // Downsampled like the evaluations (each bucket's first, last and highest norm).
    // Each item holds every layer (up to 256 values): fewer of them than the step charts.
    const page = await api(`${path}/layer-norms`, { params: { max_points: Math.min(budget(), 1000) } });
    page.items.forEach((item) => layers.add(item));
  }

  async function loadCheckpoints() {
    const list = await api(`${path}/checkpoints`);
    clear(checkpointsEl, list.items.length ? list.items.map((c) => {
      // A fork of this checkpoint: its small form opens under the row.
      const slot = h("div", {});
      const toggle = () => clear(slot, slot.firstChild ? null : forkForm(job, c.step, () => clear(slot)));
      return h("div", { class: "checkpoint", dataset: { step: String(c.step) } },
        h("button", { class: "link", onclick: () => download(c.url, `${id}-step${c.step}.pt`) }, `step ${c.step}`),
        h("span", { class: "muted" }, ` ${fmtBytes(c.size)} `),
        h("button", { type: "button", class: "fork", onclick: toggle }, "Fork"), slot);
    }) : h("span", { class: "muted" }, "none yet"));
  }

  (async () => {
    // The history first and alone: it is the slow part of a big run's page; the job, its
    // events and checkpoints follow.
    const history = loadHistory();
    history.catch(() => {}); // a 404 is shown by poll()
    await ready;
    await poll();
    if (!job) return;
    specEl.textContent = JSON.stringify(job.spec, null, 2);
    const cursor = await history;
    await Promise.all([loadEvents(), loadEvals(), loadLayerNorms(), loadCheckpoints().catch(() => {}),
      parentOverlay.load(job).catch(() => {})]);
    if (stopped) return;
    feed = new LiveFeed(id, cursor, {
      onMetric,
      onEval: (e) => evals.add(e),
      onLayerNorms: (item) => layers.add(item),
      onEvent: (ev) => {
        onLifecycle(ev);
        if (timeline.add(ev) && ev.type === "checkpoint") loadCheckpoints().catch(() => {});
      },
      onEnd: () => poll().then(() => parentOverlay.load(job)).catch(() => {}),
      onState: (s) => { liveState.textContent = s; liveState.dataset.state = s; },
    });
    feed.start();
  })().catch((e) => {
    if (!(e instanceof ApiError && e.status === 404)) clear(head, h("div", { class: "error" }, `Could not load job: ${e.message}`));
  });

  return () => {
    stopped = true;
    clearTimeout(pollTimer);
    feed?.stop();
    group.destroy();
    evals?.destroy();
    layers.destroy();
    parentOverlay.close();
  };
}

// A multi-node attempt's machines and their ranks: "attempt 2: node 0 a@host (10.0.0.2) ranks 0,1 · node 1 …".
function describeNodes(job) {
  const nodes = job.nodes.map((n) => {
    const where = n.worker ? ` ${n.worker}${n.address ? ` (${n.address})` : ""}` : "";
    return `node ${n.node}${where} rank${n.ranks.length === 1 ? "" : "s"} ${n.ranks.map((r) => r.rank).join(",") || "–"}`;
  });
  return `attempt ${job.nodes_attempt}: ${nodes.join(" · ")}`;
}
