// What the overlay draws, computed from the runs' answers: one line per run (smoothed over
// one point per bucket), seed groups as a mean with its min and max, and each line's
// difference to a baseline line. Pure functions: no DOM, no fetching.
import { smooth } from "./series.js";

/** A run's [xs, ys] for `field` of /metrics items, or of /evals items (`values[field]`);
 * xs are steps, or with `origin` (unix seconds) the seconds since then. With `weight` > 0
 * the line is smoothed (debiased EMA, as on the job page). A downsampled answer keeps each bucket's first, last, min and max: smoothing those keeps the line looking
 * raw, so where items say which point is their bucket's last (`bucket_last`) only those
 * (and full-resolution points) are smoothed, evenly spaced. */
export function linePoints(items, field, { evals = false, weight = 0, origin = null } = {}) {
  const value = evals ? (i) => i.values?.[field] ?? null : (i) => i[field] ?? null;
  const even = weight > 0 && items.some((i) => "bucket_last" in i);
  const kept = even ? items.filter((i) => !i.downsampled || i.bucket_last) : items;
  const xs = origin === null ? kept.map((i) => i.step) : kept.map((i) => i.time - origin);
  const ys = kept.map(value);
  return [xs, weight > 0 ? smooth(ys, weight) : ys];
}

/** The spec of a job without what tells seed runs apart: runs with the same key are one
 * group. Keys are sorted so that the order fields were written in does not matter. */
export function groupKey(spec) {
  const { seed, name, ...rest } = spec || {};
  const canon = (v) => (Array.isArray(v) ? v.map(canon)
    : v && typeof v === "object" ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, canon(v[k])])) : v);
  return JSON.stringify(canon(rest));
}

/** Runs ([{job, line}]) in groups of equal groupKey, in the order of each group's first run. */
export function seedGroups(runs) {
  const groups = new Map();
  for (const r of runs) {
    const key = groupKey(r.job.spec);
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(r);
  }
  return [...groups.values()];
}

/** Linear interpolation of the line [xs, ys] (xs ascending) at x; null outside it or
 * beside a gap. */
export function valueAt([xs, ys], x) {
  let lo = 0;
  let hi = xs.length - 1;
  if (hi < 0 || x < xs[0] || x > xs[hi]) return null;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= x) lo = mid; else hi = mid;
  }
  if (xs[lo] === x) return ys[lo];
  if (xs[hi] === x) return ys[hi];
  if (ys[lo] === null || ys[hi] === null) return null;
  return ys[lo] + ((ys[hi] - ys[lo]) * (x - xs[lo])) / (xs[hi] - xs[lo]);
}

/** The union of the lines' steps, ascending. */
function unionXs(lines) {
  return [...new Set(lines.flatMap(([xs]) => xs))].sort((a, b) => a - b);
}

/** Mean, min and max of the lines at every step of any of them (each line read by
 * interpolation, so runs downsampled into different buckets still line up). */
export function meanBand(lines) {
  const xs = unionXs(lines);
  const mean = [];
  const min = [];
  const max = [];
  for (const x of xs) {
    const vs = lines.map((l) => valueAt(l, x)).filter((v) => v !== null && Number.isFinite(v));
    mean.push(vs.length ? vs.reduce((a, b) => a + b, 0) / vs.length : null);
    min.push(vs.length ? Math.min(...vs) : null);
    max.push(vs.length ? Math.max(...vs) : null);
  }
  return { xs, mean, min, max };
}

/** `line` minus `base` at each of line's steps where base has a value. */
export function difference(line, base) {
  const [xs, ys] = line;
  const out = [[], []];
  xs.forEach((x, i) => {
    const b = valueAt(base, x);
    if (b === null || ys[i] === null) return;
    out[0].push(x);
    out[1].push(ys[i] - b);
  });
  return out;
}

/** The run the others are measured against: the first fp32 one, else the first. */
export function baselineIndex(jobs) {
  const i = jobs.findIndex((j) => (j.precision?.effective || j.precision?.requested || j.spec?.precision) === "fp32");
  return i === -1 ? 0 : i;
}

/** Groups (of 2 or more) of lines with the same points: drawn on top of each other, only the
 * last is seen. Values equal to 12 significant digits count as the same. */
export function identicalLines(lines) {
  const key = (l) => JSON.stringify([l.xs, l.ys.map((y) => (y === null ? null : Number(y.toPrecision(12))))]);
  const groups = new Map();
  for (const l of lines) {
    if (!l.xs.length) continue;
    const k = key(l);
    if (!groups.has(k)) groups.set(k, []);
    groups.get(k).push(l);
  }
  return [...groups.values()].filter((g) => g.length > 1);
}

/** A spec as {"optimizer.lr": 0.001, ...}: the leaves by their dotted path. */
function leaves(obj, prefix = "", out = {}) {
  for (const [k, v] of Object.entries(obj || {})) {
    const path = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v)) leaves(v, path, out);
    else out[path] = v;
  }
  return out;
}

/** A spec value as a label reads it: 0.001 as 1e-3, 1000000 as 1e6. */
function short(v) {
  if (typeof v === "number" && v !== 0 && (Math.abs(v) < 1e-2 || Math.abs(v) >= 1e5)) return v.toExponential().replace(/\.?0*e\+?/, "e");
  return Array.isArray(v) ? v.join(",") : String(v);
}

/** What names a spec field in a label: component names by their value alone ("mlp"), other
 * fields by their last part ("lr 1e-3"). */
function part(path, v) {
  return path === "precision" || path.endsWith(".name") ? short(v) : `${path.split(".").at(-1)} ${short(v)}`;
}

/** Each seed group's label, from what its runs share: the precision they trained in, the
 * spec fields that set the groups apart (up to three; the learning rate when nothing
 * does), and how many seeds: "bf16 · lr 1e-3 · 3 seeds". A lone run keeps its job's name. */
export function groupLabels(groups) {
  const specs = groups.map((g) => leaves(g[0].job.spec));
  const paths = [...new Set(specs.flatMap((s) => Object.keys(s)))]
    .filter((p) => p !== "seed" && p !== "name" && p !== "precision")
    .filter((p) => new Set(specs.map((s) => JSON.stringify(s[p]))).size > 1);
  const shown = paths.length ? paths.slice(0, 3) : ["optimizer.lr"];
  return groups.map((g, i) => {
    if (g.length === 1) return g[0].job.name;
    const job = g[0].job;
    const precision = job.precision?.effective || job.spec?.precision || "?";
    const fields = shown.filter((p) => specs[i][p] !== undefined).map((p) => part(p, specs[i][p]));
    return [precision, ...fields, `${g.length} seeds`].join(" · ");
  });
}
