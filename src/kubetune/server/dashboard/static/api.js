/* kubetune dashboard: the API key, requests, streams (SSE and text read with fetch, so the key travels in the
   Authorization header, never in a URL) and small DOM helpers. */
"use strict";
const KT = window.KT = {};
const KEY_STORAGE = "kubetune.apiKey";

KT.key = () => sessionStorage.getItem(KEY_STORAGE) || "";
KT.setKey = (k) => k ? sessionStorage.setItem(KEY_STORAGE, k) : sessionStorage.removeItem(KEY_STORAGE);

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status; this.param = e.param || null; this.code = e.code || null;
  }
}
KT.ApiError = ApiError;

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (KT.key()) h.Authorization = "Bearer " + KT.key();
  return h;
}

/* A request to the API; the parsed JSON, or an ApiError (401: back to the login page). */
KT.api = async function (path, opts = {}) {
  const init = { method: opts.method || "GET", headers: headers(opts.headers), signal: opts.signal };
  if (opts.json !== undefined) { init.body = JSON.stringify(opts.json); init.headers["Content-Type"] = "application/json"; }
  else if (opts.body !== undefined) init.body = opts.body;
  const res = await fetch(path, init);
  const body = await res.json().catch(() => null);
  if (!res.ok) {
    const err = new ApiError(res.status, body);
    if (res.status === 401 && !opts.noRedirect) KT.refused(err.message);
    throw err;
  }
  return body;
};

/* Read a streaming response line by line (fetch + ReadableStream); resolves when it ends or is aborted. */
KT.readLines = async function (path, onLine, signal) {
  const res = await fetch(path, { headers: headers({ Accept: "text/event-stream, text/plain" }), signal });
  if (!res.ok) {
    const body = await res.json().catch(() => null);
    const err = new ApiError(res.status, body);
    if (res.status === 401) KT.refused(err.message);
    throw err;
  }
  const reader = res.body.getReader(), dec = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n")) >= 0) { onLine(buf.slice(0, i)); buf = buf.slice(i + 1); }
    }
    if (buf) onLine(buf);
  } catch (e) { if (e.name !== "AbortError") throw e; }
};

/* Server-Sent Events over fetch: onEvent(type, data) for each event ("message" when it names none). */
KT.sse = function (path, onEvent, signal) {
  let type = "message", data = [];
  return KT.readLines(path, (line) => {
    if (line === "") {
      if (data.length) { let d = data.join("\n"); try { d = JSON.parse(d); } catch (_) { /* plain text */ } onEvent(type, d); }
      type = "message"; data = [];
    } else if (line.startsWith("event:")) type = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }, signal);
};

/* Build an element: el("a", {href: "#"}, "text", child, ...). */
KT.el = function (tag, attrs, ...kids) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
    else if (k === "class") n.className = v;
    else n.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) if (kid !== null && kid !== undefined && kid !== false) n.append(kid instanceof Node ? kid : String(kid));
  return n;
};

KT.fmtTime = (t) => t ? new Date(t * 1000).toLocaleString([], { dateStyle: "short", timeStyle: "short" }) : "—";
KT.fmtClock = (t) => t ? new Date(t * 1000).toLocaleTimeString() : "";
KT.fmtDuration = function (s) {
  if (s === null || s === undefined || !isFinite(s)) return "—";
  s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60), sec = s % 60;
  return h ? `${h}h ${m}m` : m ? `${m}m ${sec}s` : `${sec}s`;
};
KT.fmtNum = (x, d = 4) => (typeof x === "number" && isFinite(x)) ? (Math.abs(x) >= 1000 ? x.toFixed(0) : +x.toPrecision(d) + "") : "—";
KT.fmtBytes = (n) => n < 1024 ? `${n} B` : n < 1048576 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1048576).toFixed(1)} MiB`;
KT.TERMINAL = ["succeeded", "failed", "cancelled"];
KT.duration = (j) => j.started_at ? (j.finished_at || Date.now() / 1000) - j.started_at : null;
KT.stateBadge = (s) => KT.el("span", { class: `state state-${s}`, "data-state": s }, s);

/* A progress cell: bar, step/total and ETA. */
KT.progressCell = function (p, status) {
  p = p || {};
  const step = p.step, total = p.total_steps;
  const done = status === "succeeded";
  const bar = KT.el("progress", { max: total || 1, value: done ? (total || 1) : (step || 0), "aria-label": "training progress" });
  const text = step !== undefined ? `${step}/${total || "?"}` : (done ? "done" : "—");
  const eta = (status === "running" && p.eta_seconds !== undefined) ? ` · ETA ${KT.fmtDuration(p.eta_seconds)}` : "";
  return [bar, " ", KT.el("span", { class: "steps" }, text), KT.el("span", { class: "muted" }, eta)];
};

/* An inline SVG sparkline of the last losses. */
KT.sparkline = function (values, w = 90, h = 22) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("class", "spark");
  svg.setAttribute("role", "img"); svg.setAttribute("aria-label", `loss trend over ${values.length} steps`);
  if (values.length > 1) {
    const lo = Math.min(...values), hi = Math.max(...values), span = hi - lo || 1;
    const pts = values.map((v, i) => `${(i / (values.length - 1) * (w - 2) + 1).toFixed(1)},${(h - 2 - (v - lo) / span * (h - 4)).toFixed(1)}`);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.join(" ")); line.setAttribute("fill", "none");
    line.setAttribute("stroke", "currentColor"); line.setAttribute("stroke-width", "1.5");
    svg.append(line);
  }
  return svg;
};
