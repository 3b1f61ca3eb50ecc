// The submit form, built from GET /catalog: models, datasets, optimizers, schedules and
// precisions with their arguments, defaults and bounds. The API decides what is valid:
// the form blocks nothing (novalidate) and shows each 422 problem beside the field it
// names (`optimizer.lr`, `model.args.width`, ...). Bounds are shown on every field and a
// value outside them is marked as it is typed, so most 422s are seen before submitting.
import { h, clear } from "./dom.js";

const DEVICES = ["auto", "cpu", "cuda"];
/** ``health.fallback``'s choices (contract/health_spec.py's Fallback; a browser test checks
 * they match the API's schema). */
const FALLBACKS = ["none", "auto", "bf16", "fp32"];

/** A select of "default (…)" and `choices`. */
function choice(defaultText, choices) {
  return h("select", {}, h("option", { value: "" }, `default (${defaultText})`), choices.map((c) => h("option", { value: c }, c)));
}

/** A form element; `onSubmit(spec)` returns a Promise that rejects with an ApiError. */
export function specForm(catalog, { onSubmit, submitLabel = "Submit job", extra = null, omit = [] }) {
  const errors = new Map(); // field path -> error element
  const formError = h("div", { class: "form-error", role: "alert" });
  const byName = {};

  function field(path, label, input, help, bounds = catalog.limits?.[path]) {
    const err = h("div", { class: "field-error", dataset: { errorFor: path } });
    errors.set(path, err);
    input.name = path;
    input.id = `f-${path.replaceAll(".", "-")}`;
    byName[path] = input;
    const limitText = applyBounds(input, bounds || {});
    if (limitText) input.title = [help, limitText].filter(Boolean).join(" ");
    const wrap = h("div", { class: "field", dataset: { field: path } },
      h("label", { for: input.id, title: help || "" }, label), input, err);
    input.addEventListener("input", () => {
      const problem = bounds ? outOfBounds(parse(input), bounds) : "";
      err.textContent = problem;
      wrap.classList.toggle("invalid", Boolean(problem));
    });
    return wrap;
  }

  /** A component argument's bounds: its own (models, datasets) or its `limits` (optimizer,
   * schedule: one set, or one per tuple item keyed by field path, shown but not checked). */
  function argBounds(prefix, arg) {
    if (arg.limits) {
      const keys = Object.keys(arg.limits);
      return keys.length && keys.every((k) => k.includes(".")) ? { items: arg.limits } : arg.limits;
    }
    const b = { minimum: arg.minimum, maximum: arg.maximum, max_length: arg.max_length };
    return Object.values(b).some((v) => v != null) ? b : catalog.limits?.[`${prefix}.${arg.name}`];
  }

  function argInput(arg) {
    if (arg.choices) {
      // An option's value is text: the type says to send a number choice as a number.
      return h("select", { dataset: { type: arg.type || typeof arg.default } },
        h("option", { value: "" }, `default (${arg.default})`),
        arg.choices.map((c) => h("option", { value: String(c) }, String(c))));
    }
    if (arg.type === "bool") {
      return h("select", {}, h("option", { value: "" }, `default (${arg.default})`),
        h("option", { value: "true" }, "true"), h("option", { value: "false" }, "false"));
    }
    const numeric = arg.type === "int" || arg.type === "float" || typeof arg.default === "number";
    return h("input", {
      type: numeric ? "number" : "text", step: "any",
      placeholder: arg.default === undefined || arg.default === null ? "" : String(arg.default),
      title: arg.help || "",
      dataset: { type: arg.type || typeof arg.default },
    });
  }

  function argFields(prefix, args) {
    return (args || []).map((a) =>
      field(`${prefix}.${a.name}`, a.name, argInput(a), a.help, argBounds(prefix, a)));
  }

  function componentSet(key, title, entries, argPrefix) {
    const names = Object.keys(entries);
    const option = (n) => h("option", { value: n, title: entries[n].description || "" }, n);
    // Models come from several libraries (amptrain's own, torchvision, timm, transformers,
    // plugins): one group each, in the catalog's order, when there is more than one.
    const groups = new Map();
    for (const n of names) {
      const lib = entries[n].library || entries[n].source || "";
      groups.set(lib, [...(groups.get(lib) || []), n]);
    }
    const select = h("select", {}, groups.size > 1
      ? [...groups].map(([lib, ns]) => h("optgroup", { label: lib }, ns.map(option)))
      : names.map(option));
    const args = h("div", { class: "fields-args" });
    const redraw = () => {
      for (const input of args.querySelectorAll("[name]")) {
        errors.delete(input.name);
        delete byName[input.name];
      }
      clear(args, argFields(argPrefix, entries[select.value]?.args));
    };
    select.addEventListener("change", redraw);
    const set = h("fieldset", {}, h("legend", {}, title),
      h("div", { class: "fields" }, field(`${key}.name`, "name", select), args));
    redraw();
    return set;
  }

  const precision = h("select", {}, Object.values(catalog.precisions).map((p) =>
    h("option", { value: p.name, title: p.description }, p.name)));
  const general = h("fieldset", {}, h("legend", {}, "Job"), h("div", { class: "fields" },
    field("name", "name", h("input", { type: "text", placeholder: "job" })),
    field("max_steps", "max_steps (required)", h("input", { type: "number", step: "1", value: "200" })),
    omit.includes("precision") ? null : field("precision", "precision", precision),
    field("batch_size", "batch_size", h("input", { type: "number", step: "1", placeholder: "64" })),
    field("seed", "seed", h("input", { type: "number", step: "1", placeholder: "0" }),
      "Seeds every random number generator: runs that differ only by seed form a seed group on the compare page."),
    field("device", "device", h("select", {}, DEVICES.map((d) => h("option", { value: d }, d)))),
    field("queue", "queue", h("input", { type: "text", placeholder: "(by device)" })),
    field("weights.path", "weights.path", h("input", { type: "text", placeholder: "(none)" }),
      "Start from a .safetensors file under the service's weights roots (an export)."),
    field("weights.strict", "weights.strict", h("select", {}, h("option", { value: "" }, "default (true)"),
      h("option", { value: "true" }, "true"), h("option", { value: "false" }, "false")),
      "false: load what matches (e.g. a new head) and report what was left out."),
  ));
  // Held-out evaluation and the numerics guardian: a fallback demo (fp16 with health.fallback
  // bf16 and a dataset's feature_scale 1e6) is made from here.
  const checks = h("fieldset", { id: "spec-checks" }, h("legend", {}, "Evaluation and health"), h("div", { class: "fields" },
    field("eval.every_steps", "eval.every_steps", h("input", { type: "number", step: "1", placeholder: "0 (at the end only)" }),
      "Evaluate on the held-out split after every this many steps; 0: only at the end."),
    field("eval.batches", "eval.batches", h("input", { type: "number", step: "1", placeholder: "20" }), "Batches per evaluation."),
    field("eval.at_end", "eval.at_end", choice("true", ["true", "false"]), "Evaluate after the last step."),
    field("health.fallback", "health.fallback", choice("by precision", FALLBACKS),
      "What an unhealthy fp16 run does: none fails naming the step; bf16, fp32 or auto go on in that precision from the last healthy checkpoint."),
    field("health.max_consecutive_skips", "health.max_consecutive_skips", h("input", { type: "number", step: "1", placeholder: "(no limit)" }),
      "fp16: unhealthy after more than this many consecutive skipped steps."),
    field("health.warn_loss_scale_below", "health.warn_loss_scale_below", h("input", { type: "number", step: "any", placeholder: "128" }),
      "fp16: a warning when the loss scale falls below this."),
  ));
  const form = h("form", { class: "spec", novalidate: true, onsubmit: submit },
    general,
    componentSet("model", "Model", catalog.models, "model.args"),
    componentSet("dataset", "Dataset", catalog.datasets, "dataset.args"),
    componentSet("optimizer", "Optimizer", catalog.optimizers, "optimizer"),
    componentSet("schedule", "Schedule", catalog.schedules, "schedule"),
    checks, extra, formError,
    h("button", { class: "primary", type: "submit" }, submitLabel));

  function collect() {
    const spec = {};
    for (const input of form.querySelectorAll("[name]")) {
      const path = input.name;
      if (!byName[path] || byName[path] !== input) continue;
      const value = parse(input);
      if (value === undefined) continue;
      setPath(spec, path.split("."), value);
    }
    return spec;
  }

  async function submit(ev) {
    ev.preventDefault();
    showErrors({}, "");
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    try {
      await onSubmit(collect(), form);
    } catch (e) {
      const fields = e.fieldErrors ? e.fieldErrors() : {};
      showErrors(fields, Object.keys(fields).length ? "" : e.message);
    } finally {
      button.disabled = false;
    }
  }

  /** Each problem beside its field; problems of fields the form has no input for on top. */
  function showErrors(fields, message) {
    for (const [path, el] of errors) {
      el.textContent = fields[path] || "";
      el.parentElement.classList.toggle("invalid", Boolean(fields[path]));
    }
    const unplaced = Object.entries(fields).filter(([p]) => !errors.has(p)).map(([p, m]) => `${p}: ${m}`);
    formError.textContent = [message, ...unplaced].filter(Boolean).join(" · ");
  }

  form.showErrors = showErrors;
  return form;
}

