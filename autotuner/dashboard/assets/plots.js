// autotune dashboard: the plots tab, drawn as the page's own SVG (chart.js). Loaded with chart.js when the tab is
// first opened (app.js `loadPlots`), so no other page pays for it.
//
// Two rules hold for every plot:
// - Text from the sweep (values, keys, metric and experiment names, GPU types, hosts, states) is drawn as text
//   (SVG text nodes, <title>s for hover text), never as markup: see chart.js. Titles and captions are the page's
//   own HTML, set as text.
// - What a plot draws is bounded, so a redraw costs the same at any size: past a bound it draws a sample drawn
//   evenly over the whole sweep (the runs whose hashed name is among the smallest: uniform, whatever order the
//   sweep ran in, and stable as it grows), and its caption says so; aggregates (the best of each value, the best
//   so far) and the axes' ranges are worked out from every run. Each plot is drawn in a task of its own, and a
//   redraw waits until the plots have taken at most PLOT_SHARE of the page's time.
"use strict";

const PLOT_POINTS = 1000;    // markers of one plot at most
const PARALLEL_LINES = 300;  // lines of the parallel coordinates
const TIMELINE_RUNS = 1000;  // runs on the slot timeline: every running one, then those that ended last
const PLOT_MS = 2000;        // a redraw waits at least this long after the last one...
const PLOT_SHARE = 0.1;      // ...and until the plots have taken at most this share of the page's time
const TICKS = 12;            // tick labels of an axis of categories at most
const STATE_COLORS = { succeeded: "#1f8a4c", failed: "#c8372d", timed_out: "#e0672b", running: "#0e7c9b",
  cancelled: "#b7791f", interrupted: "#8c6bb1", stopped: "#6b8fb3" };

// Distinct values as distinct labels: two long values cut to the same text are told apart by a number.
function labelsOf(values, limit) {
  const out = new Map(), taken = new Set();
  for (const v of values) {
    let label = cut(v, limit);
    for (let n = 2; taken.has(label); n++) label = cut(v, limit) + " #" + n;
    taken.add(label);
    out.set(keyOf(v), label);
  }
  return out;
}

function keyOf(v) { return typeof v === "string" ? "s" + v : JSON.stringify(v === undefined ? null : v); }

// (`collator`, `number`, `slotsOf`, `view` are app.js's.)
function byValue(a, b) {
  if (typeof a === "number" && typeof b === "number") return a - b;
  if (typeof a === "number") return -1;
  if (typeof b === "number") return 1;
  return collator.compare(keyOf(a), keyOf(b));
}

// A name as a well-spread 32-bit number (FNV-1a, then murmur3's finaliser).
function hashed(name) {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193);
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

// At most n of the rows, drawn evenly over all of them: those whose hashed names are the n smallest, in their order.
function sampleOf(rows, n) {
  if (rows.length <= n) return rows;
  const keyed = rows.map((r, i) => [hashed(String(r[0])), i]);
  keyed.sort((a, b) => a[0] - b[0]);
  return keyed.slice(0, n).map((k) => k[1]).sort((a, b) => a - b).map((i) => rows[i]);
}

// The smallest and largest of numbers (a loop: spreading 100,000 arguments overflows the stack).
function extent(values) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) { if (v < lo) lo = v; if (v > hi) hi = v; }
  return lo <= hi ? [lo, hi] : [0, 1];
}

function shownText(shown, all, what) {
  return shown < all ? `a sample of ${number(shown)} of the ${number(all)} ${what}, drawn evenly over the whole sweep`
    : `all ${number(all)} ${what}`;
}

// --- when to draw ------------------------------------------------------------------------------------------------
// The sweep changed: the plots are drawn again once a redraw is due (at most every PLOT_MS, and at most PLOT_SHARE
// of the time: a redraw that took 400 ms waits 4 s).
function plotsChanged(S) {
  S.plotStale = true;
  if (S.plotDrawing || S.plotTimer) return;
  const gap = Math.max(PLOT_MS, (S.plotCost || 0) / PLOT_SHARE);
  S.plotTimer = setTimeout(() => {
    S.plotTimer = null;
    if (view === S && S.plotStale) drawPlots(S);
  }, Math.max(0, (S.plotted || 0) + gap - Date.now()));
}

