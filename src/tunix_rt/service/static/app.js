// tunix-rt web UI: a small hash-routed page over the REST API. No third-party code.
// The token lives in sessionStorage (typed into the login box, or passed once as #token=…,
// which is removed from the address bar at once). Every API call sends it as a bearer token.
"use strict";

const TOKEN_KEY = "tunix-rt-token";
let refreshTimer = null;
let streamAbort = null;

// ---- tiny DOM helpers (text is always set as text: no HTML injection) ----------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "value") el.value = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
// d decimals, unless they would print 0.000 (3e-5, or -1e-9 as -0.000): then fmtNum's scientific form.
function fmt(v, d = 3) {
  if (typeof v !== "number") return v ?? "";
  if (Number.isInteger(v)) return String(v);  // String(-0) is "0"
  const s = v.toFixed(d);
  return Number(s) === 0 || Math.abs(v) >= 1e6 ? fmtNum(v) : s;
}
const pct = (v) => (typeof v === "number" ? (100 * v).toFixed(1) + "%" : "");
const badge = (s) => h("span", { class: "badge " + s, "data-testid": "status" }, s);
const when = (t) => (t ? String(t).replace("T", " ").slice(0, 19) : "");
// A control with its visible name tied to it (<label for>), the two kept on one line.
const labelled = (text, control) => h("span", { class: "field" }, h("label", { for: control.id }, text), control);

// A model or adapter path shown as a name (the path goes in a tooltip): runs/<id>/final/adapter
// or final/merged → the run id; any other path → its last part (models/<name> → the name).
function pathName(p) {
  if (!p || !p.includes("/")) return p || "";
  const parts = p.replace(/\/+$/, "").split("/");
  const i = parts.lastIndexOf("final");
  return i > 0 && i === parts.length - 2 ? parts[i - 1] : parts[parts.length - 1];
}
const isPath = (p) => typeof p === "string" && p.includes("/");
const nameCell = (p) => h("span", { title: isPath(p) ? p : null }, pathName(p));

// ---- API -----------------------------------------------------------------------------
function token() { return sessionStorage.getItem(TOKEN_KEY); }

// Each route() aborts the reads of the page it replaces: a page whose answer came late
// (a slow server, two boards picked in a row) must not draw itself over the newer one.
// A write (POST, DELETE) is never cut off: the server may have done it already.
let routeCtl = new AbortController();
const superseded = () => new DOMException("a newer page was opened", "AbortError");

async function api(path, opts = {}) {
  const read = !opts.method || opts.method === "GET";
  const ctl = read ? routeCtl : new AbortController();
  const headers = Object.assign({ Authorization: "Bearer " + token() }, opts.headers || {});
  const res = await fetch(path, Object.assign({ signal: ctl.signal }, opts, { headers }));
  if (res.status === 401) { sessionStorage.removeItem(TOKEN_KEY); location.hash = "#/login"; throw new Error("unauthorized"); }
  const type = res.headers.get("content-type") || "";
  const body = type.includes("json") ? await res.json() : await res.text();
  if (ctl.signal.aborted) throw superseded();
  if (!res.ok) { const e = new Error(typeof body === "object" ? JSON.stringify(body.detail ?? body) : body); e.status = res.status; e.body = body; throw e; }
  return body;
}

// Server-sent events over fetch (EventSource cannot send the Authorization header).
async function streamEvents(path, onEvent) {
  if (streamAbort) streamAbort.abort();
  const ctl = new AbortController();
  streamAbort = ctl;
  try {
    const res = await fetch(path, { headers: { Authorization: "Bearer " + token() }, signal: ctl.signal });
    if (!res.ok || !res.body) return;
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const raw = buf.slice(0, i); buf = buf.slice(i + 2);
        const ev = { event: "message", data: "" };
        for (const line of raw.split("\n")) {
          const j = line.indexOf(":");
          if (j <= 0) continue;
          const k = line.slice(0, j), v = line.slice(j + 1).replace(/^ /, "");
          if (k === "data") ev.data += v; else ev[k] = v;
        }
        onEvent(ev.event, ev.data ? JSON.parse(ev.data) : {});
      }
    }
  } catch (e) { if (e.name !== "AbortError") console.warn(e); }
}

