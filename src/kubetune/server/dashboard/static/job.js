/* kubetune dashboard: one job. Curves and the events timeline come from the job's event stream, the log from
   its log stream (both read with fetch), and the state from the job whenever a non-metrics event arrives. */
"use strict";
const CHARTS = [
  ["Loss", ["loss", "eval_loss"]], ["Learning rate", ["learning_rate"]],
  ["Grad norm", ["grad_norm"]], ["Tokens/s", ["tokens_per_second"]],
];
const MAX_LOG_LINES = 2000;
const MAX_FILES_SHOWN = 200;  // per folder

KT.pages.job = function (main, id) {
  const { el } = KT;
  const ctl = new AbortController();
  const base = `/v1/jobs/${encodeURIComponent(id)}`;
  const title = el("h1", {}, id);
  const badge = el("span", { id: "job-state" });
  const prog = el("p", { id: "job-progress" });
  const actions = el("div", { class: "actions" });
  const facts = el("dl", { class: "facts" });
  const boxes = CHARTS.map(([t]) => el("div", { class: "chart", "data-chart": t }));
  const timeline = el("ol", { class: "timeline", id: "timeline", "aria-live": "polite" });
  const logs = el("pre", { id: "logs", tabindex: "0", "aria-label": "log" });
  const specPre = el("pre", { id: "spec", tabindex: "0" });
  const files = el("ul", { id: "artifacts" });
  const chat = el("section", { class: "card", id: "chat", hidden: true });
  const msg = el("p", { class: "error", role: "alert" });
  main.replaceChildren(
    el("p", {}, el("a", { href: "#/jobs" }, "← Jobs")), title, el("p", {}, badge, " ", prog), actions, msg, chat,
    el("div", { class: "grid" }, boxes.map((b) => el("section", { class: "card" }, b))),
    el("div", { class: "two" },
      el("section", { class: "card" }, el("h2", {}, "Events"), timeline),
      el("section", { class: "card" }, el("h2", {}, "Log"), logs)),
    el("div", { class: "two" },
      el("section", { class: "card" }, el("h2", {}, "Details"), facts, el("h2", {}, "Checkpoints and artifacts"), files),
      el("section", { class: "card" }, el("h2", {}, "Resolved spec"), specPre)));
  const charts = CHARTS.map(([t, names], i) => KT.chart(boxes[i], t, names));
  const series = new KT.MetricSeries();
  let job = null, last = {}, drawQueued = false;

  function draw() {
    drawQueued = false;
    CHARTS.forEach(([, names], i) => { const [xs, ys] = series.table(names); charts[i].set(xs, ys); });
  }
  function renderJob(j) {
    job = j;
    title.textContent = j.name || j.id;
    badge.replaceChildren(KT.stateBadge(j.status));
    const p = Object.assign({}, j.progress || {}, last);
    prog.replaceChildren(...KT.progressCell(p, j.status), p.loss !== undefined ? `  · loss ${KT.fmtNum(p.loss)}` : "");
    const fact = (k, v) => [el("dt", {}, k), el("dd", {}, v)];
    facts.replaceChildren(...fact("id", j.id), ...fact("model", j.model), ...fact("backend", `${j.backend}${j.backend_job_id ? " · " + j.backend_job_id : ""}`),
      ...fact("created", KT.fmtTime(j.created_at)), ...fact("duration", KT.fmtDuration(KT.duration(j))),
      ...(j.error ? fact("error", el("span", { class: "error" }, j.error.message)) : []),
      ...(j.fine_tuned_model ? fact("fine-tuned model", j.fine_tuned_model) : []));
    const act = (label, path, cls, ok) => el("button", { type: "button", class: cls, id: `btn-${label.toLowerCase()}`, disabled: !ok,
      onclick: (ev) => control(ev.target, path) }, label);
    const live = !KT.TERMINAL.includes(j.status);
    actions.replaceChildren(act("Cancel", `${base}/cancel`, "danger", live),
      act("Pause", `/v1/fine_tuning/jobs/${encodeURIComponent(id)}/pause`, "", ["queued", "running"].includes(j.status)),
      act("Resume", `/v1/fine_tuning/jobs/${encodeURIComponent(id)}/resume`, "", j.status === "paused"));
    if (j.status === "succeeded" && j.fine_tuned_model && chat.hidden) chatPanel(j.fine_tuned_model);
  }
  async function control(button, path) {
    button.disabled = true; msg.textContent = "";
    try {
      const before = job.status;
      await KT.api(path, { method: "POST" });
      await refresh();
      if (before === "paused" && job.status !== "paused") follow();  // resumed: its streams begin again
    } catch (e) { msg.textContent = e.message; button.disabled = false; }
  }
  async function refresh() { renderJob(await KT.api(`/v1/dashboard/jobs/${encodeURIComponent(id)}`, { signal: ctl.signal })); }
  async function artifacts() {  // top-level files, then one folder (checkpoints/, adapter/, ...) per <details>
    const list = await KT.api(`${base}/artifacts`, { signal: ctl.signal });
    const link = (f, label) => el("li", {}, el("button", { type: "button", class: "link", onclick: () => download(f.path) }, label || f.path),
      el("span", { class: "muted" }, ` ${KT.fmtBytes(f.bytes)}`));
    const folders = new Map();
    for (const f of list.data) {
      const i = f.path.indexOf("/");
      if (i < 0) continue;
      const name = f.path.slice(0, i);
      if (!folders.has(name)) folders.set(name, []);
      folders.get(name).push(f);
    }
    const top = list.data.filter((f) => !f.path.includes("/"));
    const items = [...top.map((f) => link(f)), ...[...folders].map(([name, fs]) => el("li", {}, el("details", {},
      el("summary", {}, `${name}/ `, el("span", { class: "muted" }, `${fs.length} files, ${KT.fmtBytes(fs.reduce((a, f) => a + f.bytes, 0))}`)),
      el("ul", {}, fs.slice(0, MAX_FILES_SHOWN).map((f) => link(f, f.path.slice(name.length + 1)))))))];
    files.replaceChildren(...(items.length ? items : [el("li", { class: "muted" }, "none yet")]));
  }
  async function download(path) {
    const res = await fetch(`${base}/artifacts/${path.split("/").map(encodeURIComponent).join("/")}`, { headers: { Authorization: "Bearer " + KT.key() } });
    if (!res.ok) { msg.textContent = `download failed: HTTP ${res.status}`; return; }
    const url = URL.createObjectURL(await res.blob());
    const a = el("a", { href: url, download: path.split("/").pop() });
    document.body.append(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }
  function onEvent(type, e) {
    if (type === "end") { refresh().then(artifacts).catch(() => {}); return; }
    if (type !== "message" || !e) return;
    if (e.type === "metrics") {
      if (series.add(e.data)) {
        last = Object.assign(last, e.data);
        if (job) renderJob(job);
        if (!drawQueued) { drawQueued = true; requestAnimationFrame(draw); }
      }
      return;
    }
    const advice = (e.data || {}).hint || (e.data || {}).advice;
    timeline.append(el("li", { class: `lvl-${e.level}`, "data-type": e.type },
      el("time", {}, KT.fmtClock(e.time)), el("strong", {}, e.type), " ", e.message, advice ? el("span", { class: "advice" }, "→ " + advice) : null));
    timeline.scrollTop = timeline.scrollHeight;
    refresh().catch(() => {});
    if (e.type === "checkpoint" || e.type === "result") artifacts().catch(() => {});
  }
  function follow() {
    timeline.replaceChildren(); logs.textContent = "";
    KT.sse(`${base}/events?stream=true`, onEvent, ctl.signal).catch((e) => { msg.textContent = e.message; });
    const lines = [];
    KT.readLines(`${base}/logs?follow=true`, (line) => {
      lines.push(line);
      if (lines.length > MAX_LOG_LINES) lines.splice(0, lines.length - MAX_LOG_LINES);
      const atEnd = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 20;
      logs.textContent = lines.join("\n");
      if (atEnd) logs.scrollTop = logs.scrollHeight;
    }, ctl.signal).catch(() => {});
  }
  function chatPanel(model) {
    const input = el("input", { id: "chat-input", placeholder: "Ask the fine-tuned model…", "aria-label": "message", style: "width:100%" });
    const log = el("div", { class: "chat-log", "aria-live": "polite" });
    const history = [];
    const form = el("form", { onsubmit: async (ev) => {
      ev.preventDefault();
      const text = input.value.trim(); if (!text) return;
      input.value = ""; history.push({ role: "user", content: text });
      log.append(el("p", {}, el("strong", {}, "you: "), text));
      try {
        const r = await KT.api("/v1/chat/completions", { method: "POST", json: { model, messages: history, max_tokens: 128 } });
        const answer = r.choices[0].message.content;
        history.push({ role: "assistant", content: answer });
        log.append(el("p", {}, el("strong", {}, "model: "), (answer || "").trim() ? answer : el("em", { class: "muted" }, "(an empty reply)")));
      } catch (e) { log.append(el("p", { class: "error" }, e.message)); }
    } }, input, " ", el("button", { type: "submit", class: "primary" }, "Send"));
    chat.replaceChildren(el("h2", {}, `Chat with ${model}`), log, form);
    chat.hidden = false;
  }

  refresh().then(() => { specPre.textContent = JSON.stringify(job.spec || {}, null, 2); }).catch((e) => { msg.textContent = e.message; });
  artifacts().catch(() => {});
  follow();
  return () => { ctl.abort(); charts.forEach((c) => c.destroy()); };
};
