// Numbers and charts for the web UI: number formatting (scientific notation where fixed
// decimals would print 0.0000; never -0), scales with round tick values (1-2-5 steps, or
// decades on a log scale), and the inline-SVG line chart with axis labels, a hover readout
// and a log-scale toggle. Loaded first; depends on nothing (app.js and sweeps.js use it).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const LOG_PREF = "tunix-rt-log-scale:";  // localStorage key prefix, one per chart

// ---- numbers ---------------------------------------------------------------------------
// Drop float noise (0.1 * 3 = 0.30000000000000004) and the sign of zero.
function cleanNum(v) { const r = Number(v.toPrecision(12)); return r === 0 ? 0 : r; }

// 3e-5 → "3e-5", 1.5e-5 → "1.5e-5", 2e6 → "2e6": scientific notation without padding zeros.
function sciNum(v, digits) {
  return v.toExponential(Math.max(0, Math.min(digits, 20))).replace(/\.?0+e/, "e").replace("e+", "e");
}

// A value for a person: `sig` significant digits, scientific below 1e-3 and from 1e6 up.
function fmtNum(v, sig = 4) {
  if (typeof v !== "number") return v === null || v === undefined ? "" : String(v);
  if (!Number.isFinite(v)) return String(v);
  if (v === 0) return "0";  // -0 included
  const a = Math.abs(v);
  if (a < 1e-3 || a >= 1e6) return sciNum(v, sig - 1);
  return String(cleanNum(Number(v.toPrecision(sig))));
}

// ---- scales: value → fraction of the axis, with round tick values -----------------------
const log10floor = (v) => Math.floor(Math.log10(v) + 1e-9);

// The 1-2-5 step that cuts `range` into about `target` parts (3 to 8 ticks on an axis).
function niceStep(range, target = 4) {
  const raw = range / target, p = 10 ** log10floor(raw), m = raw / p;
  return cleanNum((m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p);
}

// A tick label: as many decimals as the step needs; scientific when the step is below 1e-3
// or the values reach 1e6 (an lr axis reads 1e-4, 2e-4, not 0.0001, 0.0002).
function tickLabel(v, step, big) {
  if (v === 0) return "0";
  const e = log10floor(step);
  if (step < 1e-3 || big >= 1e6) return sciNum(v, log10floor(Math.abs(v)) - e);
  return v.toFixed(Math.max(0, -e));
}

// Linear scale over [lo, hi]. widen: the domain grows to the ticks just outside the data
// (a y axis: the top and bottom are labelled); integer: steps of whole numbers (training steps).
function linearScale(lo, hi, { widen = true, integer = false } = {}) {
  if (hi === lo) { const pad = integer ? 1 : Math.abs(lo) * 0.05 || 1; hi = lo + pad; if (!integer) lo -= pad; }
  const step = integer ? Math.max(1, niceStep(hi - lo)) : niceStep(hi - lo);
  const k0 = widen ? Math.floor(lo / step + 1e-9) : Math.ceil(lo / step - 1e-9);
  const k1 = widen ? Math.ceil(hi / step - 1e-9) : Math.floor(hi / step + 1e-9);
  const a = widen ? cleanNum(k0 * step) : lo, b = widen ? cleanNum(k1 * step) : hi;
  const big = Math.max(Math.abs(a), Math.abs(b));
  const ticks = [];
  for (let k = k0; k <= k1; k++) { const v = cleanNum(k * step); ticks.push({ v, label: tickLabel(v, step, big) }); }
  return { kind: "linear", lo: a, hi: b, ticks, frac: (v) => (v - a) / (b - a) };
}

// log10 scale over [lo, hi] (both > 0): ticks at 1, 2, 5 or 1..9 times powers of ten (just
// the powers over many decades), the domain widened to the ticks just outside the data.
function logScale(lo, hi) {
  const span = Math.log10(hi / lo);
  const mants = span >= 2 ? [1] : span >= 0.7 ? [1, 2, 5] : [1, 2, 3, 4, 5, 6, 7, 8, 9];
  const cands = [];
  for (let k = log10floor(lo) - 1; k <= log10floor(hi) + 1; k++) for (const m of mants) cands.push(cleanNum(m * 10 ** k));
  const a = Math.max(...cands.filter((c) => c <= lo * (1 + 1e-9)));
  let b = Math.min(...cands.filter((c) => c >= hi * (1 - 1e-9)));
  if (b === a) b = cands[cands.indexOf(a) + 1];
  let ticks = cands.filter((c) => c >= a && c <= b);
  if (ticks.length > 8) { const every = Math.ceil(ticks.length / 6); ticks = ticks.filter((_, i) => i % every === 0); }
  const la = Math.log10(a), lb = Math.log10(b);
  // An axis of small values in one notation (1e-4, 1e-3, 1e-2, not 1e-4, 0.001, 0.01); one
  // reaching 1 or more in plain numbers wherever they fit (0.001, 0.1, 1, 10, not 1e0, 1e1).
  const sci = ticks.some((v) => v < 1e-3) && ticks[ticks.length - 1] < 1 || ticks[0] >= 1e6;
  const label = (v) => (sci ? sciNum(v, 2) : fmtNum(v, 3));
  return { kind: "log", lo: a, hi: b, ticks: ticks.map((v) => ({ v, label: label(v) })), frac: (v) => (Math.log10(v) - la) / (lb - la) };
}

// ---- SVG -------------------------------------------------------------------------------
function svgEl(parent, tag, attrs, text) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  if (parent) parent.append(el);
  return el;
}