// ---- charts (charts.js draws them) ------------------------------------------------------
function curves(metrics) {
  // train rows only (eval rows carry no "loss"): an RL run's eval rows hold eval_reward etc.
  const pts = (key) => metrics.filter((m) => typeof m.values[key] === "number" && m.step !== null).map((m) => ({ x: m.step, y: m.values[key] }));
  const line = (key, label, cls) => ({ points: pts(key), label, cls });
  const charts = [
    lineChart("loss (train solid, eval dashed)", [line("loss", "train loss"), line("eval_loss", "eval loss", "eval")], "loss-chart", { y: "loss", log: true }),
    lineChart("learning rate", [line("lr", "lr")], "lr-chart", { y: "lr" })];
  if (pts("tokens_per_s").length) charts.push(lineChart("throughput", [line("tokens_per_s", "tokens/s")], "throughput-chart", { y: "tokens/s" }));
  const rewardKeys = [...new Set(metrics.flatMap((m) => Object.keys(m.values)))].filter((k) => k.startsWith("reward_")).sort();
  // a chart of the block below is drawn once one of its lines has a point: RFT and on-policy
  // DPO sample like GRPO but have no clip, KL or zero-variance share to show (the share the
  // filters skipped is in their metrics only where one is configured)
  const some = (...charts) => charts.filter((c) => c.lines.some((l) => l.points.length)).map((c) => lineChart(c.title, c.lines, c.id, c.axes));
  const chart = (title, lines, id, axes) => ({ title, lines, id, axes });
  if (pts("reward").length) {  // an RL run (grpo, rft, dpo on its own samples): the rewards and what explains them
    charts.push(
      lineChart("reward: total (solid), " + rewardKeys.map((k) => k.slice(7)).join(", ") + " (dashed, in that order)",
        [line("reward", "total"), ...rewardKeys.map((k) => line(k, k.slice(7), "eval"))], "reward-chart", { y: "reward" }),
      ...some(
        chart("rollout accuracy (solid), format rate (dashed)",
          [line("rollout_accuracy", "accuracy"), line("rollout_format_rate", "format rate", "eval")], "rollout-chart", { y: "rate (0–1)" }),
        chart("zero-variance group share (solid), skipped by the filters (dashed)",
          [line("zero_variance_share", "share"), line("filter_skipped_share", "skipped", "eval")], "zero-var-chart", { y: "share (0–1)" }),
        chart("KL to the reference (solid), clip fraction (dashed)",
          [line("kl", "KL"), line("clip_fraction", "clip fraction", "eval")], "kl-chart", { y: "KL, fraction" }),
        chart("completion length", [line("completion_tokens", "tokens")], "length-chart", { y: "tokens" }),
        chart("time per step: rollout (solid), update (dashed)",
          [line("rollout_s", "rollout s"), line("update_s", "update s", "eval")], "time-chart", { y: "seconds" })));
    // a curriculum run (train.curriculum): each task's difficulty level per step
    const levelKeys = [...new Set(metrics.flatMap((m) => Object.keys(m.values)))].filter((k) => k.startsWith("curriculum_level_")).sort();
    if (levelKeys.length) charts.push(lineChart("curriculum level: " + levelKeys.map((k) => k.slice(17)).join(", "),
      levelKeys.map((k) => line(k, k.slice(17))), "curriculum-chart", { y: "level" }));
    // a run with tools (train.grpo): the step's tool calls and the calls that erred
    if (pts("tool_calls").length) charts.push(lineChart("tool calls per step (solid), tool errors (dashed)",
      [line("tool_calls", "calls"), line("tool_errors", "errors", "eval")], "tool-chart", { y: "calls" }));
    // a rejection-sampling run (train.rft): the share of each round's samples kept, at the step that sampled it
    if (pts("kept_share").length) charts.push(lineChart("RFT: kept share per round (accepted and distinct / samples)",
      [line("kept_share", "kept share")], "kept-chart", { y: "share (0–1)" }));
  }
  // a preference run (train.preference: DPO, IPO, SimPO, ORPO): the implicit rewards of the
  // chosen and the rejected completions, their margin and how often the chosen one wins
  if (pts("rewards_margin").length || pts("eval_rewards_margin").length) charts.push(
    lineChart("implicit reward: chosen (solid), rejected (dashed)",
      [line("rewards_chosen", "chosen"), line("rewards_rejected", "rejected", "eval")], "pref-rewards-chart", { y: "implicit reward" }),
    lineChart("reward margin, chosen − rejected (train solid, held-out dashed)",
      [line("rewards_margin", "margin"), line("eval_rewards_margin", "held-out margin", "eval")], "pref-margin-chart", { y: "margin" }),
    lineChart("implicit-reward accuracy: chosen above rejected (train solid, held-out dashed)",
      [line("rewards_accuracy", "accuracy"), line("eval_rewards_accuracy", "held-out accuracy", "eval")], "pref-accuracy-chart", { y: "share of pairs (0–1)" }),
    ...some(chart("on-policy pairs: share of groups whose best and worst differ",
      [line("paired_share", "paired share")], "pref-paired-chart", { y: "share (0–1)" })));
  // a distillation run (train.distill): the KL to the teacher per step and held out, the student's NLL
  if (pts("kl_teacher").length) charts.push(
    lineChart("KL to the teacher (train solid, held-out dashed)",
      [line("kl_teacher", "KL"), line("eval_kl_teacher", "held-out KL", "eval")], "kd-chart", { y: "KL (nats/token)" }),
    lineChart("student NLL of the targets", [line("nll", "NLL")], "kd-nll-chart", { y: "nats/token" }));
  return h("div", { class: "grid" }, charts);
}

// ---- pages -----------------------------------------------------------------------------
const app = () => document.getElementById("app");
// replaceChildren would print null as "null" and an array as its text: drop and flatten first.
function show(...nodes) { app().replaceChildren(...nodes.flat(Infinity).filter((n) => n !== null && n !== undefined && n !== false)); }
function showError(e) { app().append(h("p", { class: "error", "data-testid": "error" }, String(e.message || e))); }

function loginPage() {
  const input = h("input", { type: "password", id: "token", placeholder: "token printed by `tunix-rt serve`", autocomplete: "off" });
  const submit = async (ev) => {
    ev.preventDefault();
    const res = await fetch("/api/runs?limit=1", { headers: { Authorization: "Bearer " + input.value.trim() } });
    if (res.ok) { sessionStorage.setItem(TOKEN_KEY, input.value.trim()); location.hash = "#/leaderboard"; if (location.hash === "#/leaderboard") route(); }
    else msg.textContent = "That token was refused.";
  };
  const msg = h("p", { class: "error", "data-testid": "login-error" });
  show(h("form", { class: "login card", onsubmit: submit },
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "Paste the token that `tunix-rt serve` printed (also in <home>/service_token)."),
    input, h("button", { type: "submit", id: "login" }, "Sign in"), msg));
  input.focus();
}

const METRICS = ["accuracy", "format_rate", "answer_found_rate", "mean_completion_tokens", "truncated_rate", "judge_score"];

