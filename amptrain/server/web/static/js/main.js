// The single page: routes live in the URL fragment (#/jobs, #/jobs/ID, #/compare, #/workers, #/alerts),
// so the server serves one index.html and the token never appears in a URL.
import { token, whenUnauthorized } from "./api.js";
import { clear, h } from "./dom.js";
import * as signin from "./pages/signin.js";
import * as jobs from "./pages/jobs.js";
import * as job from "./pages/job.js";
import * as compare from "./pages/compare.js";
import * as workers from "./pages/workers.js";
import * as alerts from "./pages/alerts.js";

const main = document.getElementById("main");
let unmount = null;

function route() {
  const [path, query = ""] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(query);
  if (!token.get() && parts[0] !== "signin") return { page: signin, name: "signin", args: {} };
  switch (parts[0]) {
    case "signin": return { page: signin, name: "signin", args: {} };
    case "jobs": return parts[1] ? { page: job, name: "jobs", args: { id: parts[1] } } : { page: jobs, name: "jobs", args: {} };
    case "compare": return { page: compare, name: "compare", args: { id: parts[1], jobs: params.get("jobs") } };
    case "workers": return { page: workers, name: "workers", args: {} };
    case "alerts": return { page: alerts, name: "alerts", args: {} };
    default: return { page: jobs, name: "jobs", args: {} };
  }
}

function render() {
  if (unmount) { try { unmount(); } catch (e) { console.warn("unmount failed", e); } }
  unmount = null;
  const { page, name, args } = route();
  const signedIn = Boolean(token.get());
  document.getElementById("nav").hidden = !signedIn;
  document.getElementById("signout").hidden = !signedIn;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === name);
  clear(main);
  const root = h("div", { class: `page page-${name}` });
  main.append(root);
  unmount = page.mount(root, args) || null;
}

whenUnauthorized(() => {
  token.clear();
  location.hash = "#/signin";
});
document.getElementById("signout").addEventListener("click", () => {
  token.clear();
  location.hash = "#/signin";
});
window.addEventListener("hashchange", render);
render();
