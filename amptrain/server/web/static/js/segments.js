// The precisions a job trained in over its steps (GET /jobs/{id}'s precision_history), as
// tinted bands on every chart: after a health.fallback the fp16 steps and the bf16 ones
// read apart. One precision all along draws nothing.
const TINTS = { fp16: "#e67700", bf16: "#2b8a3e", fp32: "#2f6fde", tf32: "#862e9c" };

/** ``[{precision, from, to}]`` step spans, the last one open-ended (to Infinity); empty
 * when the job trained in one precision. */
export function precisionSpans(history) {
  if (!history || history.length < 2) return [];
  return history.map((s, i) => ({
    precision: s.precision || "?",
    from: s.from_step,
    to: i + 1 < history.length ? history[i + 1].from_step : Infinity,
  }));
}

/** The spans as bands behind the lines, each labelled; ``toX`` maps a step to the x axis. */
export function drawSpans(u, spans, toX) {
  if (!spans.length) return;
  const { left, top, width, height } = u.bbox;
  const px = devicePixelRatio || 1;
  const ctx = u.ctx;
  ctx.save();
  for (const s of spans) {
    const x0 = Math.max(left, u.valToPos(toX(s.from), "x", true));
    const x1 = Number.isFinite(s.to) ? Math.min(left + width, u.valToPos(toX(s.to), "x", true)) : left + width;
    if (!(x1 > x0)) continue;
    ctx.fillStyle = TINTS[s.precision] || "#868e96";
    ctx.globalAlpha = 0.08;
    ctx.fillRect(x0, top, x1 - x0, height);
    ctx.globalAlpha = 0.9;
    ctx.font = `${10 * px}px sans-serif`;
    ctx.fillText(s.precision, x0 + 3 * px, top + height - 4 * px);
  }
  ctx.restore();
}

/** In words, for the header and for tests: ``fp16 from step 0 · bf16 from step 6``. */
export function describeSpans(spans) {
  return spans.map((s) => `${s.precision} from step ${s.from}`).join(" · ");
}
