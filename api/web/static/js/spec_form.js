// The submit form, built from GET /catalog: models, datasets, optimizers, schedules and
// precisions with their arguments, defaults and bounds. The API decides what is valid:
// the form does no validation of its own (novalidate) and shows each 422 problem beside
// the field it names (`optimizer.lr`, `model.args.width`, ...).
import { h, clear } from "./dom.js";

const DEVICES = ["auto", "cpu", "cuda"];

/** A form element; `onSubmit(spec)` returns a Promise that rejects with an ApiError. */
export function specForm(catalog, { onSubmit, submitLabel = "Submit job", extra = null, omit = [] }) {
  const errors = new Map(); // field path -> error element
  const formError = h("div", { class: "form-error", role: "alert" });
  const byName = {};

  function field(path, label, input, help) {
    const err = h("div", { class: "field-error", dataset: { errorFor: path } });
    errors.set(path, err);
    input.name = path;
    input.id = `f-${path.replaceAll(".", "-")}`;
    byName[path] = input;
    return h("div", { class: "field", dataset: { field: path } },
      h("label", { for: input.id, title: help || "" }, label), input, err);
  }

  function argInput(arg) {
    if (arg.choices) {
      return h("select", {}, h("option", { value: "" }, `default (${arg.default})`),
        arg.choices.map((c) => h("option", { value: String(c) }, String(c))));
    }
    if (arg.type === "bool") {
      return h("select", {}, h("option", { value: "" }, `default (${arg.default})`),
        h("option", { value: "true" }, "true"), h("option", { value: "false" }, "false"));
    }
    const numeric = arg.type === "int" || arg.type === "float" || typeof arg.default === "number";
    const bounds = [arg.minimum != null ? `≥ ${arg.minimum}` : "", arg.maximum != null ? `≤ ${arg.maximum}` : ""].filter(Boolean).join(", ");
    return h("input", {
      type: numeric ? "number" : "text", step: "any",
      placeholder: arg.default === undefined || arg.default === null ? "" : String(arg.default),
      min: arg.minimum ?? undefined, max: arg.maximum ?? undefined,
      title: [arg.help, bounds].filter(Boolean).join(" "),
      dataset: { type: arg.type || typeof arg.default },
    });
  }

  function argFields(prefix, args) {
    return (args || []).map((a) => field(`${prefix}.${a.name}`, a.name, argInput(a), a.help));
  }

  function componentSet(key, title, entries, argPrefix) {
    const names = Object.keys(entries);
    const select = h("select", {}, names.map((n) => h("option", { value: n, title: entries[n].description || "" }, n)));
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
    field("device", "device", h("select", {}, DEVICES.map((d) => h("option", { value: d }, d)))),
    field("queue", "queue", h("input", { type: "text", placeholder: "(by device)" })),
  ));
  const form = h("form", { class: "spec", novalidate: true, onsubmit: submit },
    general,
    componentSet("model", "Model", catalog.models, "model.args"),
    componentSet("dataset", "Dataset", catalog.datasets, "dataset.args"),
    componentSet("optimizer", "Optimizer", catalog.optimizers, "optimizer"),
    componentSet("schedule", "Schedule", catalog.schedules, "schedule"),
    extra, formError,
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

function parse(input) {
  const raw = input.value.trim();
  if (raw === "") return undefined;
  const type = input.dataset.type;
  if (raw === "true" || raw === "false") return raw === "true";
  if (input.type === "number") return Number(raw);
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