/** Puts `bounds` ({minimum, exclusive_minimum, maximum, exclusive_maximum, min_length,
 * max_length, pattern} or {items: {path: bounds}}) on the input; returns them as text. */
function applyBounds(input, bounds) {
  if (bounds.items) {
    return Object.entries(bounds.items).map(([k, b]) => `${k.split(".").at(-1)}: ${boundsText(b)}`).join("; ");
  }
  if (input.type === "number") {
    const min = bounds.minimum ?? bounds.exclusive_minimum;
    const max = bounds.maximum ?? bounds.exclusive_maximum;
    if (min != null) input.min = String(min);
    if (max != null) input.max = String(max);
  } else if (input.tagName === "INPUT") {
    // No `pattern` attribute: the browser compiles it with the `v` flag, where the API's
    // regular expressions need not be valid; it is shown in the title instead.
    if (bounds.max_length != null) input.maxLength = bounds.max_length;
  }
  return boundsText(bounds);
}

function boundsText(b) {
  return [
    b.minimum != null ? `≥ ${b.minimum}` : "", b.exclusive_minimum != null ? `> ${b.exclusive_minimum}` : "",
    b.maximum != null ? `≤ ${b.maximum}` : "", b.exclusive_maximum != null ? `< ${b.exclusive_maximum}` : "",
    b.min_length != null ? `at least ${b.min_length} characters` : "",
    b.max_length != null ? `at most ${b.max_length} characters` : "",
    b.pattern ? `matching ${b.pattern}` : "",
  ].filter(Boolean).join(", ");
}

