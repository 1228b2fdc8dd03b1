/* kubetune dashboard: line charts with uPlot (vendored under vendor/uplot/). */
"use strict";
(function () {
  const COLORS = ["#0b62d6", "#d9480f", "#2b8a3e", "#862e9c", "#c2255c", "#1098ad", "#5c940d", "#e67700"];
  const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];  // whole steps only
  KT.COLORS = COLORS;

  /* Axis ticks readable at any scale: 3e-4 rather than 0. */
  const tick = (v) => v === null ? "" : (v !== 0 && (Math.abs(v) < 0.01 || Math.abs(v) >= 100000)) ? Number(v.toPrecision(4)).toExponential() : +v.toPrecision(6) + "";

  /* A chart in `box` with x = step and one line per label; .set(xs, [ys...]) redraws it. */
  KT.chart = function (box, title, labels, opts = {}) {
    const width = () => Math.max(260, box.clientWidth - 4);
    const series = [{ label: "step" }].concat(labels.map((l, i) => ({ label: l, stroke: COLORS[i % COLORS.length], width: 1.6, spanGaps: true,
      points: { show: false } })));
    const u = new uPlot({
      title, width: width(), height: opts.height || 200, series,
      scales: { x: { time: false } },
      axes: [{ stroke: "#888", grid: { stroke: "#8883" }, incrs: STEP_INCRS }, { stroke: "#888", grid: { stroke: "#8883" }, size: 74, values: (_u, splits) => splits.map(tick) }],
      legend: { show: labels.length > 1 || !!opts.legend },
    }, [[], ...labels.map(() => [])], box);
    const ro = new ResizeObserver(() => u.setSize({ width: width(), height: opts.height || 200 }));
    ro.observe(box);
    box.dataset.points = "0";
    return {
      set(xs, ys) { u.setData([xs, ...ys]); box.dataset.points = String(xs.length); },
      destroy() { ro.disconnect(); u.destroy(); },
    };
  };

  /* Collect metrics events into series by step: metric name -> Map(step -> value). */
  KT.MetricSeries = class {
    constructor() { this.by = {}; }
    add(data) {
      if (!data || data.step === undefined || data.step === null) return false;
      let added = false;
      for (const [k, v] of Object.entries(data)) {
        if (typeof v !== "number" || k === "step") continue;
        (this.by[k] = this.by[k] || new Map()).set(data.step, v);
        added = true;
      }
      return added;
    }
    /* [xs, [ys per name]] over the union of steps (null where a metric has no value). */
    table(names) {
      const steps = new Set();
      for (const n of names) for (const s of (this.by[n] || new Map()).keys()) steps.add(s);
      const xs = [...steps].sort((a, b) => a - b);
      return [xs, names.map((n) => xs.map((s) => (this.by[n] && this.by[n].has(s)) ? this.by[n].get(s) : null))];
    }
  };
})();
