/* kubetune dashboard: the login page, sweeps and the submit page. */
"use strict";

KT.pages.login = function (main, reason) {
  const { el } = KT;
  const input = el("input", { id: "api-key", type: "password", autocomplete: "current-password", required: true, style: "width:100%" });
  const msg = el("p", { id: "login-error", class: "error", role: "alert" }, reason ? `Key refused: ${reason}` : "");
  main.replaceChildren(el("section", { class: "login card" },
    el("h1", {}, "Sign in"),
    el("p", { class: "muted" }, "Paste an API key of your project (kubetune server keys create --project NAME). It is kept in this browser tab only."),
    el("form", { onsubmit: async (ev) => {
      ev.preventDefault();
      KT.setKey(input.value.trim()); msg.textContent = "";
      try {
        await KT.api("/v1/dashboard/jobs?limit=1", { noRedirect: true });
        KT.go(KT.afterLogin && KT.afterLogin !== "#/login" ? KT.afterLogin : "#/jobs");
      } catch (e) {
        KT.setKey("");
        msg.textContent = e.status === 401 ? `Key refused: ${e.message}` : e.message;
        input.setAttribute("aria-invalid", "true"); input.focus();
      }
    } }, el("label", { for: "api-key" }, "API key"), input, el("p", {}, el("button", { type: "submit", class: "primary", id: "login" }, "Sign in")), msg)));
  input.focus();
};