const nextTask = () => new Promise((resolve) => setTimeout(resolve, 0));

async function drawPlots(S) {
  if (!window.drawChart || !S.plots || !S.summary || !S.col) return;
  S.plotDrawing = true;
  S.plotStale = false;
  let cost = 0;
  const timed = (f) => { const t = performance.now(); try { return f(); } finally { cost += performance.now() - t; } };
  try {
    const data = timed(() => plotData(S));
    for (const draw of [drawMetric, drawBest, drawTimeline, drawParallel]) {
      await nextTask();  // each plot a task of its own: the page answers between them
      if (view !== S) return;
      timed(() => draw(S, data));
    }
  } finally {
    S.plotDrawing = false;
    S.plotted = Date.now();
    S.plotCost = cost;
    if (S.plotStale && view === S) plotsChanged(S);
  }
}

function plotData(S) {
  const c = S.col, rows = [...S.rows.values()];
  const ok = rows.filter((r) => r[c.state] === "succeeded" && typeof r[c.metric] === "number");
  const lower = S.summary.metric.direction.startsWith("lower");
  return { c, rows, ok, lower, m: S.summary.metric.name, shown: sampleOf(ok, PLOT_POINTS) };
}

function titled(S, key, title, caption) {
  S.plotTitles[key].textContent = title;
  S.plotCaptions[key].textContent = caption;
}

// --- the metric against the x key: the best run of each x value (a line per value of the lines key, per GPU type
// where several), over every run; the runs as faint dots behind -------------------------------------------------
function drawMetric(S, d) {
  const { c, rows, ok, m, lower } = d;
  const [x, lines] = S.axes, xi = c["param:" + x], li = lines ? c["param:" + lines] : undefined;
  const xOf = (r) => (xi !== undefined ? r[xi] : r[c.position]);
  const lineName = lines ? cut(lines.split(".").pop(), 24) + " " : "";
  const groups = new Map();
  for (const r of ok) {
    const gpu = r[c.gpu_type], value = li !== undefined ? r[li] : null, key = keyOf(gpu) + "\u0000" + keyOf(value);
    if (!groups.has(key)) {
      const parts = [gpu === null || gpu === undefined ? null : cut(gpu, 24), value === null || value === undefined ? null
        : lineName + cut(value, 24)].filter((v) => v !== null);
      groups.set(key, { parts, byX: new Map() });
    }
    const byX = groups.get(key).byX, at = keyOf(xOf(r)), seen = byX.get(at);
    if (!seen || (lower ? r[c.metric] < seen[c.metric] : r[c.metric] > seen[c.metric])) byX.set(at, r);
  }
  // The axis covers every value swept (of every run, not only those that succeeded).
  const distinct = new Map();
  for (const r of xi !== undefined ? rows : ok) { const v = xOf(r); if (v !== null && v !== undefined) distinct.set(keyOf(v), v); }
  const xs = [...distinct.values()].sort(byValue);
  const numeric = xs.every((v) => typeof v === "number");
  const categories = !numeric || xs.length <= 16;
  const index = new Map(xs.map((v, i) => [keyOf(v), i]));
  const labels = labelsOf(xs, 24);
  const at = (r) => (categories ? index.get(keyOf(xOf(r))) : xOf(r));
  const shown = (r) => `${cut(r[0])}: ${number(r[c.metric])}`;
  const series = [{ kind: "runs", dots: d.shown.map((r) => [at(r), r[c.metric], () => shown(r)]) }];
  [...groups.values()].sort((a, b) => byValue(a.parts.map(keyOf).join(), b.parts.map(keyOf).join()))
    .forEach(({ parts, byX }, i) => {
      const rs = [...byX.values()].sort((a, b) => byValue(xOf(a), xOf(b)));
      const name = parts.length ? parts.join(" · ") : cut(m);
      series.push({ name, color: PALETTE[i % PALETTE.length], line: rs.map((r) => [at(r), r[c.metric], () => `${name} · ${shown(r)}`]) });
    });
  const xAxis = categories ? { kind: "category", labels: xs.map((v) => labels.get(keyOf(v))) }
    : { kind: xs[0] > 0 && xs[xs.length - 1] / xs[0] >= 16 ? "log" : "number", lo: xs[0], hi: xs[xs.length - 1],
      whole: xs.every(Number.isInteger) };
  const xlabel = xi !== undefined ? x : "experiment (sweep order)";
  drawChart(S.plots.metric, { x: xAxis, y: metricAxis(ok, c), xTitle: cut(xlabel), yTitle: cut(m), series });
  titled(S, "metric", `best ${m} by ${xlabel}`, `Lines: the best run of each value${lines ? ", one line per " + lines : ""}` +
    `, of all ${number(ok.length)} runs that succeeded. Dots: ${shownText(d.shown.length, ok.length, "runs that succeeded")}.`);
}

