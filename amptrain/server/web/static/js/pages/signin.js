// Sign in with an API token (`amptrain up` prints the admin token; `amptrain token create NAME`
// makes more). Checked against the API before it is kept in this tab's sessionStorage. The
// page says where a token is: the file `amptrain up` saved the admin token to (named by the
// server to a browser on its own machine only) and the command that makes one.
import { api, ApiError, token } from "../api.js";
import { h } from "../dom.js";

export function mount(root) {
  const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "off", placeholder: "API token", required: true });
  const error = h("div", { class: "error", id: "signin-error", role: "alert" });
  const button = h("button", { class: "primary", type: "submit" }, "Sign in");
  const form = h("form", { class: "card signin", onsubmit: submit },
    h("h1", {}, "Sign in to amptrain"),
    h("p", { class: "muted small" }, "Paste an API token. It stays in this browser tab only."),
    input, error, button);
  const where = h("div", { class: "small signin-where", id: "token-where" });
  form.append(where);
  root.append(form);
  input.focus();
  fetch("/ui/signin-hints.json").then((r) => (r.ok ? r.json() : null)).then((hints) => {
    if (!hints) return;
    where.append(
      hints.token_file ? h("p", {}, "The admin token is in ", h("code", { id: "token-file" }, hints.token_file),
        ", as ", h("code", {}, "amptrain up"), " printed when it started.") : null,
      h("p", { class: "muted" }, "Another token: ", h("code", { id: "token-command" }, hints.create_command),
        " on the service's machine prints one."));
  }).catch(() => {});

  async function submit(ev) {
    ev.preventDefault();
    error.textContent = "";
    button.disabled = true;
    const candidate = input.value.trim();
    try {
      await api("/jobs", { params: { limit: 1 }, auth: candidate });
      token.set(candidate);
      location.hash = "#/jobs";
    } catch (e) {
      error.textContent = e instanceof ApiError && e.status === 401
        ? "That token is not valid." : `Could not sign in: ${e.message}`;
    } finally {
      button.disabled = false;
    }
  }
}