/** Why `value` is outside `bounds` (numbers only; "" when inside or not a number). */
function outOfBounds(value, b) {
  if (typeof value !== "number" || Number.isNaN(value)) return "";
  if (b.minimum != null && value < b.minimum) return `must be ≥ ${b.minimum}`;
  if (b.exclusive_minimum != null && value <= b.exclusive_minimum) return `must be > ${b.exclusive_minimum}`;
  if (b.maximum != null && value > b.maximum) return `must be ≤ ${b.maximum}`;
  if (b.exclusive_maximum != null && value >= b.exclusive_maximum) return `must be < ${b.exclusive_maximum}`;
  return "";
}

function parse(input) {
  const raw = input.value.trim();
  if (raw === "") return undefined;
  const type = input.dataset.type;
  if (raw === "true" || raw === "false") return raw === "true";
  if (input.type === "number" || type === "int" || type === "float" || type === "number") {
    return Number(raw);
  }
  if (type === "object" || raw.startsWith("[")) {
    try { return JSON.parse(raw.startsWith("[") ? raw : `[${raw}]`); } catch { return raw; }
  }
  return raw;
}

function setPath(obj, keys, value) {
  let o = obj;
  for (const k of keys.slice(0, -1)) o = o[k] ??= {};
  o[keys.at(-1)] = value;
}
