// A job's live feed over WebSocket: history after a cursor, then the live tail. It
// reconnects with the last cursor it saw (no gap, no duplicate), backing off while the
// API is unreachable, and stops for good after `end`. It asks for batch frames: the
// records of one delivery arrive as one `batch` message (fewer frames for the server to
// send and for the page to parse), each item handled exactly like a single message.
import { openJobSocket } from "./api.js";

const BACKOFF_MS = [250, 500, 1000, 2000, 5000];

export class LiveFeed {
  constructor(jobId, after, { onMetric, onEval, onLayerNorms, onEvent, onEnd, onState }) {
    this.jobId = jobId;
    this.cursor = after;
    this.handlers = { onMetric, onEval, onLayerNorms, onEvent, onEnd, onState };
    this.ws = null;
    this.failures = 0;
    this.stopped = false;
    this.ended = false;
    this.timer = null;
  }

  start() {
    if (this.stopped || this.ended) return;
    this.handlers.onState?.("connecting");
    const ws = openJobSocket(this.jobId, this.cursor, { batch: true });
    this.ws = ws;
    ws.onopen = () => { this.failures = 0; this.handlers.onState?.("live"); };
    ws.onmessage = (ev) => this.#receive(JSON.parse(ev.data));
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (this.stopped || this.ended) return;
      if (ev.code === 1008) { this.handlers.onState?.("refused"); return; }
      const wait = BACKOFF_MS[Math.min(this.failures++, BACKOFF_MS.length - 1)];
      this.handlers.onState?.(`reconnecting in ${(wait / 1000).toFixed(1)} s`);
      this.timer = setTimeout(() => this.start(), wait);
    };
  }

  #receive(msg) {
    if (msg.type === "batch") {
      for (const item of msg.items) this.#receive(item);
      this.cursor = msg.cursor;
    } else if (msg.type === "metric") {
      this.cursor = msg.cursor;
      this.handlers.onMetric?.(msg.data);
    } else if (msg.type === "eval") {
      this.cursor = msg.cursor;
      this.handlers.onEval?.(msg.data);
    } else if (msg.type === "layer_grad_norm") {
      this.cursor = msg.cursor;
      this.handlers.onLayerNorms?.(msg.data);
    } else if (msg.type === "event") {
      this.cursor = msg.cursor;
      this.handlers.onEvent?.(msg.data);
    } else if (msg.type === "end") {
      this.ended = true;
      this.handlers.onState?.("ended");
      this.handlers.onEnd?.(msg.data);
    } else if (msg.type === "gap" || msg.type === "heartbeat") {
      if (msg.cursor) this.cursor = msg.cursor;
    }
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      ws.close(1000);
    }
  }
}