// The metric's axis over every run that succeeded (whole numbers: whole ticks).
function metricAxis(ok, c) {
  const values = ok.map((r) => r[c.metric]), [lo, hi] = extent(values);
  return { kind: "number", lo, hi, whole: values.every(Number.isInteger) };
}

// --- the best so far over time ---------------------------------------------------------------------------------
function drawBest(S, d) {
  const { c, ok, m, lower } = d;
  const done = ok.filter((r) => r[c.finished]).sort((a, b) => a[c.finished] - b[c.finished]);
  const steps = [];
  let best = null;
  for (const r of done) {  // only the steps: the line's points are the improvements, however long the sweep
    const v = r[c.metric];
    if (best === null || (lower ? v < best : v > best)) { best = v; steps.push([r[c.finished], v, () => `best ${number(v)}: ${cut(r[0])}`]); }
  }
  if (done.length) steps.push([done[done.length - 1][c.finished], best, null]);
  const dots = d.shown.filter((r) => r[c.finished]);
  const [lo, hi] = extent(done.map((r) => r[c.finished]));
  drawChart(S.plots.best, { x: { kind: "time", lo, hi }, y: metricAxis(ok, c), xTitle: "ended at", yTitle: cut(m), series: [
    { kind: "runs", name: "runs", color: "#999", dots: dots.map((r) => [r[c.finished], r[c.metric], () => `${cut(r[0])}: ${number(r[c.metric])}`]) },
    { name: "best so far", color: PALETTE[0], line: steps, step: true }] });
  titled(S, "best", `best ${m} so far`, `Line: the best of every run as they ended. Dots: ${shownText(dots.length, done.length, "runs that succeeded")}.`);
}