async function leaderboardPage(params) {
  const metric = params.get("metric") || "accuracy";
  const boards = await api("/api/evaluations/boards");
  if (!boards.length) return show(h("h1", {}, "Leaderboard"), h("p", { class: "muted", "data-testid": "empty" }, "No evaluations yet. Run `tunix-rt eval`, or submit a train run."));
  const key = (b) => b.dataset + "\u0000" + b.split;
  const board = boards.find((b) => b.dataset === params.get("dataset") && b.split === params.get("split")) || boards[0];
  const go = (b, m) => (location.hash = `#/leaderboard?dataset=${encodeURIComponent(b.dataset)}&split=${encodeURIComponent(b.split)}&metric=${m}`);
  const rows = await api(`/api/evaluations/leaderboard?metric=${encodeURIComponent(metric)}&dataset=${encodeURIComponent(board.dataset)}&split=${encodeURIComponent(board.split)}`);
  const picked = new Set();
  const boardSelect = h("select", { id: "board", onchange: (e) => go(boards.find((b) => key(b) === e.target.value), metric) },
    boards.map((b) => h("option", { value: key(b), selected: key(b) === key(board) }, `${b.dataset || "?"} / ${b.split || "?"} (${b.evaluations})`)));
  const select = h("select", { id: "metric", onchange: (e) => go(board, e.target.value) },
    [...METRICS, ...sampledKeys(...rows.map((e) => e.metrics))].map((m) => h("option", { value: m, selected: m === metric }, m)));
  const compareBtn = h("button", { id: "compare-picked", disabled: true, onclick: () => { const [a, b] = [...picked]; location.hash = `#/compare?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`; } }, "Compare the two picked");
  const extra = ["accuracy", "format_rate"].includes(metric) ? null : metric;  // shown already otherwise
  const body = rows.map((e, i) => h("tr", { "data-testid": "leaderboard-row" },
    h("td", {}, h("input", { type: "checkbox", "aria-label": "pick " + e.id, onchange: (ev) => { ev.target.checked ? picked.add(e.id) : picked.delete(e.id); compareBtn.disabled = picked.size !== 2; } })),
    h("td", {}, String(i + 1)),
    h("td", { class: "wrap" }, h("a", { href: "#/eval/" + encodeURIComponent(e.id), title: e.id }, evalName(e))),
    h("td", { class: "wrap", "data-testid": "run-or-model" }, evaluated(e)),
    h("td", {}, fmt(e.n)), h("td", {}, pct(e.accuracy)), h("td", {}, pct(e.format_rate)),
    extra ? h("td", {}, fmt(e.metrics[extra])) : null));
  show(h("h1", {}, "Leaderboard"),
    h("div", { class: "row" }, labelled("dataset / split", boardSelect), labelled("sorted by", select), compareBtn),
    h("p", { class: "muted" }, `Only evaluations of ${board.dataset} / ${board.split} rank together here.`),
    h("table", { "data-testid": "leaderboard" },
      h("thead", {}, h("tr", {}, ["pick", "#", "evaluation", "run / model", "n", "accuracy", "format", extra].filter(Boolean).map((c) => h("th", {}, c)))),
      h("tbody", {}, body)));
}

// An evaluation of a run is <run_id>.<name>: the run has its own column, so the name alone here.
const evalName = (e) => (e.run_id && e.id.startsWith(e.run_id + ".") ? e.id.slice(e.run_id.length + 1) : e.id);

// What was evaluated: the run (a link), else the adapter's run or directory name, else the
// model's name; never a bare path (the paths are the tooltip).
function evaluated(e) {
  if (e.run_id) return h("a", { href: "#/run/" + encodeURIComponent(e.run_id) }, e.run_id);
  const paths = [e.model, e.adapter].filter(isPath).join("\n");
  return h("span", { title: paths || null }, pathName(isPath(e.adapter) ? e.adapter : e.model));
}

// The shipped presets (src/tunix_rt/configs; a test holds this list to that folder).
const PRESETS = ["smoke", "cpu-demo", "cpu-sft", "cpu-grpo", "cpu-rft", "cpu-simpo", "cpu-distill", "gpu", "gpu-full-calc", "gpu-grpo", "gpu-dpo"];
// Each method's main settings on the run form (TrainConfig's names; the server checks them as
// it checks any override): [field, choices] for a list, [field, "number" | "int" | "text"]. A
// field left empty keeps the preset's value.
const METHOD_FIELDS = {
  sft: [],
  grpo: [["rl_loss", ["grpo", "dr_grpo", "dapo", "gspo", "rloo"]], ["beta", "number"], ["group_size", "int"], ["rl_prompts", "int"], ["init", "text"]],
  dpo: [["pref_loss", ["dpo", "ipo", "simpo", "orpo"]], ["pref_beta", "number"], ["simpo_gamma", "number"], ["label_smoothing", "number"],
    ["orpo_lambda", "number"], ["pairs", ["rollouts", "dataset"]], ["group_size", "int"], ["rl_prompts", "int"], ["init", "text"]],
  rft: [["rft_round_steps", "int"], ["group_size", "int"], ["rl_prompts", "int"], ["init", "text"]],
  distill: [["teacher", "text"], ["kd_loss", ["forward_kl", "reverse_kl", "jsd"]], ["kd_beta", "number"], ["kd_temperature", "number"],
    ["kd_alpha", "number"], ["kd_on_policy", ["false", "true"]]],
};
const METHOD_HINTS = {
  sft: "Supervised fine-tuning on the dataset's traces.",
  grpo: "RL with verifiable rewards (the GRPO family; gspo: one ratio per sequence, rloo: leave-one-out baseline). init: the SFT run to start from.",
  dpo: "Preference optimisation. pairs=rollouts ranks the model's own samples by the rewards (any trace dataset of the home); pairs=dataset needs a dataset of prompt/chosen/rejected pairs (upload one on the datasets page, format pairs, or `tunix-rt data import pairs FILE --name N`). dpo and ipo compare with the reference: the adapter-off model, or with finetune=full a frozen copy of the starting weights; simpo and orpo have no reference.",
  rft: "Rejection sampling: each round samples, keeps the completions the rewards accept, and trains SFT on them.",
  distill: "Distillation from a teacher with the student's tokenizer: a catalog model or a run id of this home.",
};

// The method picker and its fields; value() is what they add to the overrides.
function methodFields() {
  const method = h("select", { id: "method" }, h("option", { value: "" }, "the preset's"), Object.keys(METHOD_FIELDS).map((m) => h("option", { value: m }, m)));
  const box = h("div", { class: "row", "data-testid": "method-fields" });
  const hint = h("p", { class: "muted", "data-testid": "method-hint" });
  let inputs = [];
  const render = () => {
    inputs = (METHOD_FIELDS[method.value] || []).map(([name, kind]) => {
      const id = "f-" + name;
      const el = Array.isArray(kind)
        ? h("select", { id }, h("option", { value: "" }, "preset's"), kind.map((c) => h("option", { value: c }, c)))
        : h("input", { id, type: kind === "text" ? "text" : "number", step: kind === "int" ? "1" : "any", size: kind === "text" ? 16 : 8, placeholder: "preset's" });
      return { name, kind, el };
    });
    box.replaceChildren(...inputs.map(({ name, el }) => labelled(name, el)));
    hint.textContent = METHOD_HINTS[method.value] || "";
  };
  method.addEventListener("change", render);
  const value = () => {
    const out = method.value ? { method: method.value } : {};
    for (const { name, kind, el } of inputs) {
      const raw = el.value.trim();
      if (!raw) continue;
      out[name] = kind === "number" || kind === "int" ? Number(raw) : raw === "true" || raw === "false" ? raw === "true" : raw;
    }
    return out;
  };
  return { nodes: [h("div", { class: "row" }, labelled("method", method)), box, hint], value };
}

