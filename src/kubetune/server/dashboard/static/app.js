/* kubetune dashboard: the router (#/jobs, #/jobs/ID, #/sweeps, #/sweeps/ID, #/submit, #/login). */
"use strict";
(function () {
  const main = document.getElementById("main");
  let cleanup = null;

  KT.refused = function (reason) {  // a 401 anywhere: back to the login page, saying why
    KT.setKey("");
    if (!location.hash.startsWith("#/login")) KT.afterLogin = location.hash;
    route(reason);
  };

  async function route(reason) {
    if (cleanup) { try { cleanup(); } catch (_) { /* already gone */ } cleanup = null; }
    const [, page, id] = (location.hash || "#/jobs").split("/").map(decodeURIComponent);
    document.querySelectorAll("nav a").forEach((a) => a.removeAttribute("aria-current"));
    document.querySelectorAll("nav a").forEach((a) => { if (a.dataset.nav === page) a.setAttribute("aria-current", "page"); });
    if (!KT.key() || page === "login" || typeof reason === "string") {
      document.getElementById("signout").hidden = true;
      KT.pages.login(main, typeof reason === "string" ? reason : null);
      return;
    }
    document.getElementById("signout").hidden = false;
    const pages = { jobs: id ? () => KT.pages.job(main, id) : () => KT.pages.jobs(main),
      sweeps: id ? () => KT.pages.sweep(main, id) : () => KT.pages.sweeps(main), submit: () => KT.pages.submit(main) };
    try {
      const result = await (pages[page] || pages.jobs)();
      cleanup = typeof result === "function" ? result : null;
    } catch (e) {
      if (e.status !== 401) main.replaceChildren(KT.el("p", { class: "error", role: "alert" }, e.message));
    }
    document.title = `kubetune · ${page || "jobs"}`;
  }
  document.getElementById("signout").addEventListener("click", () => { KT.setKey(""); location.hash = "#/login"; route(); });
  window.addEventListener("hashchange", () => route());
  KT.go = (hash) => { if (location.hash === hash) route(); else location.hash = hash; };
  route();
})();
