// Live workers: devices (GPU, compute capability, memory, bf16 and tensor-core support,
// versions), queues and current jobs; polled while the page is open.
import { api } from "../api.js";
import { clear, fmtBytes, fmtNum, h } from "../dom.js";

const POLL_MS = 3000;

function device(d) {
  const caps = d.type === "cuda"
    ? [`cc ${d.compute_capability}`, d.bf16 ? "bf16" : "no bf16", d.tensor_cores ? "tensor cores" : "no tensor cores"]
    : [`${d.cores} cores`, d.amx ? "AMX" : "no AMX", d.isa];
  const auto = d.auto_precision ? ` · auto → ${d.auto_precision.effective}` : "";
  return h("div", { class: "small" }, h("strong", {}, d.type === "cuda" ? `cuda:${d.index} ${d.name}` : `cpu ${d.name}`),
    ` · ${fmtBytes(d.memory_bytes)} · ${caps.filter(Boolean).join(", ")}${auto}`);
}

export function mount(root) {
  const body = h("div", { id: "workers" }, h("span", { class: "muted" }, "Loading…"));
  root.append(h("h1", {}, "Workers"), body);
  let timer = null;
  let stopped = false;

  async function poll() {
    try {
      const { items } = await api("/workers");
      if (stopped) return;
      // Only admins see where workers run (name, host name, pids): others get "worker N".
      clear(body, items.length ? items.map((w, i) => h("div", { class: "card", dataset: { worker: w.name || `${i + 1}` } },
        h("div", { class: "row" }, h("h2", {}, w.name || `worker ${i + 1}`), h("span", { class: "muted small" },
          `${w.hostname ? `${w.hostname} · ` : ""}queues ${(w.queues || []).join(", ")} · concurrency ${w.concurrency ?? "–"} · heartbeat ${w.last_heartbeat ? `${Math.max(0, Date.now() / 1000 - w.last_heartbeat).toFixed(0)} s ago` : "–"}`)),
        h("div", { class: "grid2" },
          h("div", {}, h("div", { class: "small muted" }, "Devices"), (w.devices || []).map(device),
            h("div", { class: "small muted", style: "margin-top:6px" }, "Versions"),
            h("div", { class: "mono" }, Object.entries(w.versions || {}).map(([k, v]) => `${k} ${v ?? "–"}`).join(" · ") || "–")),
          h("div", {}, h("div", { class: "small muted" }, "Current jobs"),
            (w.current_jobs || []).length ? w.current_jobs.map((j) => h("div", {},
              // The job by its name (people know their jobs by name), its id in the tooltip.
              j.job_id ? h("a", { href: `#/jobs/${encodeURIComponent(j.job_id)}`, title: j.job_id, class: "job-link", dataset: { jobId: j.job_id } }, j.name || j.job_id)
                : h("span", { class: "muted" }, "(another user's job)"),
              j.reservation ? ` · ${reservationText(j)}` : "",
              j.step != null ? ` · step ${j.step}` : "", j.samples_per_second != null ? ` · ${fmtNum(j.samples_per_second, 3)} samples/s` : "")) : h("span", { class: "muted" }, "idle")))))
        : h("p", { class: "muted" }, "No live workers."));
    } catch (e) {
      clear(body, h("p", { class: "error" }, `Could not load workers: ${e.message}`));
    }
    if (!stopped) timer = setTimeout(poll, POLL_MS);
  }
  poll();
  return () => { stopped = true; clearTimeout(timer); };
}

// A slot holding a node of a multi-node job: reserved (waiting for the other nodes) or training.
function reservationText(j) {
  const node = j.node != null ? `node ${j.node}` : "a node";
  return j.reservation === "waiting" ? `${node} reserved, waiting for the other nodes` : `${node} of a multi-node job`;
}
