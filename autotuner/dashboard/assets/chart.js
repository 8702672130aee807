// autotune dashboard: a chart drawn as the page's own SVG, for the plots tab (plots.js). No chart library: plotly.js
// alone took 1.7 s of the page's main thread to evaluate, and every plot here is a few hundred marks at most.
//
// - Text from the sweep becomes SVG text nodes (`svgNode`'s children, `hoverText`'s <title>, the tooltip's text),
//   never markup: a value holding <b> or <a href> shows as those characters.
// - Marks are few elements whatever their number (the dots of a series one path, the bars of a state one path): a
//   thousand elements each with its <title> made a redraw cost more than the page's table. Their hover text is one
//   tooltip, shown for the mark nearest the pointer (`hoverMarks`, also the chart element's, for tests).
// - Nothing is styled inline (the page's CSP has no 'unsafe-inline' for styles): the page's colours come from
//   app.css (`.chart` classes, light and dark), a series' own colour is an SVG attribute.
// - Labels are laid out by an estimate of their width (CHAR_PX), never measured: measuring lays the page out.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const CHAR_PX = 6.4;       // about the width of a character of an 11 px label
const AXIS_TICKS = 24;     // labels of an axis of categories at most (every value when there are no more)
const LEGEND_ROWS = 3;     // rows of the legend at most; what does not fit is counted
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
  "#17becf"];

function svgNode(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  for (const c of children) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

// A mark's hover text: its <title>, as text.
function hoverText(node, text) {
  node.append(svgNode("title", null, text));
  return node;
}

// A value as one line of text, cut to `limit` characters (the table and the run's page show it whole).
function cut(value, limit = 60) {
  let text = typeof value === "string" ? value : value === null || value === undefined ? "(none)" : JSON.stringify(value);
  text = text.replace(/[\r\n\t]+/g, " ");
  return text.length > limit ? text.slice(0, limit - 1) + "…" : text;
}

// --- scales: a value -> a pixel, and the ticks [[value, text]] ----------------------------------------------------
// Numbers: about five round ticks (1, 2 or 5 times a power of ten apart; never a fraction where every value is
// whole), powers of ten on a logarithmic scale. Times (seconds): round minutes or hours. Categories (indexes into
// their labels): every one, or every k-th past AXIS_TICKS.
function scaleOf(axis, from, to) {
  if (axis.kind === "category") {
    const n = Math.max(axis.labels.length, 1), band = (to - from) / n, every = Math.ceil(n / AXIS_TICKS);
    return { at: (i) => from + (i + 0.5) * band, band,
      ticks: axis.labels.map((t, i) => [i, t]).filter((_, i) => i % every === 0) };
  }
  let { lo, hi } = axis;
  if (!(hi > lo)) {  // one value: a range around it (a minute of time, one either side of a whole number)
    const pad = axis.kind === "time" ? 30 : axis.whole || lo === 0 ? 1 : Math.abs(lo) / 10;
    lo -= pad; hi += pad;
  }
  const log = axis.kind === "log" && lo > 0;
  const f = log ? Math.log10 : (v) => v, a = f(lo), b = f(hi);
  const at = (v) => from + ((f(v) - a) / (b - a || 1)) * (to - from);
  if (axis.kind === "time") return { at, ticks: timeTicks(lo, hi, Math.max(2, Math.floor(Math.abs(to - from) / (CHAR_PX * 10)))) };
  const values = log ? logTicks(lo, hi) : roundTicks(lo, hi, axis.whole);
  return { at, ticks: values.map((v) => [v, number(v)]) };
}

function roundTicks(lo, hi, whole) {
  const raw = (hi - lo) / 5, unit = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 5, 10].map((k) => k * unit).find((s) => s >= raw);
  if (whole) step = Math.max(1, Math.round(step));
  const digits = Math.max(0, -Math.floor(Math.log10(step)));
  const out = [];
  for (let k = Math.ceil(lo / step); k * step <= hi; k++) out.push(+(k * step).toFixed(digits));
  return out;
}

function logTicks(lo, hi) {
  const out = [];
  for (let e = Math.ceil(Math.log10(lo)); 10 ** e <= hi; e++) out.push(10 ** e);
  return out.length >= 2 ? out : [lo, hi];
}

const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