KT.pages.sweeps = async function (main) {
  const { el } = KT;
  main.replaceChildren(el("h1", {}, "Sweeps"), el("p", { class: "muted" }, "Loading…"));
  const list = await KT.api("/v1/sweeps");
  const rows = list.data.map((s) => el("tr", {},
    el("td", {}, el("a", { href: `#/sweeps/${encodeURIComponent(s.id)}` }, s.name)), el("td", {}, KT.stateBadge(s.status)),
    el("td", {}, `${s.direction} ${s.objective}`), el("td", {}, s.trials.length),
    el("td", {}, s.best ? `${KT.fmtNum(s.best.objective)} (${s.best.name})` : "—"), el("td", {}, KT.fmtTime(s.created_at))));
  main.replaceChildren(el("h1", {}, "Sweeps"), rows.length ? el("div", { class: "table-wrap" }, el("table", { id: "sweeps" },
    el("thead", {}, el("tr", {}, ["Name", "State", "Objective", "Trials", "Best", "Created"].map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, rows))) : el("p", { class: "muted" }, "No sweeps yet: submit a spec with a sweep: section (docs/sweeps.md)."));
};

KT.pages.sweep = function (main, id) {
  const { el } = KT;
  const ctl = new AbortController();
  const box = el("div", { class: "chart", id: "sweep-chart" });
  const table = el("div", { class: "table-wrap" });
  const head = el("h1", {}, id), summary = el("p", {});
  main.replaceChildren(el("p", {}, el("a", { href: "#/sweeps" }, "← Sweeps")), head, summary, table,
    el("section", { class: "card", style: "margin-top:14px" }, box));
  let chart = null, timer = null;
  async function load() {
    const sw = await KT.api(`/v1/sweeps/${encodeURIComponent(id)}`, { signal: ctl.signal });
    head.textContent = `Sweep ${sw.name}`;
    summary.replaceChildren(KT.stateBadge(sw.status), ` ${sw.direction} ${sw.objective} · `,
      Object.entries(sw.counts).map(([k, v]) => `${v} ${k}`).join(", "));
    const keys = [...new Set(sw.trials.flatMap((t) => Object.keys(t.values)))];
    const bestId = sw.best && sw.best.id;
    table.replaceChildren(el("table", { id: "trials" },
      el("thead", {}, el("tr", {}, ["Trial", ...keys, "State", sw.objective, ""].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, sw.trials.map((t) => el("tr", { class: t.id === bestId ? "best" : null, "data-id": t.id },
        el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(t.id)}` }, t.name || t.id)),
        keys.map((k) => el("td", {}, JSON.stringify(t.values[k]))), el("td", {}, KT.stateBadge(t.status)),
        el("td", {}, KT.fmtNum(t.objective)), el("td", {}, t.id === bestId ? el("strong", {}, "★ best") : ""))))));
    const curves = await Promise.all(sw.trials.map((t) => KT.api(`/v1/jobs/${encodeURIComponent(t.id)}/events`, { signal: ctl.signal })
      .then((r) => r.data.filter((e) => e.type === "metrics" && typeof e.data.loss === "number")).catch(() => [])));
    const steps = [...new Set(curves.flatMap((c) => c.map((e) => e.data.step)))].sort((a, b) => a - b);
    const ys = curves.map((c) => { const m = new Map(c.map((e) => [e.data.step, e.data.loss])); return steps.map((s) => m.has(s) ? m.get(s) : null); });
    if (!chart) chart = KT.chart(box, "Training loss, all trials", sw.trials.map((t) => t.name || t.id), { height: 260, legend: true });
    chart.set(steps, ys);
    if (sw.status === "running" && !ctl.signal.aborted) timer = setTimeout(() => load().catch(() => {}), 3000);
  }
  load().catch((e) => { if (e.name !== "AbortError") summary.textContent = e.message; });
  return () => { ctl.abort(); clearTimeout(timer); if (chart) chart.destroy(); };
};

KT.pages.submit = function (main) {
  const { el } = KT;
  const editor = el("textarea", { id: "spec-yaml", rows: 18, spellcheck: "false", "aria-describedby": "spec-errors",
    placeholder: "name: my-job\nmodel: {source: builtin://tiny-chat}\ndataset: {source: /data/train.jsonl}\nmethod: {type: lora}" });
  const upload = el("input", { id: "spec-file", type: "file", accept: ".yaml,.yml,.json" });
  const errors = el("ul", { class: "field-errors", id: "spec-errors", role: "alert" });
  const status = el("p", { id: "submit-status", "aria-live": "polite" });
  upload.addEventListener("change", async () => { if (upload.files[0]) editor.value = await upload.files[0].text(); });
  function showErrors(list) {
    errors.replaceChildren(...list.map((e) => el("li", { "data-field": e.field || "" },
      e.field ? el("code", {}, e.field) : null, e.line ? ` (line ${e.line})` : "", e.field || e.line ? ": " : "", e.message)));
    editor.setAttribute("aria-invalid", list.length ? "true" : "false");
    const first = list.find((e) => e.line);
    if (first) {  // put the cursor on the first bad field's line
      const lines = editor.value.split("\n"), at = lines.slice(0, first.line - 1).join("\n").length + (first.line > 1 ? 1 : 0);
      editor.focus(); editor.setSelectionRange(at, at + (lines[first.line - 1] || "").length);
    }
  }
  async function check() {
    status.textContent = ""; errors.replaceChildren();
    const r = await KT.api("/v1/jobs/validate", { method: "POST", body: editor.value, headers: { "Content-Type": "application/yaml" } });
    showErrors(r.errors);
    if (r.valid) status.textContent = "The spec is valid.";
    return r.valid;
  }
  async function submit() {
    try {
      if (!await check()) return;
      const sweep = /^sweep\s*:/m.test(editor.value);
      const r = await KT.api(sweep ? "/v1/sweeps" : "/v1/jobs", { method: "POST", body: editor.value, headers: { "Content-Type": "application/yaml" } });
      location.hash = sweep ? `#/sweeps/${encodeURIComponent(r.id)}` : `#/jobs/${encodeURIComponent(r.id)}`;
    } catch (e) { showErrors([{ field: e.param !== "spec" ? e.param : null, message: e.message }]); }
  }
  const models = el("select", { id: "quick-model" });
  const data = el("input", { id: "quick-file", type: "file", accept: ".jsonl" });
  const qstatus = el("p", { id: "quick-status", "aria-live": "polite" });
  KT.api("/v1/models").then((r) => models.replaceChildren(...r.data.filter((m) => m.owned_by === "kubetune")
    .map((m) => el("option", { value: m.id }, `${m.id} (${m.root})`)))).catch(() => {});
  async function quick(ev) {
    ev.preventDefault();
    if (!data.files[0]) { qstatus.textContent = "Pick a JSONL file of chat rows."; return; }
    try {
      qstatus.textContent = "Uploading…";
      const form = new FormData(); form.append("purpose", "fine-tune"); form.append("file", data.files[0]);
      const f = await KT.api("/v1/files", { method: "POST", body: form });
      const job = await KT.api("/v1/fine_tuning/jobs", { method: "POST", json: { model: models.value, training_file: f.id } });
      location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
    } catch (e) { qstatus.textContent = e.message; qstatus.className = "error"; }
  }
  main.replaceChildren(el("h1", {}, "Submit"), el("div", { class: "two" },
    el("section", { class: "card" }, el("h2", {}, "A job spec (YAML)"),
      el("label", { for: "spec-file" }, "Upload a spec file"), upload,
      el("label", { for: "spec-yaml" }, "or paste it"), editor, errors,
      el("div", { class: "actions" }, el("button", { type: "button", id: "validate", onclick: () => check().catch((e) => showErrors([{ message: e.message }])) }, "Validate"),
        el("button", { type: "button", class: "primary", id: "submit", onclick: submit }, "Submit")), status),
    el("section", { class: "card" }, el("h2", {}, "Quick LoRA job"),
      el("p", { class: "muted" }, "A base model this server offers and your chat rows (JSONL); the server's defaults do the rest."),
      el("form", { onsubmit: quick }, el("label", { for: "quick-model" }, "Base model"), models,
        el("label", { for: "quick-file" }, "Training file"), data,
        el("p", {}, el("button", { type: "submit", class: "primary", id: "quick-submit" }, "Start")), qstatus))));
};