// --- the slot timeline: each run a bar on every slot it held ----------------------------------------------------
// No text on the bars: a run's name is in its hover text.
function drawTimeline(S, d) {
  const { c, rows } = d;
  const ran = rows.filter((r) => r[c.started]);
  const running = ran.filter((r) => !r[c.finished]).sort((a, b) => a[c.started] - b[c.started]).slice(-TIMELINE_RUNS);
  const ended = ran.filter((r) => r[c.finished]).sort((a, b) => a[c.finished] - b[c.finished]);
  const kept = ended.slice(Math.max(0, ended.length - (TIMELINE_RUNS - running.length))).concat(running);
  const now = Date.now() / 1000;
  const held = kept.map((r) => [r, slotsOf(r[c.slots])]);
  const slots = [...new Set(held.flatMap(([, s]) => s))].sort(collator.compare);
  const row = new Map(slots.map((s, i) => [s, i]));
  const byState = new Map();
  // Runs back to back on a slot are told apart by a gap: each bar ends a little (0.8% of the time shown) early.
  const first = extent(kept.map((r) => r[c.started]))[0], last = extent(kept.map((r) => r[c.finished] || now))[1];
  const gap = (last - first) * 0.008;
  for (const [r, ss] of held) {
    const state = r[c.state];
    if (!byState.has(state)) byState.set(state, []);
    const bars = byState.get(state), label = () => cut(r[0]) + " · " + cut(state);
    const start = r[c.started], end = r[c.finished] || now;
    for (const s of ss) bars.push([start, Math.max(start + (end - start) / 2, end - gap), row.get(s), label]);
  }
  const width = Math.max(2, Math.min(16, 160 / Math.max(slots.length, 1)));
  const series = [...byState].sort((a, b) => (a[0] === "running") - (b[0] === "running") || collator.compare(a[0], b[0]))
    .map(([state, bars]) => ({ name: cut(state, 24), color: STATE_COLORS[state] || "#888", segments: bars, width }));
  drawChart(S.plots.timeline, { x: { kind: "time", lo: first, hi: last },
    y: { kind: "category", labels: slots.map(slotLabel), reversed: true }, xTitle: "time", series });
  const from = kept.length ? new Date(first * 1000).toLocaleTimeString() : "";
  titled(S, "timeline", "slot timeline", kept.length < ran.length
    ? `The ${number(kept.length)} runs that ended last or run now (from ${from}), of the ${number(ran.length)} that started: each a bar on every slot it held.`
    : `All ${number(ran.length)} runs that started, each a bar on every slot it held.`);
}

// A slot's name with its host cut, never its slot id: "a-very-long-host-na…:3".
function slotLabel(slot) {
  const at = slot.lastIndexOf(":");
  return at < 0 ? cut(slot, 28) : cut(slot.slice(0, at), 22) + ":" + cut(slot.slice(at + 1), 6);
}

// --- parallel coordinates over the swept keys, coloured by the metric -------------------------------------------
// A line a run (its name and metric its hover text), an axis a key, the metric's colour scale beside them.
const VIRIDIS = ["#440154", "#46327e", "#365c8d", "#277f8e", "#1fa187", "#4ac16d", "#a0da39", "#fde725"];