// Round times in local time (as the labels are), at most `count` of them.
function timeTicks(lo, hi, count) {
  const step = TIME_STEPS.find((s) => (hi - lo) / s <= count) || Math.ceil((hi - lo) / count / 86400) * 86400;
  const offset = new Date(lo * 1000).getTimezoneOffset() * 60;
  const out = [];
  for (let t = Math.ceil((lo - offset) / step) * step + offset; t <= hi; t += step) out.push([t, clock(t, step, hi - lo)]);
  return out;
}

// A tick's time: as precise as its step, the date where the axis spans days (the year where it spans most of one).
function clock(t, step, span) {
  const d = new Date(t * 1000), two = (n) => String(n).padStart(2, "0");
  const date = span >= 300 * 86400 ? `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())}` : `${d.getMonth() + 1}/${d.getDate()}`;
  if (step >= 86400) return date;
  const time = `${two(d.getHours())}:${two(d.getMinutes())}` + (step < 60 ? ":" + two(d.getSeconds()) : "");
  return span >= 86400 ? `${date} ${time}` : time;
}

// --- the chart ---------------------------------------------------------------------------------------------------
// `box` (its size the element's) drawn again from: x and y axes ({kind: "number" | "log" | "time", lo, hi, whole}
// or {kind: "category", labels}; y may be `reversed`), their titles, and series, each any of: `segments`
// [[x0, x1, y, hover]] (bars `width` px thick), `line` [[x, y, hover]] (`step`: horizontal then vertical, a marker
// at each point), `dots` [[x, y, hover]]. A series with a `name` is in the legend, above the plot.
function drawChart(box, { x, y, xTitle, yTitle, series }) {
  const W = box.clientWidth || 600, H = box.clientHeight || 340;
  const legend = legendOf(series.filter((s) => s.name), W - 20);
  const probe = scaleOf(y, 0, 1).ticks.map(([, t]) => t.length);
  const L = Math.min(170, 14 + CHAR_PX * Math.max(3, ...probe)) + (yTitle ? 16 : 0);
  const xs = scaleOf(x, L, W - 14);
  const longest = Math.max(0, ...xs.ticks.map(([, t]) => t.length));
  const tilted = x.kind === "category" && longest * CHAR_PX > (xs.band || 0) * Math.ceil(x.labels.length / AXIS_TICKS);
  const B = (tilted ? 18 + Math.min(90, longest * CHAR_PX * 0.6) : 30) + (xTitle ? 16 : 0);
  const T = 10 + legend.height;
  const at = { x: scaleOf(x, L, W - 14).at, y: scaleOf(y, y.reversed ? T + 4 : H - B - 4, y.reversed ? H - B - 4 : T + 4).at };
  const ys = scaleOf(y, 0, 1);
  const root = svgNode("svg", { class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  const grid = svgNode("g", { class: "grid" }), ticks = svgNode("g", { class: "ticks" });
  for (const [v, text] of ys.ticks) {
    const py = at.y(v);
    if (y.kind !== "category") grid.append(svgNode("line", { x1: L, x2: W - 14, y1: py, y2: py }));
    ticks.append(svgNode("text", { class: "tick y", x: L - 6, y: py, "text-anchor": "end", "dominant-baseline": "middle" }, text));
  }
  for (const [v, text] of xs.ticks) {
    const px = at.x(v), py = H - B + 14;
    if (x.kind !== "category") grid.append(svgNode("line", { x1: px, x2: px, y1: T, y2: H - B }));
    ticks.append(tilted
      ? svgNode("text", { class: "tick x", x: px, y: py - 4, "text-anchor": "end", transform: `rotate(-35 ${px} ${py - 4})` }, text)
      : svgNode("text", { class: "tick x", x: px, y: py, "text-anchor": px + (text.length * CHAR_PX) / 2 > W ? "end" : "middle" }, text));
  }
  const frame = svgNode("path", { class: "axis", d: `M${L},${T}V${H - B}H${W - 14}` });
  root.append(grid, frame, ticks);
  if (xTitle) root.append(svgNode("text", { class: "axis-title", x: (L + W - 14) / 2, y: H - 4, "text-anchor": "middle" }, xTitle));
  if (yTitle) {
    const cy = (T + H - B) / 2;
    root.append(svgNode("text", { class: "axis-title", x: 12, y: cy, "text-anchor": "middle", transform: `rotate(-90 12 ${cy})` }, yTitle));
  }
  const hover = [];
  for (const s of series) root.append(marks(s, at, hover));
  root.append(legend.node);
  tooltip(root, hover, W);
  box.replaceChildren(root);
}

const px = (v) => Math.round(v * 10) / 10;

// One series' marks, and their hover text added to `hover`: {x0, x1, y, half (the mark's half height), text, series}.
// A mark's text may be given as a function: worked out only when shown (or read).
function marks(s, at, hover) {
  const g = svgNode("g", { class: "series" + (s.kind ? " " + s.kind : "") }), series = s.kind || s.name;
  const mark = (x0, x1, y, half, text) => hover.push({ x0, x1, y, half, series,
    get text() { return typeof text === "function" ? text() : text; } });
  if (s.segments && s.segments.length) {
    const d = s.segments.map(([x0, x1, y, text]) => {
      const a = px(at.x(x0)), b = px(at.x(x1)), c = px(at.y(y));
      mark(a, b, c, s.width / 2, text);
      return `M${a} ${c}H${b}`;
    });
    g.append(svgNode("path", { class: "bars", d: d.join(""), stroke: s.color, "stroke-width": s.width }));
  }
  if (s.line && s.line.length) {
    const points = [], dots = [];
    s.line.forEach(([x, y, text], i) => {
      const a = px(at.x(x)), c = px(at.y(y));
      if (s.step && i) points.push(`${a},${px(at.y(s.line[i - 1][1]))}`);
      points.push(`${a},${c}`);
      if (text) { dots.push(`M${a} ${c}h0`); mark(a, a, c, 4, text); }
    });
    g.append(svgNode("polyline", { class: "line", points: points.join(" "), stroke: s.color }),
      svgNode("path", { class: "markers", d: dots.join(""), stroke: s.color }));
  }
  if (s.dots && s.dots.length) {
    const d = s.dots.map(([x, y, text]) => {
      const a = px(at.x(x)), c = px(at.y(y));
      mark(a, a, c, 3, text);
      return `M${a} ${c}h0`;
    });
    g.append(svgNode("path", { class: "dots", d: d.join("") }));
  }
  return g;
}

// The hover text of the mark nearest the pointer (within a few pixels), in a box beside it; the marks last
// drawn first (a line's markers over the dots behind them).
function tooltip(root, hover, width) {
  const text = svgNode("text", { x: 6, y: 15 }), box = svgNode("rect", { height: 21, rx: 3 });
  const tip = svgNode("g", { class: "tip", visibility: "hidden" }, box, text);
  root.append(tip);
  root.hoverMarks = hover;
  root.addEventListener("mouseleave", () => tip.setAttribute("visibility", "hidden"));
  root.addEventListener("mousemove", (e) => {
    const r = root.getBoundingClientRect(), x = e.clientX - r.left, y = e.clientY - r.top;
    let best = null, bestD = 6;
    for (let i = hover.length - 1; i >= 0; i--) {
      const m = hover[i], dx = x < m.x0 ? m.x0 - x : x > m.x1 ? x - m.x1 : 0, dy = Math.max(0, Math.abs(y - m.y) - m.half);
      const d = Math.hypot(dx, dy);
      if (d < bestD) { best = m; bestD = d; }
    }
    if (!best) return tip.setAttribute("visibility", "hidden");
    text.textContent = best.text;
    const w = best.text.length * CHAR_PX + 12;
    box.setAttribute("width", w);
    tip.setAttribute("transform", `translate(${Math.max(0, Math.min(x + 12, width - w))},${Math.max(0, y - 28)})`);
    tip.setAttribute("visibility", "visible");
  });
}

// The legend: a swatch and a name each, in rows across the top; past LEGEND_ROWS, how many more there are.
function legendOf(named, width) {
  const node = svgNode("g", { class: "legend" });
  let col = 0, row = 0, left = 0;
  for (const [i, s] of named.entries()) {
    const w = 22 + s.name.length * CHAR_PX;
    if (col && col + w > width) { row++; col = 0; }
    if (row >= LEGEND_ROWS) { left = named.length - i; break; }
    const x = 12 + col, y = 8 + row * 16;
    node.append(svgNode("g", { class: "entry" },
      svgNode("rect", { x, y, width: 12, height: 8, rx: 2, fill: s.color }),
      svgNode("text", { x: x + 16, y: y + 8 }, s.name)));
    col += w + 10;
  }
  if (left) node.append(svgNode("text", { x: 12 + col, y: 8 + (LEGEND_ROWS - 1) * 16 + 8 }, `and ${left} more`));
  const rows = named.length ? Math.min(row + 1, LEGEND_ROWS) : 0;
  return { node, height: rows * 16 };
}