async function runsPage() {
  const runs = await api("/api/runs");
  const overrides = h("textarea", { id: "overrides", rows: 3, cols: 50, placeholder: "key=value per line, e.g. max_steps=4 (these win over the fields above)" });
  const preset = h("select", { id: "preset" }, PRESETS.map((p) => h("option", { value: p }, p)));
  const fields = methodFields();
  const evaluate = h("input", { type: "checkbox", id: "evaluate", checked: true });
  const msg = h("p", { class: "error", "data-testid": "submit-error" });
  const submit = async (ev) => {
    ev.preventDefault();
    const ov = fields.value();
    for (const line of overrides.value.split("\n").map((l) => l.trim()).filter(Boolean)) {
      const i = line.indexOf("=");
      if (i < 1) { msg.textContent = "override without '=': " + line; return; }
      const raw = line.slice(i + 1).trim();
      let v; try { v = JSON.parse(raw); } catch { v = raw; }
      ov[line.slice(0, i).trim()] = v;
    }
    try { const job = await api("/api/runs", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ preset: preset.value, overrides: ov, evaluate: evaluate.checked }) }); location.hash = "#/job/" + job.id; }
    catch (e) { msg.textContent = e.message; }
  };
  const table = h("div", {}, runsTable(runs));
  const refresh = async () => {
    if (location.hash !== "#/runs") return;
    try { table.replaceChildren(runsTable(await api("/api/runs"))); } catch (e) { /* next time */ }
    refreshTimer = setTimeout(refresh, 3000);
  };
  refreshTimer = setTimeout(refresh, 3000);
  show(h("h1", {}, "Runs"),
    h("form", { class: "card", onsubmit: submit }, h("h2", {}, "Start a training run"),
      h("div", { class: "row" }, labelled("preset", preset), h("label", {}, evaluate, " evaluate on the dev split afterwards")),
      fields.nodes,
      h("div", {}, h("label", { for: "overrides", class: "muted" }, "overrides")), overrides, h("div", { class: "row" }, h("button", { type: "submit", id: "submit-run" }, "Queue run")), msg),
    h("h2", {}, "All runs"), table);
}

function runsTable(runs) {
  return runs.length ? h("table", { "data-testid": "runs" },
    h("thead", {}, h("tr", {}, ["run", "status", "engine", "model", "dataset", "started", "finished"].map((c) => h("th", {}, c)))),
    h("tbody", {}, runs.map((r) => h("tr", {}, h("td", {}, h("a", { href: "#/run/" + encodeURIComponent(r.id) }, r.id)), h("td", {}, badge(r.status)),
      h("td", {}, r.engine || ""), h("td", {}, nameCell(r.model)), h("td", {}, r.dataset || ""), h("td", {}, when(r.started_at)), h("td", {}, when(r.finished_at))))))
    : h("p", { class: "muted" }, "No runs yet.");
}

async function jobsPage() {
  const jobs = await api("/api/jobs");
  show(h("h1", {}, "Jobs"),
    jobs.length ? h("table", { "data-testid": "jobs" },
      h("thead", {}, h("tr", {}, ["job", "kind", "status", "attempts", "run", "created", "error"].map((c) => h("th", {}, c)))),
      h("tbody", {}, jobs.map((j) => h("tr", {}, h("td", {}, h("a", { href: "#/job/" + j.id }, "#" + j.id)), h("td", {}, j.kind), h("td", {}, badge(j.status)),
        h("td", {}, `${j.attempts}/${j.max_attempts}`), h("td", {}, j.run_id ? h("a", { href: "#/run/" + encodeURIComponent(j.run_id) }, j.run_id) : ""),
        h("td", {}, when(j.created_at)), h("td", { class: "error" }, (j.error || "").split("\n").pop())))))
      : h("p", { class: "muted" }, "No jobs yet."));
  refreshTimer = setTimeout(route, 3000);
}

function logPanel() { return h("pre", { class: "logs", "data-testid": "logs" }); }

function followLogs(path, pre, onStatus) {
  streamEvents(path, (event, data) => {
    if (event === "log") { pre.append(data.text.replace(/\r(?!\n)/g, "\n")); pre.scrollTop = pre.scrollHeight; }
    else if (event === "status") onStatus && onStatus(data);
  });
}

async function jobPage(id) {
  const job = await api("/api/jobs/" + id);
  const statusBox = h("span", {}, badge(job.status));
  const runBox = h("span", { "data-testid": "job-run" });
  const resultBox = h("pre", { "data-testid": "job-result" }, job.result ? JSON.stringify(job.result, null, 2) : "");
  const chart = h("div", {});
  const cancel = h("button", { id: "cancel", onclick: async () => { await api(`/api/jobs/${id}/cancel`, { method: "POST" }); } }, "Cancel");
  const pre = logPanel();
  const setRun = (runId) => { if (runId) runBox.replaceChildren("run ", h("a", { href: "#/run/" + encodeURIComponent(runId) }, runId)); };
  setRun(job.run_id);
  show(h("h1", {}, `Job #${job.id} · ${job.kind}`),
    h("div", { class: "row" }, statusBox, h("span", { class: "muted" }, `attempt ${job.attempts}/${job.max_attempts}`), runBox, cancel),
    job.error ? h("p", { class: "error" }, job.error) : null,
    h("div", { class: "cols" }, h("div", {}, h("h2", {}, "Parameters"), h("pre", {}, JSON.stringify(job.params, null, 2))), h("div", {}, h("h2", {}, "Result"), resultBox)),
    chart, h("h2", {}, "Live log"), pre);
  let runId = job.run_id;
  const pollChart = async () => {
    if (!runId || location.hash !== "#/job/" + id) return;
    try { chart.replaceChildren(curves(await api(`/api/runs/${encodeURIComponent(runId)}/metrics`))); } catch (e) { /* run not indexed yet */ }
  };
  pollChart();
  const timer = setInterval(pollChart, 2000);
  refreshTimer = { clear: () => clearInterval(timer) };
  followLogs(`/api/jobs/${id}/logs`, pre, async (s) => {
    statusBox.replaceChildren(badge(s.status));
    if (s.run_id) { runId = s.run_id; setRun(runId); }
    if (["succeeded", "dead", "cancelled"].includes(s.status)) {
      const j = await api("/api/jobs/" + id);
      resultBox.textContent = j.result ? JSON.stringify(j.result, null, 2) : j.error || "";
      pollChart();
    }
  });
}

