/* kubetune dashboard: the jobs table, one page fetched once (filtered and searched on the server) and kept
   current by the project's live stream (/v1/dashboard/stream), not by fetching the list again. */
"use strict";
KT.pages = KT.pages || {};
const JOB_STATES = ["queued", "running", "paused", "succeeded", "failed", "cancelled"];
const PAGE_SIZE = 50;

KT.pages.jobs = function (main) {
  const { el } = KT;
  const ctl = new AbortController();
  const state = { status: "", q: "", after: null, rows: new Map() };
  const stateSel = el("select", { id: "filter-state" }, el("option", { value: "" }, "all"), JOB_STATES.map((s) => el("option", { value: s }, s)));
  const search = el("input", { id: "search", type: "search", placeholder: "name, id, model…", autocomplete: "off" });
  const live = el("span", { class: "muted", id: "live", "aria-live": "polite" }, "connecting…");
  const tbody = el("tbody", { id: "jobs-body" });
  const more = el("button", { type: "button", id: "more", hidden: true, onclick: () => load(false) }, "Load more");
  const note = el("p", { class: "muted", id: "jobs-note" });
  main.replaceChildren(
    el("h1", {}, "Jobs"),
    el("div", { class: "toolbar", role: "search" },
      el("label", { for: "filter-state" }, "State", stateSel), el("label", { for: "search" }, "Search", search), live),
    el("div", { class: "table-wrap" }, el("table", { id: "jobs" },
      el("caption", { class: "skip" }, "Jobs, newest first"),
      el("thead", {}, el("tr", {}, ["Name", "Model", "Method", "Backend", "State", "Progress", "Loss", "Created", "Duration"].map((h, i) =>
        el("th", { scope: "col", class: [1, 2, 3].includes(i) ? "hide-sm" : null }, h)))),
      tbody)),
    note, more);

  function row(j) {
    const tr = el("tr", { "data-id": j.id },
      el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(j.id)}`, class: "job-link" }, j.name || j.id)),
      el("td", { class: "hide-sm" }, j.model),
      el("td", { class: "hide-sm" }, j.method || "—"),
      el("td", { class: "hide-sm" }, j.backend),
      el("td", {}, KT.stateBadge(j.status)),
      el("td", { class: "progress" }, KT.progressCell(j.progress, j.status)),
      el("td", { class: "loss" }, KT.fmtNum((j.progress || {}).loss), " ", KT.sparkline(j.spark || [])),
      el("td", {}, KT.fmtTime(j.created_at)),
      el("td", {}, KT.fmtDuration(KT.duration(j))));
    return tr;
  }
  function matches(j) {
    if (state.status && j.status !== state.status) return false;
    if (!state.q || state.rows.has(j.id)) return true;  // a row the server's search found stays (it also searches the spec)
    const q = state.q.toLowerCase();
    return [j.id, j.name, j.model].some((x) => (x || "").toLowerCase().includes(q));
  }
  function upsert(j, prepend) {
    const old = state.rows.get(j.id);
    if (!matches(j)) { if (old) { old.remove(); state.rows.delete(j.id); } return; }
    const tr = row(j);
    if (old) old.replaceWith(tr); else if (prepend) tbody.prepend(tr); else tbody.append(tr);
    state.rows.set(j.id, tr);
    note.textContent = "";
  }
  async function load(reset) {
    if (reset) { state.after = null; state.rows.clear(); tbody.replaceChildren(); }
    const qs = new URLSearchParams({ limit: PAGE_SIZE });
    if (state.status) qs.set("status", state.status);
    if (state.q) qs.set("q", state.q);
    if (state.after) qs.set("after", state.after);
    const page = await KT.api(`/v1/dashboard/jobs?${qs}`, { signal: ctl.signal });
    page.data.forEach((j) => upsert(j, false));
    if (page.data.length) state.after = page.data[page.data.length - 1].id;
    more.hidden = !page.has_more;
    if (!state.rows.size) note.textContent = state.status || state.q ? "No job matches." : "No jobs yet: submit one.";
  }
  let timer = null;
  stateSel.addEventListener("change", () => { state.status = stateSel.value; load(true).catch(show); });
  search.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => { state.q = search.value.trim(); load(true).catch(show); }, 250); });
  function show(e) { if (e.name !== "AbortError") note.textContent = e.message; }

  load(true).catch(show);
  (async function follow() {  // the live stream, reconnecting after a drop
    while (!ctl.signal.aborted) {
      try {
        await KT.sse("/v1/dashboard/stream", (type, data) => {
          if (type === "ready") live.textContent = "● live";
          if (type === "job") upsert(data, true);
        }, ctl.signal);
      } catch (e) { if (e.status === 401) return; }
      if (ctl.signal.aborted) return;
      live.textContent = "reconnecting…";
      await new Promise((r) => setTimeout(r, 2000));
    }
  })();
  return () => ctl.abort();
};
