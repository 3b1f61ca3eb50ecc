// One chart's points in step order: downsampled history, spliced full-resolution windows
// and the live tail, merged so that a step is never drawn twice. `bucketEnd` tells which
// points stand for a run of steps evenly (a bucket's last, or a point of full resolution):
// smoothing reads only those, never the minima and maxima kept so spikes stay visible.

export class Series {
  constructor(fields) {
    this.fields = fields;
    this.reset();
  }

  reset() {
    this.step = [];
    this.time = [];
    this.skipped = [];
    this.downsampled = [];
    this.bucketEnd = [];
    this.cols = Object.fromEntries(this.fields.map((f) => [f, []]));
    this.buckets = []; // [{from_step, to_step, skipped, non_finite}] from the server
  }

  get length() { return this.step.length; }
  get lastStep() { return this.step.length ? this.step[this.step.length - 1] : -Infinity; }

  /** Replace everything with a history answer (items in step order). */
  load(items, marks) {
    this.reset();
    for (const p of items) this.#push(p);
    this.buckets = marks || [];
  }

  /** A live point. A step at or below the last one means a resumed attempt took over from
   * there (the effective series): what followed it is dropped, as the API does. */
  append(p) {
    if (p.step <= this.lastStep) this.#truncate(this.#firstAtOrAbove(p.step));
    this.#push(p);
  }

  /** Replace steps from..to by a full-resolution (or finer) answer for that window. */
  splice(from, to, items, marks) {
    const i0 = this.#firstAtOrAbove(from);
    const i1 = this.#firstAtOrAbove(to + 1);
    const tail = this.#slice(i1);
    this.#truncate(i0);
    for (const p of items) this.#push(p);
    for (let i = 0; i < tail.step.length; i++) this.#pushArrays(tail, i);
    this.buckets = this.buckets.filter((b) => b.to_step < from || b.from_step > to).concat(marks || []);
  }

  /** Whether any point in steps from..to stands for a bucket (so a zoom should fetch more). */
  coarseWithin(from, to) {
    const i0 = this.#firstAtOrAbove(from);
    for (let i = i0; i < this.step.length && this.step[i] <= to; i++) if (this.downsampled[i]) return true;
    return false;
  }

  /** Whether point i is skipped, or non-finite in `watch` (null in JSON; a grad norm is
   * also null, by design, on a skipped step). */
  flagsAt(i, watch = "loss") {
    const skipped = this.skipped[i] === true;
    const value = this.fields.includes(watch) ? this.cols[watch][i] : undefined;
    const nonFinite = value === null && (watch === "loss" || !skipped);
    return { skipped, nonFinite };
  }

  /** Steps between the bucket ends of the downsampled part (the median), 1 when none is. */
  bucketSpacing() {
    const ends = this.step.filter((_, i) => this.downsampled[i] && this.bucketEnd[i]);
    if (ends.length < 2) return 1;
    const gaps = ends.slice(1).map((s, i) => s - ends[i]).sort((a, b) => a - b);
    return gaps[gaps.length >> 1];
  }

  stepToTime(step) {
    const i = Math.min(this.#firstAtOrAbove(step), this.step.length - 1);
    return i >= 0 ? this.time[i] : null;
  }

  #push(p) {
    this.step.push(p.step);
    this.time.push(p.time ?? null);
    this.skipped.push(p.skipped ?? null);
    this.downsampled.push(Boolean(p.downsampled));
    this.bucketEnd.push(!p.downsampled || Boolean(p.bucket_last));
    for (const f of this.fields) this.cols[f].push(p[f] ?? null);
  }

  #pushArrays(src, i) {
    this.step.push(src.step[i]);
    this.time.push(src.time[i]);
    this.skipped.push(src.skipped[i]);
    this.downsampled.push(src.downsampled[i]);
    this.bucketEnd.push(src.bucketEnd[i]);
    for (const f of this.fields) this.cols[f].push(src.cols[f][i]);
  }

  #slice(i) {
    return {
      step: this.step.slice(i), time: this.time.slice(i), skipped: this.skipped.slice(i),
      downsampled: this.downsampled.slice(i), bucketEnd: this.bucketEnd.slice(i),
      cols: Object.fromEntries(this.fields.map((f) => [f, this.cols[f].slice(i)])),
    };
  }

  #truncate(i) {
    for (const arr of [this.step, this.time, this.skipped, this.downsampled, this.bucketEnd, ...Object.values(this.cols)]) arr.length = i;
  }

  #firstAtOrAbove(step) {
    let lo = 0;
    let hi = this.step.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.step[mid] < step) lo = mid + 1; else hi = mid;
    }
    return lo;
  }
}

/** Debiased exponential moving average (as TensorBoard smooths); nulls stay gaps. */
export function smooth(ys, weight) {
  const out = new Array(ys.length);
  let last = 0;
  let debias = 0;
  for (let i = 0; i < ys.length; i++) {
    const y = ys[i];
    if (y === null || !Number.isFinite(y)) { out[i] = null; continue; }
    last = last * weight + (1 - weight) * y;
    debias = debias * weight + (1 - weight);
    out[i] = last / debias;
  }
  return out;
}

/** Field `f` of `series` smoothed over its bucket ends (every point at full resolution);
 * the points between two ends read the line between them, and gaps stay gaps. */
export function smoothSeries(series, f, weight) {
  const ys = series.cols[f];
  const ends = [];
  for (let i = 0; i < ys.length; i++) if (series.bucketEnd[i] || ys[i] === null) ends.push(i);
  const smoothed = smooth(ends.map((i) => ys[i]), weight);
  const out = new Array(ys.length).fill(null);
  const xs = series.step;
  ends.forEach((i, k) => {
    out[i] = smoothed[k];
    const j = ends[k + 1];
    if (j === undefined || smoothed[k] === null || smoothed[k + 1] === null) return;
    for (let m = i + 1; m < j; m++) {
      if (ys[m] === null) continue;
      const t = (xs[m] - xs[i]) / (xs[j] - xs[i]);
      out[m] = smoothed[k] + t * (smoothed[k + 1] - smoothed[k]);
    }
  });
  return out;
}
