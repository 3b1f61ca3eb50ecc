// Alert rules and their webhook deliveries (GET /alerts/rules, GET /alerts/rules/ID/deliveries):
// what each rule watches, which jobs, what it does, and every delivery's attempts. Polled
// while the page is open; creating and deleting rules is the CLI's and the API's.
import { api } from "../api.js";
import { clear, h } from "../dom.js";

const POLL_MS = 3000;

function watches(spec) {
  const w = spec.when;
  switch (w.kind) {
    case "event": return `on ${w.events.join(", ")}`;
    case "threshold": return `${w.series} ${w.above != null ? `> ${w.above}` : `< ${w.below}`}`;
    case "deviation": return `${w.series} beyond ${w.z} σ of its last ${w.window}`;
    case "no_progress": return `no step for ${w.seconds} s`;
    case "early_stop": return `early stop on ${w.series} (${w.mode}, patience ${w.patience}${w.target != null ? `, target ${w.target}` : ""})`;
    default: return w.kind;
  }
}

function scope(rule) {
  if (rule.job_id) return h("a", { href: `#/jobs/${encodeURIComponent(rule.job_id)}` }, rule.job_id);
  const pattern = rule.spec.scope && rule.spec.scope.name;
  return pattern ? `jobs ${pattern}` : "all jobs";
}

function actions(spec) {
  const out = [];
  if (spec.notify) out.push(`notify ${spec.notify.url}${spec.notify.format === "slack" ? " (slack)" : ""}`);
  if (spec.stop || spec.when.kind === "early_stop") out.push("stop");
  return out.join(" · ");
}

function deliveryRow(d) {
  const last = d.history.length ? d.history[d.history.length - 1] : {};
  return h("tr", { dataset: { delivery: String(d.id) } },
    h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(d.job_id)}` }, d.job_id)),
    h("td", {}, d.step ?? "–"),
    h("td", { class: `status-${d.status}` }, d.status),
    h("td", {}, `${d.attempts}/${d.max_retries + 1}`),
    h("td", { class: "small" }, last.status_code ? `HTTP ${last.status_code}` : (last.error || "–")));
}

async function ruleCard(rule) {
  // Only a rule that notifies has deliveries: one request per such rule, not per rule.
  const { items } = rule.spec.notify
    ? await api(`/alerts/rules/${rule.id}/deliveries`, { params: { limit: 20 } })
    : { items: [] };
  const table = items.length
    ? h("table", { class: "small" },
      h("thead", {}, h("tr", {}, ["job", "step", "status", "attempts", "last outcome"].map((t) => h("th", {}, t)))),
      h("tbody", {}, items.map(deliveryRow)))
    : h("p", { class: "muted small" }, "No deliveries yet.");
  return h("div", { class: "card", dataset: { rule: String(rule.id) } },
    h("div", { class: "row" }, h("h2", {}, rule.name), h("span", { class: "muted small" }, `#${rule.id} · ${rule.owner}`)),
    h("div", {}, watches(rule.spec), " · ", scope(rule)),
    h("div", { class: "small" }, actions(rule.spec)),
    rule.spec.notify ? table : null);
}

export function mount(root) {
  const body = h("div", { id: "alerts" }, h("span", { class: "muted" }, "Loading…"));
  root.append(h("h1", {}, "Alerts"), body);
  let timer = null;
  let stopped = false;

  async function poll() {
    try {
      const { items } = await api("/alerts/rules");
      const cards = await Promise.all(items.map(ruleCard));
      if (stopped) return;
      clear(body, cards.length ? cards : h("p", { class: "muted" }, "No alert rules. Add one with amptrain alerts add."));
    } catch (e) {
      clear(body, h("p", { class: "error" }, `Could not load alert rules: ${e.message}`));
    }
    if (!stopped) timer = setTimeout(poll, POLL_MS);
  }
  poll();
  return () => { stopped = true; clearTimeout(timer); };
}
