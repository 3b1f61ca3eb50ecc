// The compare view's job picker: a checkbox per job, filtered as one types (by name, id,
// precision or status), paged through GET /jobs by its cursor. Picked jobs stay picked
// while the filter hides them, and are kept in the order they were picked (the first
// picked fp32 run is the overlay's baseline).
import { api } from "./api.js";
import { fmtAge, h, statusBadge } from "./dom.js";

const PAGE = 100;
const SEARCH_PAGES = 10; // a search matching nothing loaded reads up to this many more pages

export const MAX_LINKED = 20; // jobs a link may pick: more is no overlay anyone reads
const JOB_ID = /^j_[0-9a-f]{32}$/; // amptrain/contract/job_ids.py's JOB_ID

/** The job ids a link names, each once and of a job id's shape, at most MAX_LINKED; and a
 * note of what was left out, or "". A link is anyone's to craft: each id it names is read
 * with the reader's token, and one naming 3,000 sent 3,000 requests. */
export function linkedJobs(named) {
  const unique = [...new Set(named)];
  const shaped = unique.filter((id) => JOB_ID.test(id));
  const notes = [];
  if (shaped.length < unique.length) notes.push(`${unique.length - shaped.length} entries that are not job ids were ignored`);
  if (shaped.length > MAX_LINKED) notes.push(`only the first ${MAX_LINKED} of its ${shaped.length} jobs were picked (at most ${MAX_LINKED})`);
  return { ids: shaped.slice(0, MAX_LINKED), note: notes.length ? `The link was cut: ${notes.join("; ")}.` : "" };
}

const precisionOf = (j) => j.precision?.effective || j.precision?.requested || j.spec?.precision || "";

export class JobPicker {
  /** `preselected`: job ids (from the link), in pick order; `onChange(jobs)` on every pick. */
  constructor(preselected, onChange) {
    this.onChange = onChange;
    const linked = linkedJobs(preselected);
    this.order = linked.ids;
    this.jobs = new Map(); // id -> job
    this.rows = new Map(); // id -> label
    this.cursor = null;
    this.loaded = false; // the first page was read
    this.search = h("input", { type: "search", id: "pick-search", placeholder: "Filter by name, id, precision…", oninput: () => this.filter(true) });
    this.list = h("div", { class: "pick", id: "pick-jobs" }, h("span", { class: "muted" }, "Loading jobs…"));
    this.moreButton = h("button", { type: "button", id: "pick-more", hidden: true, onclick: () => this.more().then(() => this.filter()) }, "More jobs");
    this.count = h("span", { class: "small muted", id: "pick-count" });
    this.linkNote = h("p", { class: "small error", id: "pick-link-note", hidden: !linked.note }, linked.note);
    this.el = h("div", {}, this.linkNote, this.search, this.list, h("div", { class: "row small" }, this.count, " ", this.moreButton));
  }

  /** The picked jobs, in pick order. */
  picked() {
    return this.order.map((id) => this.jobs.get(id)).filter(Boolean);
  }

  async load() {
    await this.more();
    // A link may name jobs beyond the first page: read those one by one.
    const missing = this.order.filter((id) => !this.jobs.has(id));
    const found = await Promise.all(missing.map((id) => api(`/jobs/${encodeURIComponent(id)}`).catch(() => null)));
    found.filter(Boolean).forEach((j) => this.#add(j));
    this.order = this.order.filter((id) => this.jobs.has(id)); // unknown or not the caller's
    this.list.prepend(...this.order.map((id) => this.rows.get(id))); // what the link picked, first
    if (!this.jobs.size) this.list.replaceChildren(h("span", { class: "muted" }, "No jobs yet."));
    await this.filter(Boolean(this.search.value)); // typed while the list loaded
  }

  /** The next page of GET /jobs (newest first). One page at a time: a search and the More
   * button asking together read two pages, never one twice. */
  more() {
    this.reading = (this.reading || Promise.resolve()).catch(() => {}).then(() => this.#page());
    return this.reading;
  }

  async #page() {
    if (this.loaded && !this.cursor) return; // the last page was read
    const page = await api("/jobs", { params: { limit: PAGE, cursor: this.cursor } });
    if (!this.loaded) this.list.replaceChildren();
    this.loaded = true;
    page.items.forEach((j) => this.#add(j));
    this.cursor = page.next_cursor;
    this.moreButton.hidden = !this.cursor;
  }

  /** Show the jobs whose name, id, precision or status hold every word typed; when none
   * of the loaded ones do (`typed`), read further pages. */
  async filter(typed = false) {
    const words = this.search.value.toLowerCase().split(/\s+/).filter(Boolean);
    const matches = (j) => words.every((w) => [j.name, j.id, precisionOf(j), j.status].some((s) => s.toLowerCase().includes(w)));
    let shown = this.#apply(matches);
    for (let i = 0; typed && !shown && this.loaded && this.cursor && i < SEARCH_PAGES; i++) {
      await this.more();
      shown = this.#apply(matches);
    }
    this.count.textContent = `${shown} of ${this.jobs.size}${this.cursor ? "+" : ""} jobs shown`;
  }

  #apply(matches) {
    let shown = 0;
    for (const [id, row] of this.rows) {
      const show = matches(this.jobs.get(id));
      row.style.display = show ? "" : "none";
      shown += show;
    }
    return shown;
  }

  #add(j) {
    if (this.jobs.has(j.id)) return;
    this.jobs.set(j.id, j);
    const box = h("input", { type: "checkbox", value: j.id, dataset: { name: j.name }, checked: this.order.includes(j.id), onchange: () => this.#toggle(j.id, box.checked) });
    const row = h("label", { dataset: { job: j.id }, title: j.id }, box, ` ${j.name} `, statusBadge(j.status),
      h("span", { class: "muted small" }, ` ${precisionOf(j)} · ${fmtAge(j.created_at)}`));
    this.rows.set(j.id, row);
    this.list.append(row);
  }

  #toggle(id, on) {
    this.order = this.order.filter((x) => x !== id);
    if (on) this.order.push(id);
    this.onChange(this.picked());
  }
}
