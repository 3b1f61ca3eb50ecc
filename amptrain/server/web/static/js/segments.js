// The precisions a job trained in over its steps (GET /jobs/{id}'s precision_history), as
// tinted bands on every chart and in words: after a health.fallback the fp16 steps and the
// bf16 ones read apart, with the attempt that trained each. One precision all along draws nothing.
const TINTS = { fp16: "#e67700", bf16: "#2b8a3e", fp32: "#2f6fde", tf32: "#862e9c" };

/** ``[{precision, from, to, until, attempt, fallback}]`` step spans: ``from`` the step the
 * entry began after (0: the start), ``to`` where the next began (Infinity for the last),
 * ``until`` the step a fallback left it at (null: none). Empty when the job trained in
 * one precision. */
export function precisionSpans(history) {
  if (!history || history.length < 2) return [];
  return history.map((s, i) => ({
    precision: s.precision || "?",
    from: s.from_step,
    to: i + 1 < history.length ? history[i + 1].from_step : Infinity,
    until: s.until_step ?? null,
    attempt: s.attempt,
    fallback: s.fallback || null,
  }));
}

/** The last step a span's precision trained (before a fallback, or up to the next span);
 * null for the last span. */
function lastStep(s) {
  if (s.until !== null) return s.until;
  return Number.isFinite(s.to) ? s.to : null;
}

/** The spans as bands behind the lines, each labelled; ``toX`` maps a step to the x axis;
 * returns the labels drawn ("fp16@0": a precision and the step its band begins after).
 * A band covers the steps whose points the chart shows in that precision: a span whose
 * steps were all trained again in the next one (a fallback with no checkpoint to resume
 * from) has none, so it draws nothing (its label over the next one's read "if16"). */
export function drawSpans(u, spans, toX) {
  const drawn = [];
  if (!spans.length) return drawn;
  const { left, top, width, height } = u.bbox;
  const px = devicePixelRatio || 1;
  const ctx = u.ctx;
  ctx.save();
  ctx.font = `${10 * px}px sans-serif`;
  // Set, not inherited: uPlot leaves its last axis' alignment on the context ("right"), which
  // drew each label ending at its band's edge, its start hidden under the y axis ("if16").
  ctx.textAlign = "left";
  ctx.textBaseline = "alphabetic";
  for (const s of spans) {
    const x0 = Math.max(left, u.valToPos(toX(s.from), "x", true));
    const x1 = Number.isFinite(s.to) ? Math.min(left + width, u.valToPos(toX(s.to), "x", true)) : left + width;
    if (!(x1 > x0)) continue;
    ctx.fillStyle = TINTS[s.precision] || "#868e96";
    ctx.globalAlpha = 0.08;
    ctx.fillRect(x0, top, x1 - x0, height);
    // The label only where it fits whole inside its band.
    const text = ctx.measureText(s.precision).width;
    if (x1 - x0 < text + 6 * px) continue;
    ctx.globalAlpha = 0.9;
    ctx.fillText(s.precision, x0 + 3 * px, top + height - 12 * px); // above the event marks' diamonds
    drawn.push(`${s.precision}@${s.from}`);
  }
  ctx.restore();
  return drawn;
}

const range = (a, b) => (a === b ? `step ${a}` : `steps ${a}–${b}`);

/** In words, for the header and for tests: each precision's steps (1-based), and from the
 * second on the attempt that trained it and the steps it trained again, e.g.
 * ``fp16 steps 1–3 · bf16 from step 1 (attempt 2, steps 1–3 trained again)``. */
export function describeSpans(spans) {
  return spans.map((s, i) => {
    const last = i + 1 < spans.length ? lastStep(s) : null;
    let text = last !== null && last > s.from ? `${s.precision} ${range(s.from + 1, last)}` : `${s.precision} from step ${s.from + 1}`;
    if (i > 0) {
      const before = lastStep(spans[i - 1]);
      const again = before !== null && before > s.from ? `, ${range(s.from + 1, before)} trained again` : "";
      text += ` (attempt ${s.attempt}${again})`;
    }
    return text;
  }).join(" · ");
}

const TRIGGERS = {
  loss_scale_floor: "its loss scale stayed below the floor",
  consecutive_skips: "too many steps in a row were skipped",
  nonfinite_loss: "its loss was not finite",
};

/** Why the job's newest precision took over, as one short sentence from the fallback's
 * fields (the event's message strings several clauses together); null without a fallback. */
export function fallbackReason(spans) {
  const i = spans.findLastIndex((s) => s.fallback);
  if (i < 1) return null;
  const { fallback: f, attempt } = spans[i];
  const why = TRIGGERS[f.trigger] || (f.trigger ? f.trigger.replaceAll("_", " ") : "it became unhealthy");
  const at = f.trigger_step != null ? ` at step ${f.trigger_step}` : "";
  const from = f.resume_from ? `its checkpoint of step ${f.resume_from}` : "the start (no healthy checkpoint)";
  return `${spans[i - 1].precision} fell back to ${f.to || spans[i].precision}${at}: ${why}. Attempt ${attempt} went on from ${from}.`;
}