// What a run trained with, as a person names it: the method, and the variant that matters
// (dpo (simpo), grpo (gspo), distill from <teacher>), from the run's resolved config.
function methodName(cfg) {
  const m = (cfg || {}).method;
  if (!m) return "";
  if (m === "dpo") return `dpo (${cfg.pref_loss})` + (cfg.pairs === "rollouts" ? ", on-policy pairs" : "");
  if (m === "grpo") return cfg.rl_loss && cfg.rl_loss !== "grpo" ? `grpo (${cfg.rl_loss})` : "grpo";
  if (m === "distill") return `distill (${cfg.kd_loss}) from ${pathName(cfg.teacher)}`;
  return m === "lora" || m === "full" ? "sft" : m;
}

async function runPage(id) {
  const enc = encodeURIComponent(id);
  const [run, metrics, files] = await Promise.all([api("/api/runs/" + enc), api(`/api/runs/${enc}/metrics`), api(`/api/runs/${enc}/artifacts`)]);
  const pre = logPanel();
  const chartBox = h("div", {}, curves(metrics));
  const live = run.status === "running" || run.status === "created";
  const cancel = run.job_id && live ? h("button", { id: "cancel", onclick: () => api(`/api/runs/${enc}/cancel`, { method: "POST" }) }, "Cancel run") : null;
  const download = async (path) => {
    const res = await fetch(`/api/runs/${enc}/artifacts/${path.split("/").map(encodeURIComponent).join("/")}`, { headers: { Authorization: "Bearer " + token() } });
    const url = URL.createObjectURL(await res.blob());
    const a = h("a", { href: url, download: path.split("/").pop() }); document.body.append(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  };
  show(h("h1", {}, "Run " + run.id),
    h("div", { class: "row" }, badge(run.status), h("span", { class: "muted", title: isPath(run.model) ? run.model : null }, [methodName(run.config), run.engine, run.device, pathName(run.model), run.dataset].filter(Boolean).join(" · ")),
      run.job_id ? h("a", { href: "#/job/" + run.job_id }, "job #" + run.job_id) : null, cancel),
    run.error ? h("p", { class: "error" }, run.error) : null,
    chartBox,
    h("div", { class: "cols" },
      h("div", {}, h("h2", {}, "Config"), h("pre", { "data-testid": "config" }, Object.entries(run.config).map(([k, v]) => `${k}: ${JSON.stringify(v)}`).join("\n"))),
      h("div", {}, h("h2", {}, "Evaluations"),
        run.evaluations.length ? h("ul", {}, run.evaluations.map((e) => h("li", {}, h("a", { href: "#/eval/" + encodeURIComponent(e.id) }, e.id), ` accuracy ${pct(e.accuracy)}, format ${pct(e.format_rate)}, n=${fmt(e.n)}`))) : h("p", { class: "muted" }, "none yet"),
        h("h2", {}, "Checkpoints"), h("p", {}, run.checkpoints.map((c) => "step " + c.step).join(", ") || "none"),
        h("h2", {}, "Evidence files"),
        h("ul", { "data-testid": "artifacts" }, files.map((f) => h("li", {}, h("a", { href: "javascript:void 0", onclick: () => download(f.path) }, f.path), h("span", { class: "muted" }, ` ${f.size.toLocaleString()} B`)))))),
    run.job_id ? [h("h2", {}, "Log"), pre] : null);
  if (run.job_id) followLogs(`/api/runs/${enc}/logs`, pre);
  if (live) {
    const timer = setInterval(async () => {
      if (location.hash !== "#/run/" + enc && location.hash !== "#/run/" + id) return;
      try {
        chartBox.replaceChildren(curves(await api(`/api/runs/${enc}/metrics`)));
        const r = await api("/api/runs/" + enc);
        if (r.status !== "running" && r.status !== "created") { clearInterval(timer); route(); }
      } catch (e) { clearInterval(timer); }
    }, 2000);
    refreshTimer = { clear: () => clearInterval(timer) };
  }
}

async function evalPage(id, params) {
  const enc = encodeURIComponent(id);
  const ev = await api("/api/evaluations/" + enc);
  const wrong = h("input", { type: "checkbox", id: "wrong-only", checked: params.get("wrong") === "1" });
  const badFmt = h("input", { type: "checkbox", id: "format-violations", checked: params.get("format") === "1" });
  const search = h("input", { type: "search", id: "search", placeholder: "search questions", value: params.get("q") || "" });
  const list = h("div", { "data-testid": "predictions" });
  const count = h("span", { "data-testid": "count", class: "muted" });
  let offset = 0;
  const more = h("button", { id: "more", onclick: () => load(false) }, "More");
  const load = async (reset) => {
    if (reset) { offset = 0; list.replaceChildren(); }
    const q = new URLSearchParams({ limit: "50", offset: String(offset) });
    if (wrong.checked) q.set("wrong_only", "true");
    if (badFmt.checked) q.set("format_violations", "true");
    if (search.value) q.set("q", search.value);
    const page = await api(`/api/evaluations/${enc}/predictions?${q}`);
    offset += page.items.length;
    count.textContent = `${page.total} item(s)`;
    more.hidden = offset >= page.total;
    for (const p of page.items) list.append(predictionCard(p, tools));
  };
  for (const el of [wrong, badFmt]) el.addEventListener("change", () => load(true));
  search.addEventListener("input", debounce(() => load(true), 250));
  const m = ev.metrics || {};
  const tools = ((ev.summary || {}).decoding || {}).tools || [];
  show(h("h1", {}, "Evaluation " + ev.id),
    h("p", { class: "muted", title: [ev.model, ev.adapter].filter(isPath).join("\n") || null },
      [pathName(ev.model), isPath(ev.adapter) ? "adapter " + pathName(ev.adapter) : ev.adapter, ev.dataset, ev.split, ev.engine, ev.device].filter(Boolean).join(" · ")),
    h("div", { class: "row", "data-testid": "eval-metrics" }, ["accuracy", "format_rate", "answer_found_rate", "truncated_rate"].map((k) => h("span", { class: "card" }, `${k} ${pct(m[k])}`)),
      h("span", { class: "card" }, `mean tokens ${fmt(m.mean_completion_tokens, 1)}`), h("span", { class: "card" }, `n ${fmt(m.n ?? ev.n)}`)),
    m.samples ? h("div", { class: "row", "data-testid": "eval-sampled" }, sampledKeys(m).map((k) => h("span", { class: "card" }, `${k} ${pct(m[k])}`)),
      h("span", { class: "muted" }, `${m.samples} samples per item: the rates above are over all samples (accuracy = pass@1); each item below shows its majority-vote sample`)) : null,
    tools.length ? h("div", { class: "row", "data-testid": "eval-tools" }, h("span", { class: "card" }, "tools " + tools.join(", ")),
      ["tool_calls_per_item", "tool_tokens_per_item"].map((k) => h("span", { class: "card" }, `${k.replace(/_/g, " ")} ${fmt(m[k], 2)}`)),
      ["tool_use_rate", "tool_error_rate"].map((k) => h("span", { class: "card" }, `${k.replace(/_/g, " ")} ${pct(m[k])}`)),
      h("span", { class: "muted" }, h("span", { class: "tool" }, "tool results"), " in the reasoning are the tool's, not the model's")) : null,
    h("div", { class: "row" }, h("label", {}, wrong, " wrong only"), h("label", {}, badFmt, " format violations"), search, count),
    list, more);
  await load(true);
}

// A sampled eval (`eval --samples K`): its pass@k by k, then maj@K (eval.passk's names).
function sampledKeys(...blocks) {
  const keys = new Set(blocks.flatMap((m) => Object.keys(m || {})).filter((k) => /^(pass|maj)@[1-9][0-9]*$/.test(k)));
  return [...keys].sort((x, y) => (x.startsWith("maj") - y.startsWith("maj")) || (+x.split("@")[1] - +y.split("@")[1]));
}

function predictionCard(p, tools = []) {
  const reasoning = h("pre", { "data-testid": "reasoning" });
  showTurn(reasoning, p.reasoning ?? p.completion ?? "", tools);
  return h("div", { class: "item " + (p.correct ? "right" : "wrong"), "data-testid": "prediction" },
    h("div", { class: "row" }, h("span", { class: p.correct ? "ok" : "bad", "data-testid": "mark" }, p.correct ? "✓ right" : "✗ wrong"),
      p.format_ok ? null : h("span", { class: "badge failed", "data-testid": "format-violation" }, "format violation"),
      h("span", { class: "muted" }, `${p.item_id} · ${fmt(p.n_tokens)} tokens · ${p.finish_reason || ""}`)),
    h("p", {}, h("b", {}, "Q: "), p.question || ""),
    h("div", { class: "cols" },
      h("div", {}, h("b", {}, "Reasoning"), reasoning),
      h("div", {}, h("p", {}, h("b", {}, "Answer: "), h("span", { "data-testid": "answer" }, p.answer ?? "—")), h("p", {}, h("b", {}, "Gold: "), h("span", { "data-testid": "gold" }, p.gold ?? "")))));
}

async function comparePage(params) {
  const evals = await api("/api/evaluations?limit=200");
  const pick = (id, val) => h("select", { id }, h("option", { value: "" }, "—"), evals.map((e) => h("option", { value: e.id, selected: e.id === val }, e.id)));
  const a = pick("cmp-a", params.get("a")), b = pick("cmp-b", params.get("b"));
  const go = h("button", { id: "compare", onclick: () => (location.hash = `#/compare?a=${encodeURIComponent(a.value)}&b=${encodeURIComponent(b.value)}`) }, "Compare");
  const out = h("div", {});
  show(h("h1", {}, "Compare two evaluations"), h("div", { class: "row" }, labelled("A", a), labelled("B", b), go), out);
  if (!params.get("a") || !params.get("b")) return;
  const c = await api(`/api/evaluations/compare?a=${encodeURIComponent(params.get("a"))}&b=${encodeURIComponent(params.get("b"))}`);
  const metricRows = ["accuracy", "format_rate", "answer_found_rate", "mean_completion_tokens", "truncated_rate", ...sampledKeys(c.a.metrics, c.b.metrics)].map((k) =>
    h("tr", {}, h("td", {}, k), h("td", {}, fmt(c.a.metrics[k])), h("td", {}, fmt(c.b.metrics[k])), h("td", {}, c.delta[k] === undefined ? "" : (c.delta[k] >= 0 ? "+" : "") + fmt(c.delta[k]))));
  const flips = (title, items, testid) => [h("h2", {}, `${title} (${items.length})`),
    h("div", { "data-testid": testid }, items.map((f) => h("div", { class: "item" }, h("p", {}, h("b", {}, f.item_id + ": "), f.question || ""),
      h("div", { class: "cols" }, h("div", {}, h("b", {}, "A: "), f.a.answer ?? "—", " ", h("span", { class: f.a.correct ? "ok" : "bad" }, f.a.correct ? "✓" : "✗")),
        h("div", {}, h("b", {}, "B: "), f.b.answer ?? "—", " ", h("span", { class: f.b.correct ? "ok" : "bad" }, f.b.correct ? "✓" : "✗"))),
      h("p", { class: "muted" }, "gold " + (f.gold ?? "")))))];
  out.replaceChildren(
    h("table", { "data-testid": "compare-metrics" }, h("thead", {}, h("tr", {}, ["metric", "A", "B", "B − A"].map((x) => h("th", {}, x)))), h("tbody", {}, metricRows)),
    h("p", { "data-testid": "mcnemar" }, `${c.common} items in common · ${c.fixed.length} fixed, ${c.broken.length} broken · exact McNemar p = ${c.mcnemar_p.toPrecision(3)}`,
      h("span", { class: "muted" }, c.mcnemar_p < 0.05 ? " (unlikely to be chance at 5%)" : " (could be chance at 5%)"),
      c.pass1 ? h("span", { class: "muted" }, ` · right/wrong per item: A ${c.pass1.a_correct_is}, B ${c.pass1.b_correct_is}`) : null),
    c.pass1 ? h("p", { "data-testid": "pass1-test" }, `pass@1 on ${c.pass1.items} shared items: A ${pct(c.pass1.a)}, B ${pct(c.pass1.b)} · `
      + `exact paired sign-flip test over per-item pass rates p = ${c.pass1.p.toPrecision(3)}`) : null,
    ...flips("Fixed: wrong in A, right in B", c.fixed, "fixed"), ...flips("Broken: right in A, wrong in B", c.broken, "broken"));
}

// ---- playground: one or two models answer the same question, streamed side by side ------
let playAborts = [];

function splitAnswer(text) {
  // The model turn is <reasoning>…</reasoning><answer>…</answer>; show each part as it grows.
  const part = (open, close) => { const i = text.indexOf(open); if (i < 0) return null; const rest = text.slice(i + open.length); const j = rest.indexOf(close); return j < 0 ? rest : rest.slice(0, j); };
  const reasoning = part("<reasoning>", "</reasoning>"), answer = part("<answer>", "</answer>");
  return { reasoning: reasoning ?? (answer === null ? text : ""), answer: answer ?? "" };
}

// Tool results inside a model turn (tunix_rt.tools): the calculator writes what follows a call
// "<<EXPR=" up to ">>" on its line, the python tool an <output>…</output> block. Marked only
// for a model that decodes with that tool, where the text after a closed call is the tool's
// by construction (a result still streaming runs to the end of the text so far).
function toolPieces(text, tools) {
  const kinds = [tools.includes("calculator") ? "<<[^\\n<>=]*=" : null, tools.includes("python") ? "<output>" : null].filter(Boolean);
  if (!kinds.length) return [{ text, tool: false }];
  const re = new RegExp(kinds.join("|"), "g"), out = [];
  let at = 0, m;
  while ((m = re.exec(text))) {
    const python = m[0] === "<output>", start = python ? m.index : m.index + m[0].length, closer = python ? "</output>" : ">>";
    let end = text.indexOf(closer, start);
    end = end < 0 ? text.length : end + closer.length;
    const nl = text.indexOf("\n", start);
    if (!python && nl >= 0 && nl < end) end = nl;
    if (start > at) out.push({ text: text.slice(at, start), tool: false });
    if (end > start) out.push({ text: text.slice(start, end), tool: true });
    at = re.lastIndex = Math.max(end, m.index + m[0].length);
  }
  if (at < text.length) out.push({ text: text.slice(at), tool: false });
  return out;
}

function showTurn(el, text, tools) {
  el.replaceChildren(...toolPieces(text, tools).map((p) => p.tool ? h("span", { class: "tool", title: "written by the tool" }, p.text) : p.text));
}

async function streamChat(body, signal, onText) {
  const res = await fetch("/v1/chat/completions", { method: "POST", signal, body: JSON.stringify(Object.assign({}, body, { stream: true, stream_options: { include_usage: true } })),
    headers: { Authorization: "Bearer " + token(), "Content-Type": "application/json" } });
  if (!res.ok) { const b = await res.json().catch(() => ({})); throw new Error((b.error && b.error.message) || (b.detail ? JSON.stringify(b.detail) : res.statusText)); }
  const reader = res.body.getReader(), dec = new TextDecoder();
  let buf = "", text = "", finish = null, usage = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const line = buf.slice(0, i).replace(/^data: /, ""); buf = buf.slice(i + 2);
      if (line === "[DONE]") return { text, finish, usage };
      const chunk = JSON.parse(line);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices || []) { if (c.delta && c.delta.content) text += c.delta.content; if (c.finish_reason) finish = c.finish_reason; }
      onText(text);
    }
  }
  return { text, finish, usage };
}

