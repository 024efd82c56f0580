// Sweep pages (tunix_rt.sweep): the list of sweeps, and one sweep's trials table, best config
// and a chart of the objective against each parameter. Loaded after charts.js (scales, axes)
// and before app.js, whose helpers (h, api, fmt, badge, when, show, refreshTimer) these
// functions use when they run.
"use strict";

async function sweepsPage() {
  const sweeps = await api("/api/sweeps");
  show(h("h1", {}, "Sweeps"),
    h("p", { class: "muted" }, "Made with `tunix-rt sweep --config BASE --space SPACE.yaml --trials N`; any number of `tunix-rt worker`s run the trials."),
    sweeps.length ? h("table", { "data-testid": "sweeps" },
      h("thead", {}, h("tr", {}, ["sweep", "created", "trials asked", "objective", "best", "params"].map((c) => h("th", {}, c)))),
      h("tbody", {}, sweeps.map((s) => h("tr", {},
        h("td", {}, h("a", { href: "#/sweep/" + encodeURIComponent(s.name) }, s.name)), h("td", {}, when(s.created_at)),
        h("td", {}, `${s.trials_asked}/${s.trials_requested}`), h("td", {}, `${s.objective} (${s.direction === "maximize" ? "max" : "min"})`), h("td", {}, fmt(s.best_value, 4)), h("td", {}, s.params.join(", "))))))
      : h("p", { class: "muted", "data-testid": "empty" }, "No sweeps yet."));
}

async function sweepPage(name) {
  const s = await api("/api/sweeps/" + encodeURIComponent(name));
  const params = Object.keys(s.space.params);
  const runLink = (id) => (id ? h("a", { href: "#/run/" + encodeURIComponent(id) }, id) : "");
  const rows = s.trials.map((t) => h("tr", { "data-testid": "sweep-trial" },
    h("td", {}, t.trial === null ? "–" : String(t.trial)), h("td", {}, badge(t.state.toLowerCase())), h("td", {}, fmt(t.value, 4)),
    params.map((p) => h("td", {}, fmt(t.params[p], 5))), h("td", {}, fmt(t.last_step)),
    h("td", {}, h("a", { href: "#/job/" + t.job_id }, "#" + t.job_id), " ", h("span", { class: "muted" }, t.job_status)),
    h("td", { class: "wrap" }, runLink(t.run_id))));
  const best = s.best
    ? h("div", { class: "card", "data-testid": "sweep-best" },
      h("p", {}, h("b", {}, `trial ${s.best.trial}`), ` · ${s.objective} ${fmt(s.best.value, 4)} · `, runLink(s.best.run_id)),
      h("pre", {}, params.map((p) => `${p}: ${JSON.stringify(s.best.params[p])}`).join("\n")),
      h("details", {}, h("summary", {}, "the whole config"),
        h("pre", { "data-testid": "sweep-best-config" }, Object.entries(s.best.config).map(([k, v]) => `${k}: ${JSON.stringify(v)}`).join("\n"))))
    : h("p", { class: "muted", "data-testid": "sweep-best" }, "No trial has completed yet.");
  const counts = Object.entries(s.counts).map(([k, v]) => `${v} ${k.toLowerCase()}`).join(", ");
  show(h("h1", {}, "Sweep " + s.name),
    h("p", { class: "muted" }, `${s.trials.length} trial(s) of ${s.trials_requested}: ${counts} · ${s.direction === "maximize" ? "maximising" : "minimising"} ${s.objective} · created ${when(s.created_at)}`),
    h("h2", {}, "Best config"), best,
    h("h2", {}, `${s.objective} against each parameter`),
    h("p", { class: "muted" }, "Filled: completed trials (final value). Hollow: pruned trials (last reported value)."),
    h("div", { class: "grid" }, params.map((p) => scatterChart(p, s.space.params[p], s.trials, s.objective))),
    h("h2", {}, "Trials"),
    h("table", { "data-testid": "sweep-trials" },
      h("thead", {}, h("tr", {}, ["trial", "state", s.objective, ...params, "last step", "job", "run"].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows)));
  if (s.trials.some((t) => t.state === "QUEUED" || t.state === "RUNNING")) refreshTimer = setTimeout(route, 3000);
}

// One point per trial with a value: x the parameter (a log10 axis for a log-scale one, the
// choice's position for a categorical one), y the objective; round ticks on both axes.
function scatterChart(name, spec, trials, objective) {
  const cat = spec.type === "categorical";
  const pts = trials.filter((t) => typeof t.value === "number" && t.params[name] !== undefined)
    .map((t) => ({ x: cat ? spec.choices.findIndex((c) => c === t.params[name]) : t.params[name], y: t.value, t }));
  const xs = cat ? categoricalScale(spec.choices) : spec.log ? logScale(spec.low, spec.high) : linearScale(spec.low, spec.high, { widen: false });
  const yv = pts.map((p) => p.y);
  const ys = pts.length ? linearScale(Math.min(...yv), Math.max(...yv)) : linearScale(0, 1);
  const f = chartFrame("sweep-chart-" + name, `${objective} against ${name}`, xs, ys);
  const box = h("div", { class: "chart-box" },
    h("div", { class: "chart-head" }, h("span", { class: "chart-title" }, `${objective} vs ${name}${spec.log ? " (log scale)" : ""}` + (pts.length ? "" : " (no data yet)"))), f.svg);
  drawAxes(f, xs, pts.length ? ys : { ticks: [] }, name + (spec.log ? " (log scale)" : ""), objective);
  for (const p of pts) {
    const c = svgEl(f.svg, "circle", { class: "pt " + p.t.state.toLowerCase(), cx: f.px(p.x).toFixed(1), cy: f.py(p.y).toFixed(1), r: 4 });
    svgEl(c, "title", {}, `trial ${p.t.trial} (${p.t.state.toLowerCase()}): ${name}=${fmtNum(p.t.params[name])}, ${objective}=${fmtNum(p.y)}`);
  }
  return box;
}

// The choices of a categorical parameter at 0, 1, …, each tick labelled with its choice.
function categoricalScale(choices) {
  const n = choices.length;
  return { kind: "categorical", ticks: choices.map((c, i) => ({ v: i, label: String(c) })), frac: (v) => (v + 0.5) / n };
}
