// The parameters whose gradients overflowed first in skipped fp16 steps (the job's
// summary.overflow_counts, most first), listed under the loss-scale chart.
import { clear, h } from "./dom.js";

const TOP = 5;

/** Fill `el` with the top offenders of `counts` ({param: skipped steps}); empty: nothing. */
export function showOffenders(el, counts) {
  const entries = Object.entries(counts || {}).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
  if (!entries.length) return clear(el);
  const rest = entries.length - TOP;
  return clear(el,
    h("div", { class: "muted" }, "First non-finite gradient (backward order) in skipped steps:"),
    h("ol", {}, entries.slice(0, TOP).map(([param, n]) =>
      h("li", { dataset: { offender: param } }, h("span", { class: "mono" }, param), ` × ${n}`))),
    rest > 0 ? h("div", { class: "muted" }, `and ${rest} more`) : null);
}