const FRAME = { W: 380, H: 230, L: 58, R: 14, T: 10, B: 40 };

// An empty chart: the SVG, its plot frame and pixel mappings for an x and a y scale.
function chartFrame(testid, label, xs, ys, frame = FRAME) {
  const { W, H, L, R, T, B } = frame;
  const svg = svgEl(null, "svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": label });
  if (testid) svg.setAttribute("data-testid", testid);
  const px = (v) => L + xs.frac(v) * (W - L - R), py = (v) => H - B - ys.frac(v) * (H - T - B);
  return { svg, frame, px, py };
}

// Grid lines, tick marks, tick labels and the axis titles (with units) of a frame.
function drawAxes(f, xs, ys, xTitle, yTitle) {
  const { svg, px, py } = f, { W, H, L, R, T, B } = f.frame;
  const gx = svgEl(svg, "g", { class: "ticks tick-x" }), gy = svgEl(svg, "g", { class: "ticks tick-y" });
  for (const t of ys.ticks) {
    const y = py(t.v).toFixed(1);
    svgEl(gy, "line", { class: "grid", x1: L, x2: W - R, y1: y, y2: y });
    svgEl(gy, "text", { x: L - 6, y, "text-anchor": "end", "dominant-baseline": "middle" }, t.label);
  }
  for (const t of xs.ticks) {
    const x = px(t.v).toFixed(1);
    svgEl(gx, "line", { class: "tick", x1: x, x2: x, y1: H - B, y2: H - B + 4 });
    svgEl(gx, "text", { x, y: H - B + 15, "text-anchor": "middle" }, t.label);
  }
  svgEl(svg, "line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B });
  svgEl(svg, "line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B });
  svgEl(svg, "text", { class: "axis-title", x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" }, xTitle);
  svgEl(svg, "text", { class: "axis-title", x: 0, y: 0, "text-anchor": "middle", transform: `translate(12 ${(T + H - B) / 2}) rotate(-90)` }, yTitle);
}

// ---- the line chart ----------------------------------------------------------------------
// series: [{ label, points: [{x, y}], cls }]; axes: { x: "step", y: "loss", log: offer the
// log-scale toggle }. Returns a box (data-testid=testid) holding the title, the toggle and
// the SVG; the box's data-scale says which scale the y axis uses.
function lineChart(title, series, testid, axes = {}) {
  const box = document.createElement("div");
  box.className = "chart-box";
  box.setAttribute("data-testid", testid);
  const all = series.flatMap((s) => s.points);
  const head = document.createElement("div");
  head.className = "chart-head";
  head.append(Object.assign(document.createElement("span"), { className: "chart-title", textContent: title + (all.length ? "" : " (no data yet)") }));
  box.append(head);
  const canLog = all.length > 0 && all.every((p) => p.y > 0);
  let log = Boolean(axes.log) && canLog && localStorage.getItem(LOG_PREF + testid) === "1";
  const draw = () => {
    box.dataset.scale = log ? "log" : "linear";
    const old = box.querySelector("svg");
    const svg = plotLines(title, series, all, axes, log);
    old ? old.replaceWith(svg) : box.append(svg);
  };
  if (axes.log) head.append(logToggle(testid, canLog, log, (on) => { log = on; draw(); }));
  draw();
  return box;
}

function logToggle(testid, enabled, on, onChange) {
  const id = "log-" + testid;
  const input = Object.assign(document.createElement("input"), { type: "checkbox", id, checked: on, disabled: !enabled });
  input.setAttribute("data-testid", "log-toggle");
  input.addEventListener("change", () => { localStorage.setItem(LOG_PREF + testid, input.checked ? "1" : "0"); onChange(input.checked); });
  const label = document.createElement("label");
  label.htmlFor = id;
  label.className = "toggle";
  label.title = enabled ? "y axis on a log10 scale" : "a log scale needs every value above 0";
  label.append(input, " log scale");
  return label;
}

function plotLines(title, series, all, axes, log) {
  const yTitle = axes.y || "value";
  if (!all.length) {
    const f = chartFrame(null, title, linearScale(0, 1), linearScale(0, 1));
    drawAxes(f, { ticks: [] }, { ticks: [] }, axes.x || "step", yTitle);
    return f.svg;
  }
  const xv = all.map((p) => p.x), yv = all.map((p) => p.y);
  const xs = linearScale(Math.min(...xv), Math.max(...xv), { widen: false, integer: xv.every(Number.isInteger) });
  const ys = log ? logScale(Math.min(...yv), Math.max(...yv)) : linearScale(Math.min(...yv), Math.max(...yv));
  const f = chartFrame(null, `${title}: ${yTitle} against ${axes.x || "step"}`, xs, ys);
  drawAxes(f, xs, ys, axes.x || "step", yTitle + (log ? " (log scale)" : ""));
  for (const s of series) {
    if (!s.points.length) continue;
    svgEl(f.svg, "polyline", { class: "series " + (s.cls || ""), points: s.points.map((p) => `${f.px(p.x).toFixed(1)},${f.py(p.y).toFixed(1)}`).join(" ") });
    const last = s.points[s.points.length - 1];
    svgEl(f.svg, "circle", { class: "last " + (s.cls || ""), cx: f.px(last.x).toFixed(1), cy: f.py(last.y).toFixed(1), r: 3 });
  }
  addHover(f, series, axes.x || "step");
  return f.svg;
}

// The point nearest the pointer (in the plot's own coordinates), marked, with every series'
// value at that x written beside it.
function addHover(f, series, xName) {
  const { svg, px, py } = f, { W, H, T, B } = f.frame;
  const pts = series.flatMap((s) => s.points.map((p) => ({ s, p, X: px(p.x), Y: py(p.y) })));
  const g = svgEl(svg, "g", { class: "hover", "data-testid": "readout", visibility: "hidden" });
  const guide = svgEl(g, "line", { class: "guide", y1: T, y2: H - B });
  const dot = svgEl(g, "circle", { r: 4.5 });
  const text = svgEl(g, "text", {});
  const at = (ev) => {
    const m = svg.getScreenCTM();
    if (!m) return null;
    const q = new DOMPoint(ev.clientX, ev.clientY).matrixTransform(m.inverse());
    let best = null, bestD = Infinity;
    for (const c of pts) { const d = (c.X - q.x) ** 2 + 0.25 * (c.Y - q.y) ** 2; if (d < bestD) { bestD = d; best = c; } }
    return best;
  };
  svg.addEventListener("pointermove", (ev) => {
    const c = at(ev);
    if (!c) return;
    const lines = [`${xName} ${fmtNum(c.p.x)}`];
    for (const s of series) {
      const p = s.points.find((p) => p.x === c.p.x);
      if (p) lines.push(`${s.label || "value"} ${fmtNum(p.y)}`);
    }
    guide.setAttribute("x1", c.X); guide.setAttribute("x2", c.X);
    dot.setAttribute("cx", c.X); dot.setAttribute("cy", c.Y);
    const left = c.X > W / 2;
    text.setAttribute("text-anchor", left ? "end" : "start");
    text.replaceChildren(...lines.map((line, i) => svgEl(null, "tspan", { x: c.X + (left ? -8 : 8), y: T + 12 + 14 * i }, line)));
    g.setAttribute("visibility", "visible");
  });
  svg.addEventListener("pointerleave", () => g.setAttribute("visibility", "hidden"));
}