function drawParallel(S, d) {
  const { c, rows, ok, m, lower } = d;
  const keys = S.columns.filter((k) => k.startsWith("param:")).map((k) => k.slice(6));
  const lines = sampleOf(ok, PARALLEL_LINES);
  const names = axisNames(keys);
  const axes = keys.map((k, i) => axisOf(names[i], rows.map((r) => r[c["param:" + k]])));
  const [lo, hi] = extent(ok.map((r) => r[c.metric]));
  axes.push(parallelScale(cut(m, 16), lo, hi, null));
  const W = S.plots.parallel.clientWidth || 600, H = S.plots.parallel.clientHeight || 340;
  const first = axes.length ? axes[0].ticks.map(([, t]) => t.length) : [];
  const L = Math.min(150, 16 + CHAR_PX * Math.max(3, ...first)), R = 64, T = 60, B = 12;
  const ax = (i) => (axes.length > 1 ? L + (i * (W - L - R)) / (axes.length - 1) : (L + W - R) / 2);
  const ay = (share) => H - B - share * (H - T - B);
  const root = svgNode("svg", { class: "chart parallel", width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  const drawn = svgNode("g", { class: "series runs" });
  for (const r of lines) {
    const v = r[c.metric], share = hi > lo ? (v - lo) / (hi - lo) : 1;
    const band = Math.min(VIRIDIS.length - 1, Math.floor((lower ? 1 - share : share) * VIRIDIS.length));
    const points = axes.map((a, i) => `${ax(i)},${ay(a.at(i < keys.length ? r[c["param:" + keys[i]]] : v))}`);
    drawn.append(hoverText(svgNode("polyline", { class: "run", points: points.join(" "), stroke: VIRIDIS[band] }),
      `${cut(r[0])}: ${number(v)}`));
  }
  root.append(drawn);
  axes.forEach((a, i) => {
    const x = ax(i), g = svgNode("g", { class: "axis", "data-axis": i });
    g.append(svgNode("line", { x1: x, x2: x, y1: ay(0), y2: ay(1) }),
      svgNode("text", { class: "name", x, y: T - 10, transform: `rotate(-25 ${x} ${T - 10})` }, a.label));
    for (const [at, text] of a.ticks) g.append(svgNode("text", { class: "tick", x: x - 4, y: ay(at), "text-anchor": "end", "dominant-baseline": "middle" }, text));
    root.append(g);
  });
  if (lines.length) root.append(colourBar(W - 26, T, H - T - B, lower ? [hi, lo] : [lo, hi]));
  S.plots.parallel.replaceChildren(root);
  titled(S, "parallel", "parallel coordinates", (lines.length ? shownText(lines.length, ok.length, "runs that succeeded") + ", one line each; "
    : "No run has succeeded yet; ") + "axes: " + [...keys, m].join(", ") + " (each over every value swept).");
}

// The metric's colours, the best (yellow) at the top: [worst, best] labelled.
function colourBar(x, top, height, [worst, best]) {
  const g = svgNode("g", { class: "colour-bar" }), h = height / VIRIDIS.length;
  VIRIDIS.forEach((colour, i) => g.append(svgNode("rect", { x, y: top + (VIRIDIS.length - 1 - i) * h, width: 10, height: h + 0.5, fill: colour })));
  g.append(svgNode("text", { class: "tick", x: x + 5, y: top - 4, "text-anchor": "middle" }, number(best)),
    svgNode("text", { class: "tick", x: x + 5, y: top + height + 11, "text-anchor": "middle" }, number(worst)));
  return g;
}

// Each key by its last part, or by as many parts as tell it apart from the others.
function axisNames(keys) {
  return keys.map((k) => {
    const parts = k.split(".");
    for (let n = 1; n <= parts.length; n++) {
      const tail = parts.slice(-n).join(".");
      if (n === parts.length || keys.filter((o) => o === tail || o.endsWith("." + tail)).length === 1) return cut(tail, 16);
    }
    return cut(k, 16);
  });
}

// One axis over every value swept: {label, at: value -> 0..1, ticks: [[at, text]]}. Numbers on their own scale
// (logarithmic where they span 16x or more, as powers of two do; their values as ticks when few, never a fraction
// between whole values), anything else as categories, a tick each (at most TICKS).
function axisOf(label, swept) {
  if (swept.every((v) => typeof v === "number")) {
    const distinct = [...new Set(swept)].sort((a, b) => a - b);
    return parallelScale(label, distinct[0], distinct[distinct.length - 1], distinct.length <= TICKS ? distinct : null,
      distinct.every(Number.isInteger));
  }
  const found = new Map();
  for (const v of swept) found.set(keyOf(v), v);
  const cats = [...found.values()].sort(byValue);
  const index = new Map(cats.map((v, i) => [keyOf(v), i]));
  const labels = labelsOf(cats, 18), every = Math.ceil(cats.length / TICKS);
  const at = (i) => (cats.length > 1 ? i / (cats.length - 1) : 0.5);
  return { label, at: (v) => at(index.get(keyOf(v)) ?? 0),
    ticks: cats.map((v, i) => [at(i), labels.get(keyOf(v))]).filter((_, i) => i % every === 0) };
}

function parallelScale(label, lo, hi, values, whole = false) {
  const log = lo > 0 && hi / lo >= 16;
  const f = log ? Math.log : (v) => v;
  const at = (v) => (typeof v !== "number" ? 0 : hi > lo ? (f(v) - f(lo)) / (f(hi) - f(lo)) : 0.5);
  const inner = hi > lo ? (log ? logTicks(lo, hi) : roundTicks(lo, hi, whole)).filter((v) => v > lo && v < hi) : [];
  const ticks = values || [...new Set([lo, ...inner, hi])];
  return { label, at, ticks: ticks.map((v) => [at(v), number(v)]) };
}
