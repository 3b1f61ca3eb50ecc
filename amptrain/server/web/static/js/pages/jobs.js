// Jobs at a glance: a live table (polled while the tab is visible), a status filter,
// cancel buttons, and the submit form built from the catalog.
import { api } from "../api.js";
import { FINISHED, clear, fmtAge, fmtNum, h, progressBar, statusBadge } from "../dom.js";
import { specForm } from "../spec_form.js";
import { readState, writeState } from "../urlstate.js";

const STATUSES = ["", "queued", "running", "cancelling", "succeeded", "failed", "cancelled"];
const REFRESH_MS = 2000;

export function mount(root) {
  // The filter is in the URL (#/jobs?status=failed): a link shows the same list.
  const filter = h("select", { id: "status-filter", onchange: () => { writeState({ status: filter.value }); refresh(); } },
    STATUSES.map((s) => h("option", { value: s }, s || "all statuses")));
  const asked = readState().get("status") || "";
  filter.value = STATUSES.includes(asked) ? asked : "";
  const tbody = h("tbody", { id: "jobs-body" });
  const note = h("div", { class: "muted small", id: "jobs-note" });
  const formSlot = h("div", { class: "card hidden", id: "submit-card" });
  const toggle = h("button", { class: "primary", id: "new-job", onclick: () => {
    formSlot.classList.toggle("hidden");
    if (!formSlot.firstChild) loadForm();
  } }, "New job");
  root.append(
    h("div", { class: "row", style: "margin-bottom:10px" }, h("h1", {}, "Jobs"), filter, toggle,
      h("a", { href: "#/compare", class: "small" }, "compare runs…")),
    formSlot,
    h("div", { class: "card" }, h("table", { id: "jobs" },
      h("thead", {}, h("tr", {}, ["Name", "Owner", "Status", "Progress", "Precision", "Loss", "Samples/s", "Age", ""]
        .map((t, i) => h("th", { class: i >= 5 && i <= 6 ? "num" : "" }, t)))),
      tbody), note));

  let stopped = false;
  let timer = null;
  async function refresh() {
    clearTimeout(timer);
    try {
      const page = await api("/jobs", { params: { status: filter.value, limit: 100 } });
      if (stopped) return;
      clear(tbody, page.items.map(row));
      note.textContent = page.items.length ? "" : filter.value ? `No ${filter.value} jobs.` : "No jobs yet.";
    } catch (e) {
      note.textContent = `Could not load jobs: ${e.message}`;
    }
    if (!stopped) timer = setTimeout(tick, REFRESH_MS);
  }
  function tick() {
    if (document.visibilityState === "visible") refresh();
    else timer = setTimeout(tick, REFRESH_MS);
  }

  async function loadForm() {
    const catalog = await api("/catalog");
    formSlot.append(h("h2", {}, "Submit a job"), specForm(catalog, {
      onSubmit: async (spec) => {
        const job = await api("/jobs", { method: "POST", body: spec });
        location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
      },
    }));
  }

  async function cancel(job) {
    try {
      await api(`/jobs/${encodeURIComponent(job.id)}/cancel`, { method: "POST" });
    } catch (e) {
      note.textContent = `Could not cancel ${job.name}: ${e.message}`;
    }
    refresh();
  }

  function row(job) {
    const s = job.summary || {};
    const p = job.precision || {};
    return h("tr", { dataset: { jobId: job.id } },
      h("td", { class: "name" }, h("a", { href: `#/jobs/${encodeURIComponent(job.id)}`, title: job.id }, job.name)),
      h("td", {}, job.owner),
      h("td", {}, statusBadge(job.status)),
      h("td", {}, progressBar(job.step, job.max_steps), " ", h("span", { class: "small muted" }, `${job.step}/${job.max_steps}`)),
      h("td", { title: p.reason || "" }, p.effective || h("span", { class: "muted" }, p.requested || "–")),
      h("td", { class: "num" }, fmtNum(s.loss)),
      h("td", { class: "num" }, fmtNum(s.samples_per_second, 3)),
      h("td", { title: job.created_at }, fmtAge(job.created_at)),
      h("td", {}, FINISHED.has(job.status) || job.status === "cancelling" ? "" :
        h("button", { class: "danger", onclick: () => cancel(job) }, "Cancel")));
  }

  refresh();
  return () => { stopped = true; clearTimeout(timer); };
}
