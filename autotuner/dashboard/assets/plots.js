// autotune dashboard: the plots tab. Loaded with plotly.js when the tab is first opened (app.js `loadPlots`), so
// no other page pays for plotly's start.
//
// Two rules hold for every plot:
// - Text from the sweep (values, keys, metric and experiment names, GPU types, hosts, states) reaches plotly only
//   through `plain`: plotly draws a subset of HTML in the text it draws (legends, titles, ticks, hover labels:
//   <b>, <a href>, <br>, <span style>), so the characters of markup are sent as entities, which plotly shows as
//   the characters themselves. Titles and captions are the page's own HTML, set as text.
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

// Text for plotly: markup characters as entities (which plotly shows as themselves), new lines as spaces, and a
// long value cut (the table and the run's page show it whole).
function plain(value, limit = 60) {
  let text = typeof value === "string" ? value : value === null || value === undefined ? "(none)" : JSON.stringify(value);
  text = text.replace(/[\r\n\t]+/g, " ");
  if (text.length > limit) text = text.slice(0, limit - 1) + "…";
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

// Distinct values as distinct labels: two long values cut to the same text are told apart by a number.
function labelsOf(values, limit) {
  const out = new Map(), taken = new Set();
  for (const v of values) {
    let label = plain(v, limit);
    for (let n = 2; taken.has(label); n++) label = plain(v, limit) + " #" + n;
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
  if (!window.Plotly || !S.plots || !S.summary || !S.col) return;
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

function theme() {
  const css = getComputedStyle(document.documentElement);
  const v = (n) => css.getPropertyValue(n).trim();
  return { paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { color: v("--fg"), size: 12 },
    margin: { l: 60, r: 20, t: 30, b: 40 }, legend: { orientation: "h", y: -0.15, yanchor: "top", maxheight: 0.3 },
    xaxis: { gridcolor: v("--line"), zerolinecolor: v("--line"), automargin: true },
    yaxis: { gridcolor: v("--line"), zerolinecolor: v("--line"), automargin: true } };
}

function layout(extra) {
  const base = theme();
  return { ...base, ...extra, xaxis: { ...base.xaxis, ...extra.xaxis }, yaxis: { ...base.yaxis, ...extra.yaxis } };
}

const OPTIONS = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d"] };
const FIXED = { responsive: true, displayModeBar: false };  // a plot with nothing to zoom

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
  const groups = new Map();
  for (const r of ok) {
    const parts = [r[c.gpu_type], li !== undefined ? r[li] : null].filter((v) => v !== null && v !== undefined);
    const key = parts.map((v) => keyOf(v)).join("\u0000");
    if (!groups.has(key)) groups.set(key, { parts, byX: new Map() });
    const byX = groups.get(key).byX, at = keyOf(xOf(r)), seen = byX.get(at);
    if (!seen || (lower ? r[c.metric] < seen[c.metric] : r[c.metric] > seen[c.metric])) byX.set(at, r);
  }
  // The axis covers every value swept (of every run, not only those that succeeded).
  const distinct = new Map();
  for (const r of xi !== undefined ? rows : ok) { const v = xOf(r); if (v !== null && v !== undefined) distinct.set(keyOf(v), v); }
  const xs = [...distinct.values()].sort(byValue);
  const numeric = xs.every((v) => typeof v === "number");
  const categories = !numeric || xs.length <= 16;
  const labels = categories ? labelsOf(xs, 24) : null;
  const at = (r) => (categories ? labels.get(keyOf(xOf(r))) : xOf(r));
  const lineName = lines ? plain(lines.split(".").pop(), 24) + " " : "";
  const traces = [...groups.values()].sort((a, b) => byValue(a.parts.map(keyOf).join(), b.parts.map(keyOf).join()))
    .map(({ parts, byX }) => {
      const rs = [...byX.values()].sort((a, b) => byValue(xOf(a), xOf(b)));
      return { type: "scatter", mode: "lines+markers", name: parts.length ? lineName + parts.map((v) => plain(v, 24)).join(" · ") : plain(m),
        x: rs.map(at), y: rs.map((r) => r[c.metric]), text: rs.map((r) => plain(r[0])), hovertemplate: "%{text}: %{y}<extra>%{fullData.name}</extra>" };
    });
  const dots = d.shown;
  traces.unshift({ type: "scatter", mode: "markers", name: "runs", showlegend: false, x: dots.map(at), y: dots.map((r) => r[c.metric]),
    text: dots.map((r) => plain(r[0])), hovertemplate: "%{text}: %{y}<extra></extra>", marker: { size: 4, color: "rgba(128,128,128,.35)" } });
  const xlabel = xi !== undefined ? x : "experiment (sweep order)";
  const xaxis = categories
    ? { type: "category", categoryorder: "array", categoryarray: xs.map((v) => labels.get(keyOf(v))), nticks: TICKS * 2 }
    : { type: xs[0] > 0 && xs[xs.length - 1] / xs[0] >= 16 ? "log" : "linear" };
  // (The x axis's name is in the card's title, above.)
  Plotly.react(S.plots.metric, traces, layout({ xaxis, yaxis: { title: { text: plain(m) } } }), OPTIONS);
  titled(S, "metric", `best ${m} by ${xlabel}`, `Lines: the best run of each value${lines ? ", one line per " + lines : ""}` +
    `, of all ${number(ok.length)} runs that succeeded. Dots: ${shownText(dots.length, ok.length, "runs that succeeded")}.`);
}

// --- the best so far over time ---------------------------------------------------------------------------------
function drawBest(S, d) {
  const { c, ok, m, lower } = d;
  const done = ok.filter((r) => r[c.finished]).sort((a, b) => a[c.finished] - b[c.finished]);
  const bx = [], by = [];
  let best = null;
  for (const r of done) {  // only the steps: the line's points are the improvements, however long the sweep
    const v = r[c.metric];
    if (best === null || (lower ? v < best : v > best)) { best = v; bx.push(r[c.finished] * 1000); by.push(v); }
  }
  if (done.length) { bx.push(done[done.length - 1][c.finished] * 1000); by.push(best); }
  const dots = d.shown.filter((r) => r[c.finished]);
  Plotly.react(S.plots.best, [
    { type: "scatter", mode: "lines", line: { shape: "hv" }, x: bx, y: by, name: "best", hovertemplate: "%{y}<extra>best</extra>" },
    { type: "scatter", mode: "markers", x: dots.map((r) => r[c.finished] * 1000), y: dots.map((r) => r[c.metric]), name: "runs",
      text: dots.map((r) => plain(r[0])), hovertemplate: "%{text}: %{y}<extra></extra>", marker: { size: 4, color: "rgba(128,128,128,.45)" } }],
  layout({ xaxis: { type: "date" }, yaxis: { title: { text: plain(m) } } }), OPTIONS);
  titled(S, "best", `best ${m} so far`, `Line: the best of every run as they ended. Dots: ${shownText(dots.length, done.length, "runs that succeeded")}.`);
}

// --- the slot timeline: each run a bar on every slot it held ----------------------------------------------------
// Drawn as one line per state (a thick segment per run and slot, gaps between): a handful of SVG paths, however
// many runs, and no text on the bars (a run's name is in its hover label).
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
  const gap = (last - first) * 8;
  for (const [r, ss] of held) {
    const state = r[c.state];
    if (!byState.has(state)) byState.set(state, { x: [], y: [], text: [] });
    const t = byState.get(state), label = plain(r[0]) + " · " + plain(state);
    const start = r[c.started] * 1000, end = (r[c.finished] || now) * 1000;
    for (const s of ss) {
      t.x.push(start, Math.max(start + (end - start) / 2, end - gap), null);
      t.y.push(row.get(s), row.get(s), null);
      t.text.push(label, label, null);
    }
  }
  const width = Math.max(2, Math.min(16, 160 / Math.max(slots.length, 1)));
  const every = Math.ceil(slots.length / 20);
  const traces = [...byState].sort((a, b) => (a[0] === "running") - (b[0] === "running") || collator.compare(a[0], b[0]))
    .map(([state, t]) => ({ type: "scatter", mode: "lines", name: plain(state), x: t.x, y: t.y, text: t.text, connectgaps: false,
      line: { width, color: STATE_COLORS[state] || "#888" }, hovertemplate: "%{text}<extra></extra>" }));
  const ticks = slots.map((_, i) => i).filter((i) => i % every === 0);
  Plotly.react(S.plots.timeline, traces, layout({ xaxis: { type: "date" },
    yaxis: { tickmode: "array", tickvals: ticks, ticktext: ticks.map((i) => slotLabel(slots[i])), range: [slots.length - 0.4, -0.6], zeroline: false } }), OPTIONS);
  const from = kept.length ? new Date(extent(kept.map((r) => r[c.started]))[0] * 1000).toLocaleTimeString() : "";
  titled(S, "timeline", "slot timeline", kept.length < ran.length
    ? `The ${number(kept.length)} runs that ended last or run now (from ${from}), of the ${number(ran.length)} that started: each a bar on every slot it held.`
    : `All ${number(ran.length)} runs that started, each a bar on every slot it held.`);
}

// A slot's name with its host cut, never its slot id: "a-very-long-host-na…:3".
function slotLabel(slot) {
  const at = slot.lastIndexOf(":");
  return at < 0 ? plain(slot, 28) : plain(slot.slice(0, at), 22) + ":" + plain(slot.slice(at + 1), 6);
}

// --- parallel coordinates over the swept keys, coloured by the metric -------------------------------------------
// Drawn in SVG, as lines of one scatter trace per colour band: plotly's own parcoords draws with WebGL, whose start
// alone took seconds of the page's main thread with a software renderer (a machine without a GPU, a browser that
// falls back to one). A run's name and metric are in the hover label of each of its points.
const VIRIDIS = ["#440154", "#46327e", "#365c8d", "#277f8e", "#1fa187", "#4ac16d", "#a0da39", "#fde725"];

function drawParallel(S, d) {
  const { c, rows, ok, m, lower } = d;
  const keys = S.columns.filter((k) => k.startsWith("param:")).map((k) => k.slice(6));
  const lines = sampleOf(ok, PARALLEL_LINES);
  const names = axisNames(keys);
  const axes = keys.map((k, i) => axisOf(names[i], rows.map((r) => r[c["param:" + k]])));
  const [lo, hi] = extent(ok.map((r) => r[c.metric]));
  axes.push(scaleOf(plain(m, 16), lo, hi, null));
  const bands = VIRIDIS.map(() => ({ x: [], y: [], text: [] }));
  for (const r of lines) {
    const v = r[c.metric], share = hi > lo ? (v - lo) / (hi - lo) : 1;
    const band = bands[Math.min(VIRIDIS.length - 1, Math.floor((lower ? 1 - share : share) * VIRIDIS.length))];
    const label = plain(r[0]) + ": " + number(v);
    axes.forEach((a, i) => {
      band.x.push(i);
      band.y.push(a.at(i < keys.length ? r[c["param:" + keys[i]]] : v));
      band.text.push(label);
    });
    band.x.push(null); band.y.push(null); band.text.push(null);
  }
  const css = getComputedStyle(document.documentElement), fg = css.getPropertyValue("--fg").trim();
  const traces = bands.map((b, i) => ({ type: "scatter", mode: "lines", x: b.x, y: b.y, text: b.text, connectgaps: false,
    line: { width: 1, color: VIRIDIS[i] }, opacity: 0.6, hovertemplate: "%{text}<extra></extra>", showlegend: false }));
  if (lines.length) {  // the colour scale: one point out of sight, for its colour bar
    traces.push({ type: "scatter", mode: "markers", x: [0], y: [-9], hoverinfo: "skip", showlegend: false, marker: { color: [lo], cmin: lo, cmax: hi,
      colorscale: VIRIDIS.map((col, i) => [i / (VIRIDIS.length - 1), col]), reversescale: lower, showscale: true, colorbar: { thickness: 10, len: 0.9 } } });
  }
  const shapes = axes.map((_, i) => ({ type: "line", x0: i, x1: i, y0: 0, y1: 1, line: { color: fg, width: 1 } }));
  const font = { size: 10, color: fg };
  const annotations = axes.flatMap((a, i) => [
    { x: i, y: 1.02, yanchor: "bottom", xanchor: "left", text: a.label, showarrow: false, textangle: -25, font: { size: 11, color: fg } },
    ...a.ticks.map(([at, text]) => ({ x: i, y: at, xanchor: "right", xshift: -3, text, showarrow: false, font }))]);
  const first = axes.length ? axes[0].ticks.map(([, t]) => t.replace(/&\w+;/g, "x").length) : [];
  const left = Math.min(150, 16 + 6 * Math.max(3, ...first));
  Plotly.react(S.plots.parallel, traces, layout({ margin: { l: left, r: 30, t: 60, b: 10 }, shapes, annotations, hovermode: "closest",
    xaxis: { visible: false, fixedrange: true, range: [-0.08, Math.max(axes.length - 1, 1) + 0.08] },
    yaxis: { visible: false, fixedrange: true, range: [-0.04, 1.04] } }), FIXED);
  titled(S, "parallel", "parallel coordinates", (lines.length ? shownText(lines.length, ok.length, "runs that succeeded") + ", one line each; "
    : "No run has succeeded yet; ") + "axes: " + [...keys, m].join(", ") + " (each over every value swept).");
}

// Each key by its last part, or by as many parts as tell it apart from the others.
function axisNames(keys) {
  return keys.map((k) => {
    const parts = k.split(".");
    for (let n = 1; n <= parts.length; n++) {
      const tail = parts.slice(-n).join(".");
      if (n === parts.length || keys.filter((o) => o === tail || o.endsWith("." + tail)).length === 1) return plain(tail, 16);
    }
    return plain(k, 16);
  });
}

// One axis over every value swept: {label, at: value -> 0..1, ticks: [[at, text]]}. Numbers on their own scale
// (logarithmic where they span 16x or more, as powers of two do; their values as ticks when few, never a fraction
// between whole values), anything else as categories, a tick each (at most TICKS).
function axisOf(label, swept) {
  if (swept.every((v) => typeof v === "number")) {
    const distinct = [...new Set(swept)].sort((a, b) => a - b);
    return scaleOf(label, distinct[0], distinct[distinct.length - 1], distinct.length <= TICKS ? distinct : null);
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

function scaleOf(label, lo, hi, values) {
  const log = lo > 0 && hi / lo >= 16;
  const f = log ? Math.log : (v) => v;
  const at = (v) => (typeof v !== "number" ? 0 : hi > lo ? (f(v) - f(lo)) / (f(hi) - f(lo)) : 0.5);
  const ticks = values || (log ? powers(lo, hi) : roundTicks(lo, hi));
  return { label, at, ticks: ticks.map((v) => [at(v), number(v)]) };
}

// About five round numbers between lo and hi (1, 2 or 5 times a power of ten apart), lo and hi among them.
function roundTicks(lo, hi) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / 4, unit = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((k) => k * unit).find((s) => s >= raw);
  const out = [lo];
  for (let v = Math.ceil(lo / step) * step; v < hi; v += step) if (v - lo > step / 3 && hi - v > step / 3) out.push(v);
  return [...out, hi];
}

function powers(lo, hi) {
  const out = [];
  for (let e = Math.ceil(Math.log10(lo)); 10 ** e <= hi; e++) out.push(10 ** e);
  return [lo, ...out.filter((v) => v > lo && v < hi), hi];
}
