// Sweep pages (tunix_rt.sweep): the list of sweeps, and one sweep's trials table, best config
// and a chart of the objective against each parameter. Loaded before app.js, whose helpers
// (h, api, fmt, badge, when, show, refreshTimer) these functions use when they run.
"use strict";

async function sweepsPage() {
  const sweeps = await api("/api/sweeps");
  show(h("h1", {}, "Sweeps"),
    h("p", { class: "muted" }, "Made with `tunix-rt sweep --config BASE --space SPACE.yaml --trials N`; any number of `tunix-rt worker`s run the trials."),
    sweeps.length ? h("table", { "data-testid": "sweeps" },
      h("thead", {}, h("tr", {}, ["sweep", "created", "trials asked", "best eval_loss", "params"].map((c) => h("th", {}, c)))),
      h("tbody", {}, sweeps.map((s) => h("tr", {},
        h("td", {}, h("a", { href: "#/sweep/" + encodeURIComponent(s.name) }, s.name)), h("td", {}, when(s.created_at)),
        h("td", {}, `${s.trials_asked}/${s.trials_requested}`), h("td", {}, fmt(s.best_value, 4)), h("td", {}, s.params.join(", "))))))
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
    h("p", { class: "muted" }, `${s.trials.length} trial(s) of ${s.trials_requested}: ${counts} · minimising ${s.objective} · created ${when(s.created_at)}`),
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

// One point per trial with a value: x the parameter (log10 axis for a log-scale one, the
// choice's position for a categorical one), y the objective.
function scatterChart(name, spec, trials, objective) {
  const W = 360, H = 220, L = 56, R = 14, T = 22, B = 30;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  for (const [k, v] of Object.entries({ viewBox: `0 0 ${W} ${H}`, class: "chart", "data-testid": "sweep-chart-" + name, role: "img", "aria-label": `${objective} against ${name}` })) svg.setAttribute(k, v);
  const add = (tag, attrs, text) => {
    const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    svg.append(el); return el;
  };
  const cat = spec.type === "categorical";
  const xOf = (v) => (cat ? spec.choices.findIndex((c) => c === v) : spec.log ? Math.log10(v) : v);
  const pts = trials.filter((t) => typeof t.value === "number" && t.params[name] !== undefined)
    .map((t) => ({ x: xOf(t.params[name]), y: t.value, t }));
  add("text", { x: L, y: 14 }, `${objective} vs ${name}${spec.log ? " (log)" : ""}` + (pts.length ? "" : " (no data yet)"));
  add("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B });
  add("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B });
  if (!pts.length) return svg;
  let x0 = cat ? -0.5 : spec.log ? Math.log10(spec.low) : spec.low, x1 = cat ? spec.choices.length - 0.5 : spec.log ? Math.log10(spec.high) : spec.high;
  let y0 = Math.min(...pts.map((p) => p.y)), y1 = Math.max(...pts.map((p) => p.y));
  if (y1 === y0) { y1 += Math.abs(y1) * 0.05 || 1; y0 -= Math.abs(y0) * 0.05 || 1; }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  add("text", { x: 4, y: T + 8 }, fmt(y1, 4));
  add("text", { x: 4, y: H - B }, fmt(y0, 4));
  if (cat) spec.choices.forEach((c, i) => add("text", { x: sx(i) - 12, y: H - 10 }, String(c)));
  else {
    add("text", { x: L, y: H - 10 }, fmt(spec.low, 4));
    add("text", { x: W - R - 44, y: H - 10 }, fmt(spec.high, 4));
  }
  for (const p of pts) {
    const c = add("circle", { class: "pt " + p.t.state.toLowerCase(), cx: sx(p.x).toFixed(1), cy: sy(p.y).toFixed(1), r: 4 });
    const tip = document.createElementNS("http://www.w3.org/2000/svg", "title");
    tip.textContent = `trial ${p.t.trial} (${p.t.state.toLowerCase()}): ${name}=${p.t.params[name]}, ${objective}=${fmt(p.y, 4)}`;
    c.append(tip);
  }
  return svg;
}