async function playgroundPage(params) {
  const models = (await api("/v1/models")).data;
  const pick = (id, val, optional) => h("select", { id }, optional ? h("option", { value: "" }, "— none —") : null,
    models.map((m) => h("option", { value: m.id, selected: m.id === val }, m.id + (m.kind === "run" ? " (run)" : ""))));
  const a = pick("play-a", params.get("a") || (models[0] && models[0].id)), b = pick("play-b", params.get("b") || "", true);
  const question = h("textarea", { id: "question", rows: 3, placeholder: "Ask a question, e.g. What is 12 * 7?" });
  const system = h("input", { id: "system", size: 60, placeholder: "system prompt (default: the run's, or the training default)" });
  const maxTokens = h("input", { id: "max-tokens", type: "number", min: 1, placeholder: "server default" });
  const useTools = h("input", { id: "use-tools", type: "checkbox", checked: true });
  const toolsOf = (id) => ((models.find((m) => m.id === id) || {}).tools || []);
  const panes = h("div", { class: "cols", "data-testid": "panes" });
  const stop = h("button", { id: "stop", disabled: true, onclick: () => playAborts.forEach((c) => c.abort()) }, "Stop");
  const ask = async (ev) => {
    ev.preventDefault();
    playAborts.forEach((c) => c.abort());
    const chosen = [a.value, b.value].filter(Boolean);
    const messages = (system.value.trim() ? [{ role: "system", content: system.value.trim() }] : []).concat([{ role: "user", content: question.value }]);
    panes.replaceChildren(); playAborts = []; stop.disabled = false;
    await Promise.all(chosen.map(async (model, k) => {
      const reasoning = h("pre", { "data-testid": "reasoning" }), answer = h("pre", { class: "answer", "data-testid": "answer" });
      const status = h("p", { class: "muted", "data-testid": "pane-status" }, "waiting…");
      const tools = useTools.checked ? toolsOf(model) : [];
      panes.append(h("div", { class: "pane", "data-testid": "pane-" + k }, h("h2", {}, model),
        tools.length ? h("p", { class: "muted", "data-testid": "pane-tools" }, "tools: " + tools.join(", ") + " · ", h("span", { class: "tool" }, "tool results"), " are the tool's, not the model's") : null,
        h("b", {}, "Reasoning"), reasoning, h("b", {}, "Answer"), answer, status));
      const ctl = new AbortController(); playAborts.push(ctl);
      const body = { model, messages };
      if (maxTokens.value) body.max_tokens = Number(maxTokens.value);
      if (!useTools.checked) body.use_tools = false;
      const fill = (text) => { const p = splitAnswer(text); showTurn(reasoning, p.reasoning, tools); showTurn(answer, p.answer, tools); };
      try {
        const out = await streamChat(body, ctl.signal, (text) => { fill(text); status.textContent = "streaming…"; });
        fill(out.text);
        reasoning.dataset.raw = out.text;
        status.textContent = `finished: ${out.finish}` + (out.usage ? ` · ${out.usage.completion_tokens} tokens` : "");
      } catch (e) { status.textContent = e.name === "AbortError" ? "stopped" : "error: " + e.message; status.className = e.name === "AbortError" ? "muted" : "error"; }
    }));
    stop.disabled = true;
  };
  show(h("h1", {}, "Playground"),
    h("form", { class: "card", onsubmit: ask },
      h("div", { class: "row" }, labelled("model A", a), labelled("model B", b), labelled("max tokens", maxTokens),
        labelled("use the runs' tools", useTools)),
      h("div", { class: "row" }, labelled("system prompt", system)), h("label", { for: "question" }, "question"), question,
      h("div", { class: "row" }, h("button", { type: "submit", id: "ask" }, "Ask"), stop)),
    panes);
}

async function datasetsPage() {
  const rows = await api("/api/datasets");
  const file = h("input", { type: "file", id: "upload-file", accept: ".jsonl,application/json" });
  const name = h("input", { id: "upload-name", placeholder: "dataset name" });
  const format = h("select", { id: "upload-format" }, ["auto", "record", "gsm8k", "traces", "generic", "pairs"].map((f) => h("option", { value: f }, f)));
  const msg = h("div", { "data-testid": "upload-result" });
  const submit = async (ev) => {
    ev.preventDefault();
    if (!file.files.length) { msg.replaceChildren(h("p", { class: "error" }, "choose a file")); return; }
    const fd = new FormData(); fd.append("file", file.files[0]); fd.append("name", name.value); fd.append("format", format.value);
    try {
      const r = await api("/api/datasets", { method: "POST", body: fd });
      msg.replaceChildren(h("p", {}, `${r.records} records accepted; importing as ${r.dataset}: `, h("a", { href: "#/job/" + r.job_id }, "job #" + r.job_id)));
    } catch (e) {
      const d = e.body && e.body.detail;
      msg.replaceChildren(h("p", { class: "error" }, d && d.message ? d.message : e.message),
        d && d.errors ? h("pre", { class: "error", "data-testid": "upload-errors" }, d.errors.map((x) => x.message || `${x.line}: ${x.field}: ${x.reason}`).join("\n")) : null);
    }
  };
  show(h("h1", {}, "Datasets"),
    h("form", { class: "card", onsubmit: submit }, h("h2", {}, "Upload a JSONL"), h("div", { class: "row" }, labelled("file", file), labelled("name", name), labelled("format", format), h("button", { type: "submit", id: "upload" }, "Upload")), msg),
    h("table", { "data-testid": "datasets" }, h("thead", {}, h("tr", {}, ["name", "version", "records", "importer", "sha256", "created"].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows.map((d) => h("tr", {}, h("td", {}, d.name), h("td", {}, d.version), h("td", {}, fmt(d.count)), h("td", {}, d.importer || ""), h("td", { class: "muted" }, (d.sha256 || "").slice(0, 12)), h("td", {}, when(d.created_at)))))));
}

function debounce(fn, ms) { let t; return (...a) => { clearTimeout(t); t = setTimeout(() => fn(...a), ms); }; }

// ---- router ------------------------------------------------------------------------------
async function route() {
  routeCtl.abort(); routeCtl = new AbortController();
  if (refreshTimer) { typeof refreshTimer === "number" ? clearTimeout(refreshTimer) : refreshTimer.clear(); refreshTimer = null; }
  if (streamAbort) { streamAbort.abort(); streamAbort = null; }
  playAborts.forEach((c) => c.abort()); playAborts = [];
  const hash = location.hash || "#/leaderboard";
  const m = hash.match(/^#token=(.+)$/);
  if (m) { sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1])); history.replaceState(null, "", location.pathname + "#/leaderboard"); return route(); }
  if (hash === "#/logout") { sessionStorage.removeItem(TOKEN_KEY); location.hash = "#/login"; return; }
  document.getElementById("nav").hidden = !token();
  if (!token() || hash === "#/login") return loginPage();
  const [path, query] = hash.slice(1).split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  try {
    switch (parts[0]) {
      case "runs": return await runsPage();
      case "run": return await runPage(parts.slice(1).join("/"));
      case "jobs": return await jobsPage();
      case "job": return await jobPage(parts[1]);
      case "eval": return await evalPage(parts.slice(1).join("/"), params);
      case "compare": return await comparePage(params);
      case "datasets": return await datasetsPage();
      case "playground": return await playgroundPage(params);
      case "sweeps": return await sweepsPage();  // sweeps.js
      case "sweep": return await sweepPage(parts.slice(1).join("/"));
      default: return await leaderboardPage(params);
    }
  } catch (e) { if (e.message !== "unauthorized" && e.name !== "AbortError") showError(e); }
}

window.addEventListener("hashchange", route);
route();
