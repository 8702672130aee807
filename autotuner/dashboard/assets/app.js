// autotune dashboard: the page. It asks the server only for what changed since the last transition it saw
// (GET /api/sweeps/ID?since=N), keeps every row in memory, and draws the table, the plots and the logs from them.
"use strict";

const POLL_MS = 500;          // what the runner records shows within a second
const PAGE_ROWS = 100;        // table rows drawn at once (sorting and filtering work on all of them)
const PLOT_MS = 2000;         // plots are redrawn at most this often
const LOG_MS = 1000;

// The link the terminal prints carries no token but a one-time code in its fragment (#code=..., never sent with
// the page). It leaves the address here, before anything is fetched, and is traded for the token (kept in this
// tab's sessionStorage), which spends it: the browser's history keeps a dead code, nothing that opens the
// dashboard. A ?token= link (an older autotune's, or made by hand) is taken out of the address the same way.
const link = (() => {
  const code = /^#code=([\w-]+)$/.exec(location.hash);
  const given = new URLSearchParams(location.search).get("token");
  if (code || given !== null) history.replaceState(null, "", location.pathname + (code ? "" : location.hash));
  return { code: code && code[1], given };
})();
let token = sessionStorage.getItem("autotune-token") || "";
let signedOut = "";  // why the link opened nothing, shown in place of the page

async function signIn() {
  if (!link.code && link.given === null) return;
  if (document.prerendering) {  // a page the browser prepares ahead spends no code: only the one opened does
    await new Promise((done) => document.addEventListener("prerenderingchange", done, { once: true }));
  }
  const response = await (link.code
    ? fetch("/api/session", { method: "POST", headers: { "X-Autotune-Code": link.code } })
    : fetch("/api/config", { headers: { "X-Autotune-Token": link.given } })).catch(() => null);
  if (response && response.ok) {
    token = link.code ? (await response.json()).token : link.given;
    sessionStorage.setItem("autotune-token", token);
  } else if (!token) {  // a tab signed in before keeps its token: an old link reopened in it changes nothing
    const said = response && link.code ? await response.json().then((b) => b.error, () => "") : "";
    signedOut = !response ? "The dashboard does not answer: is autotune dashboard still running?"
      : said || "This link's token is not this dashboard's: open the link the terminal printed last.";
  }
}

let config = { allow_cancel: false };
let timer = null;
let view = null;  // what is shown: {kind, ...}

// --- small helpers -------------------------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: { "X-Autotune-Token": token, ...(options.headers || {}) } });
  if (!response.ok) {
    let message = response.statusText;
    try { message = (await response.json()).error || message; } catch (e) { /* not JSON */ }
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  return response;
}

function toast(text) {
  const box = document.getElementById("toast");
  box.textContent = text;
  box.hidden = false;
  clearTimeout(box.timer);
  box.timer = setTimeout(() => { box.hidden = true; }, 6000);
}

function live(ok, text) {
  const mark = document.getElementById("live");
  mark.className = "live " + (ok ? "on" : "off");
  mark.textContent = text;
}

function number(v) {
  if (v === null || v === undefined) return "";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return v.toLocaleString("en-US");
  const a = Math.abs(v);
  return a >= 1000 ? v.toLocaleString("en-US", { maximumFractionDigits: 1 }) : a >= 1 ? v.toFixed(3) : v.toPrecision(4);
}

function seconds(s) {
  if (s === null || s === undefined) return "?";
  s = Math.max(Math.round(s), 0);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
}

function when(t) { return t ? new Date(t * 1000).toLocaleTimeString() : ""; }
function stateBadge(s) { return el("span", { class: "state s-" + s }, s.replace("_", " ")); }

async function copy(text) {
  try { await navigator.clipboard.writeText(text); toast("copied"); } catch (e) { toast("select the text and copy it"); }
}

async function cancelRuns(sweepId, names) {
  const what = names.length ? names.join(", ") : "the whole sweep";
  if (!confirm("Cancel " + what + "?")) return;
  try {
    const response = await api("/api/sweeps/" + sweepId + "/cancel", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ names }) });
    toast((await response.json()).message);
  } catch (e) { toast("cancel refused: " + e.message); }
}

function stop() { if (timer) clearTimeout(timer); timer = null; }
function schedule(fn, ms) { stop(); timer = setTimeout(fn, ms); }

// --- routing -------------------------------------------------------------------------------------------------
function route() {
  stop();
  const main = document.getElementById("main");
  main.replaceChildren();
  if (!token) {
    main.append(el("div", { class: "notice" }, signedOut || ["Open the link that ", el("code", {}, "autotune dashboard"),
      " printed last: it signs this page in (a link opens the page once)."]));
    return;
  }
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (parts[0] === "s" && parts[1] && parts[2] === "run" && parts[3]) showRun(main, parts[1], parts[3]);
  else if (parts[0] === "s" && parts[1]) showSweep(main, parts[1], parts[2] || "experiments");
  else showSweeps(main);
}

function crumbs(...items) {
  document.getElementById("crumbs").replaceChildren(...items.flatMap((x, i) => i ? [" / ", x] : [x]));
}

// --- the list of sweeps --------------------------------------------------------------------------------------
function showSweeps(main) {
  crumbs("sweeps");
  view = { kind: "sweeps" };
  const body = el("tbody");
  main.append(el("h1", {}, "Sweeps"), el("div", { class: "tablewrap" }, el("table", { id: "sweeps" },
    el("thead", {}, el("tr", {}, ["sweep", "directory", "state", "done", "running", "queued", "failed", "best", "ETA"]
      .map((h) => el("th", {}, h)))), body)));
  const tick = async () => {
    try {
      const data = await (await api("/api/sweeps")).json();
      body.replaceChildren(...data.sweeps.map(sweepLine));
      if (!data.sweeps.length) body.append(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No sweep yet: they appear here as they start.")));
      live(true, "live");
    } catch (e) { live(false, e.message); }
    if (view.kind === "sweeps") schedule(tick, 2000);
  };
  tick();
}

function sweepLine(s) {
  if (s.error) return el("tr", {}, el("td", {}, s.name), el("td", { colspan: 8, class: "why" }, s.error));
  const c = s.counts, best = s.best[0];
  const eta = s.eta.end ? seconds(s.eta.end - Date.now() / 1000) : (s.eta.why === "finished" ? "done" : "?");
  return el("tr", {},
    el("td", { class: "name" }, el("a", { href: "#/s/" + s.id }, s.name)), el("td", {}, s.directory),
    el("td", {}, s.runner ? stateBadge("running") : el("span", { class: "muted" }, (c.queued || c.running) ? "stopped (no runner)" : "finished")),
    el("td", { class: "num" }, number(c.succeeded || 0) + " / " + number(s.total)),
    el("td", { class: "num" }, number(c.running || 0)), el("td", { class: "num" }, number(c.queued || 0)),
    el("td", { class: "num" }, number((c.failed || 0) + (c.timed_out || 0))),
    el("td", {}, best ? best.name + " (" + number(best.value) + ")" : ""), el("td", {}, eta));
}

// --- one sweep -------------------------------------------------------------------------------------------------
function showSweep(main, id, tab) {
  const S = view = { kind: "sweep", id, tab, seq: -1, sv: null, columns: [], rows: new Map(), summary: null,
    axes: [null, null], sort: { col: "rank", dir: 1 }, filter: "", state: "", page: 0, dirty: true, plotted: 0 };
  S.top = el("div");
  S.tabs = el("div", { class: "tabs" }, ["experiments", "plots", "compare"].map((t) =>
    el("button", { class: t === tab ? "on" : "", "data-tab": t, onclick: () => { location.hash = "#/s/" + id + "/" + t; } }, t)));
  S.body = el("div");
  main.append(S.top, S.tabs, S.body);
  if (tab === "experiments") buildTable(S);
  else if (tab === "plots") buildPlots(S);
  else buildCompare(S);
  const tick = async () => {
    if (view !== S) return;
    try {
      const url = "/api/sweeps/" + id + "?since=" + S.seq + (S.sv ? "&sv=" + encodeURIComponent(S.sv) : "");
      apply(S, await (await api(url)).json());
      live(true, "live · transition " + S.seq);
    } catch (e) {
      live(false, e.message);
      if (e.status === 404 || e.status === 403) { S.body.replaceChildren(el("p", { class: "notice" }, e.message)); return; }
    }
    if (view === S) schedule(tick, POLL_MS);
  };
  tick();
}

function apply(S, data) {
  if (data.full) {
    S.rows.clear();
    S.columns = data.columns;
    S.col = Object.fromEntries(data.columns.map((c, i) => [c, i]));
    S.axes = data.axes;
  }
  for (const row of data.rows) S.rows.set(row[0], row);
  if (data.rows.length || data.full) S.dirty = true;
  S.seq = data.seq;
  if (data.summary) { S.summary = data.summary; S.sv = data.sv; drawTop(S); }
  else if (S.summary) drawEta(S);
  if (S.table) tickDurations(S.table);
  if (!S.dirty) return;
  rank(S);
  if (S.tab === "experiments") { drawTable(S); S.dirty = false; }
  else if (S.tab === "plots" && Date.now() - S.plotted > PLOT_MS) { drawPlots(S); S.dirty = false; }
  else if (S.tab === "compare") S.dirty = false;
}

function rank(S) {
  // 1 is the best, as the report ranks: by the metric, per GPU type where the sweep ran on several.
  const m = S.col.metric, t = S.col.gpu_type, sign = S.summary && S.summary.metric.direction.startsWith("lower") ? 1 : -1;
  const ok = [...S.rows.values()].filter((r) => r[S.col.state] === "succeeded" && r[m] !== null);
  ok.sort((a, b) => String(a[t]).localeCompare(String(b[t])) || sign * (a[m] - b[m]) || a[S.col.position] - b[S.col.position]);
  S.ranks = new Map();
  let kind, n = 0;
  for (const r of ok) { if (r[t] !== kind) { kind = r[t]; n = 0; } S.ranks.set(r[0], ++n); }
}

function drawTop(S) {
  const s = S.summary;
  crumbs(el("a", { href: "#/" }, "sweeps"), s.name);
  const counts = el("div", { class: "counts" }, ["succeeded", "failed", "timed_out", "running", "queued", "cancelled", "interrupted"]
    .filter((k) => s.counts[k] || ["succeeded", "running", "queued"].includes(k))
    .map((k) => el("span", {}, el("b", { class: "s-" + k }, number(s.counts[k] || 0)), " " + k.replace("_", " "))),
    el("span", { class: "muted" }, "of " + number(s.total) + (s.search ? " proposed (" + s.search + " search)" : "")));
  S.etaLine = el("div", { class: "eta" });
  const head = el("div", { class: "card" },
    el("div", { class: "row spread" }, el("h1", {}, s.name),
      config.allow_cancel && (s.counts.running || s.counts.queued)
        ? el("button", { class: "danger", id: "cancel-sweep", onclick: () => cancelRuns(S.id, []) }, "Cancel sweep") : null),
    el("div", { class: "muted" }, s.directory + " · " + s.metric.name + " (" + s.metric.direction + ") · " +
      (s.runner ? "runner pid " + s.runner : "no runner works on it")),
    el("div", { style: "margin-top:.5rem" }, counts), S.etaLine);
  const bests = el("div", { class: "card", id: "best" }, el("h2", {}, "Best so far"),
    s.best.length ? s.best.map((b) => el("div", {},
      el("div", {}, b.gpu_type ? el("b", {}, b.gpu_type + ": ") : null,
        el("a", { href: "#/s/" + S.id + "/run/" + encodeURIComponent(b.name) }, b.name), " · " + s.metric.name + " " + number(b.value)),
      b.config ? el("div", { class: "row spread" }, el("span", { class: "muted" }, "ds_config_optimal.json"),
        el("button", { class: "small", onclick: () => copy(JSON.stringify(b.config, null, 2)) }, "copy")) : null,
      b.config ? el("pre", { class: "config" }, JSON.stringify(b.config, null, 2)) : null,
      b.command ? el("div", { class: "row spread" }, el("span", { class: "muted" }, "command"),
        el("button", { class: "small", onclick: () => copy(b.command) }, "copy")) : null,
      b.command ? el("pre", { class: "command" }, b.command) : null))
      : el("p", { class: "muted" }, "none yet"));
  const nodes = el("div", { class: "card" }, el("h2", {}, "Nodes"), el("div", { class: "nodes" }, s.nodes.map((n) =>
    el("div", { class: "node" }, el("span", { class: "host" }, n.host + (n.gpu_type ? " · " + n.gpu_type : "")),
      el("span", {}, n.slots.map((x) => el("span", { class: "slot " + (n.lost ? "lost" : x.run ? "busy" : "free"),
        title: n.host + ":" + x.id + (n.lost ? " lost" : x.run ? " runs " + x.run : " free") }))),
      n.lost ? el("span", { class: "s-failed" }, "lost") : null))),
    el("div", { class: "muted", style: "margin-top:.4rem;font-size:12px" }, "■ busy  □ free  ▨ lost"));
  S.top.replaceChildren(el("div", { class: "grid" }, head, bests, nodes));
  drawEta(S);
}

function drawEta(S) {
  const s = S.summary, e = s.eta, now = Date.now() / 1000;
  const elapsed = s.first_start ? "elapsed " + seconds(now - s.first_start) + " · " : "";
  S.etaLine.textContent = e.end ? elapsed + "ETA ~" + seconds(e.end - now) + " (re-planned as the terminal's live view)"
    : e.why === "finished" ? "finished" : elapsed + "ETA ? (" + e.why + ")";
}

// A running row's duration grows between transitions: its cell carries the start and is redrawn at every poll.
function tickDurations(table) {
  const now = Date.now() / 1000;
  for (const td of table.querySelectorAll("td[data-started]")) td.textContent = seconds(now - Number(td.dataset.started));
}

// --- the experiments table -------------------------------------------------------------------------------------
function buildTable(S) {
  S.filterBox = el("input", { type: "search", id: "filter", placeholder: "filter: name, value, reason…",
    oninput: (ev) => { S.filter = ev.target.value.toLowerCase(); S.page = 0; drawTable(S); } });
  S.stateBox = el("select", { id: "state-filter", onchange: (ev) => { S.state = ev.target.value; S.page = 0; drawTable(S); } },
    ["", "succeeded", "failed", "timed_out", "running", "queued", "cancelled", "interrupted"].map((v) => el("option", { value: v }, v || "every state")));
  S.count = el("span", { class: "muted" });
  S.table = el("table", { id: "experiments" });
  S.pager = el("div", { class: "row pager" });
  S.body.replaceChildren(el("div", { class: "row filters" }, S.filterBox, S.stateBox, S.count),
    el("div", { class: "tablewrap" }, S.table), S.pager);
}

function tableColumns(S) {
  const c = S.columns;
  const params = c.filter((x) => x.startsWith("param:"));
  const metrics = c.filter((x) => x.startsWith("metric:"));
  const typed = S.summary && S.summary.types.length > 1;
  return ["rank", "name", "state", ...(typed ? ["gpu_type"] : []), ...params, ...metrics, "duration", "slots", "why",
    ...(config.allow_cancel ? ["action"] : [])];
}

function cell(S, r, key) {
  const c = S.col;
  if (key === "rank") return S.ranks.get(r[0]) ?? null;
  if (key === "duration") return r[c.started] && r[c.finished] ? r[c.finished] - r[c.started] : r[c.started] ? Date.now() / 1000 - r[c.started] : null;
  if (key === "why") return [r[c.reason], r[c.detail]].filter(Boolean).join(": ");
  return r[c[key]];
}

function visible(S) {
  const rows = [...S.rows.values()].filter((r) => (!S.state || r[S.col.state] === S.state) &&
    (!S.filter || r.some((v) => v !== null && String(v).toLowerCase().includes(S.filter))));
  const { col, dir } = S.sort;
  rows.sort((a, b) => {
    const x = cell(S, a, col), y = cell(S, b, col);
    if (x === y) return a[S.col.position] - b[S.col.position];
    if (x === null || x === undefined || x === "") return 1;
    if (y === null || y === undefined || y === "") return -1;
    return (typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y), undefined, { numeric: true })) * dir;
  });
  return rows;
}

function drawTable(S) {
  if (!S.table || !S.col) return;
  const keys = tableColumns(S);
  const rows = visible(S);
  const pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
  S.page = Math.min(S.page, pages - 1);
  const label = (k) => k.replace(/^(param|metric):/, "");
  const head = el("tr", {}, keys.map((k) => el("th", { "data-col": k, class: S.sort.col === k ? (S.sort.dir > 0 ? "sorted-asc" : "sorted-desc") : "",
    onclick: () => { S.sort = { col: k, dir: S.sort.col === k ? -S.sort.dir : (k.startsWith("metric:") && !k.endsWith("latency") ? -1 : 1) }; drawTable(S); } },
    k === "why" ? "reason" : label(k))));
  const best = new Set((S.summary ? S.summary.best : []).map((b) => b.name));
  const body = rows.slice(S.page * PAGE_ROWS, (S.page + 1) * PAGE_ROWS).map((r) => el("tr", { "data-name": r[0], class: best.has(r[0]) ? "best" : "" },
    keys.map((k) => {
      const v = cell(S, r, k);
      if (k === "name") return el("td", { class: "name" }, el("a", { href: "#/s/" + S.id + "/run/" + encodeURIComponent(r[0]) }, r[0]));
      if (k === "state") return el("td", {}, stateBadge(v));
      if (k === "why") return el("td", { class: "why" }, v);
      if (k === "duration") return el("td", { class: "num", "data-started": r[S.col.started] && !r[S.col.finished] ? r[S.col.started] : null },
        v === null ? "" : seconds(v));
      if (k === "action") return el("td", {}, ["running", "queued"].includes(r[S.col.state])
        ? el("button", { class: "small danger", onclick: () => cancelRuns(S.id, [r[0]]) }, "cancel") : null);
      return el("td", { class: typeof v === "number" ? "num" : "" }, typeof v === "object" && v !== null ? JSON.stringify(v) : number(v));
    })));
  S.table.replaceChildren(el("thead", {}, head), el("tbody", {}, body));
  S.count.textContent = number(rows.length) + " of " + number(S.rows.size) + " experiments";
  S.pager.replaceChildren(...(pages > 1 ? [
    el("button", { disabled: S.page === 0 ? true : null, onclick: () => { S.page--; drawTable(S); } }, "‹ previous"),
    el("span", { class: "muted" }, "page " + (S.page + 1) + " of " + pages),
    el("button", { disabled: S.page >= pages - 1 ? true : null, onclick: () => { S.page++; drawTable(S); } }, "next ›")] : []));
}

// "node1:0,1@node2:0,1" (the feed's slots of a run) as one name per slot: node1:0, node1:1, node2:0, node2:1.
function slotsOf(text) {
  return (text || "").split("@").filter(Boolean).flatMap((part) => {
    const at = part.lastIndexOf(":");  // a host may hold colons itself (::1)
    return at < 0 ? [part] : part.slice(at + 1).split(",").map((id) => part.slice(0, at + 1) + id);
  });
}

// --- plots -----------------------------------------------------------------------------------------------------
function buildPlots(S) {
  S.plots = Object.fromEntries(["metric", "best", "timeline", "parallel"].map((k) => [k, el("div", { class: "plot", id: "plot-" + k })]));
  S.body.replaceChildren(el("div", { class: "plots" }, Object.values(S.plots).map((p) => el("div", { class: "card" }, p))));
}

function theme() {
  const css = getComputedStyle(document.documentElement);
  const v = (n) => css.getPropertyValue(n).trim();
  return { paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { color: v("--fg"), size: 12 },
    margin: { l: 60, r: 20, t: 40, b: 80 }, legend: { orientation: "h", y: -0.3 },
    xaxis: { gridcolor: v("--line"), zerolinecolor: v("--line") }, yaxis: { gridcolor: v("--line"), zerolinecolor: v("--line") } };
}

function drawPlots(S) {
  if (!window.Plotly || !S.plots || !S.summary) return;
  S.plotted = Date.now();
  const c = S.col, m = S.summary.metric.name, rows = [...S.rows.values()];
  const ok = rows.filter((r) => r[c.state] === "succeeded" && r[c.metric] !== null);
  const base = theme(), opts = { responsive: true, displaylogo: false };
  const layout = (title, extra) => ({ ...base, title: { text: title, font: { size: 14 }, x: 0.01, xanchor: "left" }, ...extra,
    xaxis: { ...base.xaxis, ...(extra && extra.xaxis) }, yaxis: { ...base.yaxis, ...(extra && extra.yaxis) } });
  // The metric against the x key: the best run of each x value, a line per value of the lines key (per GPU type
  // where several); every run as a faint dot behind.
  const [x, lines] = S.axes, xi = c["param:" + x], li = lines ? c["param:" + lines] : undefined;
  const lower = S.summary.metric.direction.startsWith("lower");
  const xOf = (r) => (xi !== undefined ? r[xi] : r[c.position]);
  const groups = new Map();
  for (const r of ok) {
    const key = [r[c.gpu_type], li !== undefined ? r[li] : null].filter((v) => v !== null && v !== undefined).join(" · ");
    if (!groups.has(key)) groups.set(key, new Map());
    const byX = groups.get(key), at = JSON.stringify(xOf(r)), seen = byX.get(at);
    if (!seen || (lower ? r[c.metric] < seen[c.metric] : r[c.metric] > seen[c.metric])) byX.set(at, r);
  }
  const order = (a, b) => (typeof a === "number" && typeof b === "number" ? a - b : String(a).localeCompare(String(b)));
  const xs = [...new Set(ok.map(xOf))].sort(order);
  const few = xs.length <= 16;
  const traces = [...groups].sort().map(([key, byX]) => {
    const rs = [...byX.values()].sort((a, b) => order(xOf(a), xOf(b)));
    return { type: "scatter", mode: "lines+markers", name: key ? (lines ? lines.split(".").pop() + " " : "") + key : m,
      x: rs.map((r) => (few ? String(xOf(r)) : xOf(r))), y: rs.map((r) => r[c.metric]), text: rs.map((r) => r[0]) };
  });
  const dots = ok.slice(-3000);
  traces.unshift({ type: "scatter", mode: "markers", name: "every run", x: dots.map((r) => (few ? String(xOf(r)) : xOf(r))),
    y: dots.map((r) => r[c.metric]), text: dots.map((r) => r[0]), marker: { size: 4, color: "rgba(128,128,128,.35)" }, showlegend: false });
  const xlabel = xi !== undefined ? x : "experiment (sweep order)";
  const xaxis = few ? { type: "category", categoryorder: "array", categoryarray: xs.map(String) } : { type: xs.every((v) => typeof v === "number" && v > 0) ? "log" : "-" };
  Plotly.react(S.plots.metric, traces, layout("best " + m + " by " + xlabel, { xaxis: { title: { text: xlabel }, ...xaxis }, yaxis: { title: { text: m } } }), opts);
  // Best so far over time (the latest 3,000 runs as dots).
  const done = ok.filter((r) => r[c.finished]).sort((a, b) => a[c.finished] - b[c.finished]);
  let bestv = null; const bx = [], by = [];
  for (const r of done) { const v = r[c.metric]; if (bestv === null || (lower ? v < bestv : v > bestv)) bestv = v; bx.push(new Date(r[c.finished] * 1000)); by.push(bestv); }
  Plotly.react(S.plots.best, [{ type: "scatter", mode: "lines", line: { shape: "hv" }, x: bx, y: by, name: "best" },
    { type: "scatter", mode: "markers", x: done.slice(-3000).map((r) => new Date(r[c.finished] * 1000)), y: done.slice(-3000).map((r) => r[c.metric]), name: "runs", marker: { size: 4, color: "rgba(128,128,128,.45)" } }],
  layout("best " + m + " so far", { yaxis: { title: { text: m } } }), opts);
  // The slot timeline: each run a bar on every slot it holds (the latest 1,500 runs).
  const now = Date.now() / 1000, colors = { succeeded: "#1f8a4c", failed: "#c8372d", timed_out: "#c8372d", running: "#0e7c9b", cancelled: "#b7791f", interrupted: "#b7791f" };
  const ran = rows.filter((r) => r[c.started]).sort((a, b) => a[c.started] - b[c.started]).slice(-1500);
  const byState = new Map();
  for (const r of ran) { const s = r[c.state]; if (!byState.has(s)) byState.set(s, []); byState.get(s).push(r); }
  Plotly.react(S.plots.timeline, [...byState].map(([s, rs]) => {
    const bars = rs.flatMap((r) => slotsOf(r[c.slots]).map((slot) => [slot, r]));
    return { type: "bar", orientation: "h", name: s, marker: { color: colors[s] || "#888" }, y: bars.map(([slot]) => slot),
      base: bars.map(([, r]) => new Date(r[c.started] * 1000)), x: bars.map(([, r]) => ((r[c.finished] || now) - r[c.started]) * 1000),
      text: bars.map(([, r]) => r[0]), hovertemplate: "%{text}<extra>" + s + "</extra>" };
  }),
  layout("slot timeline", { barmode: "overlay", xaxis: { type: "date" }, yaxis: { type: "category", categoryorder: "category descending" } }), opts);
  // Parallel coordinates over the swept keys, coloured by the metric.
  const keys = S.columns.filter((k) => k.startsWith("param:"));
  const sample = ok.slice(-5000);
  const short = (k) => { const last = k.split(".").pop(); return last.length > 16 ? last.slice(0, 15) + "…" : last; };
  const dims = keys.map((k) => {
    const vals = sample.map((r) => r[c[k]]);
    if (vals.every((v) => typeof v === "number")) return { label: short(k.slice(6)), values: vals };
    const cats = [...new Set(vals.map((v) => JSON.stringify(v)))].sort();
    return { label: short(k.slice(6)), values: vals.map((v) => cats.indexOf(JSON.stringify(v))), tickvals: cats.map((_, i) => i), ticktext: cats };
  });
  dims.push({ label: m, values: sample.map((r) => r[c.metric]) });
  Plotly.react(S.plots.parallel, sample.length ? [{ type: "parcoords", dimensions: dims, line: { color: sample.map((r) => r[c.metric]), colorscale: "Viridis", showscale: true } }] : [],
    layout("parallel coordinates", { margin: { l: 60, r: 60, t: 90, b: 30 } }), opts);
}

// --- two sweeps compared ---------------------------------------------------------------------------------------
async function buildCompare(S) {
  const pick = el("select", { id: "compare-with" }, el("option", { value: "" }, "compare with…"));
  const out = el("div");
  S.body.replaceChildren(el("div", { class: "row filters" }, pick), out);
  const sweeps = (await (await api("/api/sweeps")).json()).sweeps.filter((s) => s.id !== S.id && !s.error);
  pick.append(...sweeps.map((s) => el("option", { value: s.id }, s.name + " (" + s.directory + ")")));
  pick.onchange = async () => {
    if (!pick.value) return out.replaceChildren();
    const d = await (await api("/api/compare?a=" + S.id + "&b=" + pick.value)).json();
    const other = sweeps.find((s) => s.id === pick.value);
    out.replaceChildren(...[
      el("p", {}, "B / A of " + d.metric + ": geometric mean " + (d.geomean_ratio ? d.geomean_ratio.toFixed(3) : "?") + " (" + (d.verdict || "nothing to compare") + ")",
        el("br"), el("span", { class: "muted" }, "A: " + (S.summary ? S.summary.directory : d.a) + " · B: " + (other ? other.directory : d.b))),
      el("div", { class: "tablewrap" }, el("table", { id: "comparison" }, el("thead", {}, el("tr", {}, ["experiment", "A", "A " + d.metric, "B", "B " + d.metric, "B / A", ""].map((h) => el("th", {}, h)))),
        el("tbody", {}, d.rows.map((r) => el("tr", {}, el("td", { class: "name" }, r.name), el("td", {}, stateBadge(r.a_state)), el("td", { class: "num" }, number(r.a_metric)),
          el("td", {}, stateBadge(r.b_state)), el("td", { class: "num" }, number(r.b_metric)), el("td", { class: "num" }, r.ratio ? r.ratio.toFixed(3) : ""), el("td", {}, r.verdict)))))),
      d.only_a.length || d.only_b.length ? el("p", { class: "muted" }, "only in A: " + (d.only_a.join(", ") || "none") + " · only in B: " + (d.only_b.join(", ") || "none")) : null,
    ].filter(Boolean));
  };
}

// --- one run: its attempts, config, and logs followed as they grow ----------------------------------------------
function showRun(main, id, name) {
  const R = view = { kind: "run", id, name, offsets: { stdout: -1, stderr: -1 }, running: true };
  crumbs(el("a", { href: "#/" }, "sweeps"), el("a", { href: "#/s/" + id }, "sweep"), name);
  R.info = el("div", { class: "card" }, el("h1", {}, name));
  R.logs = {};
  const panes = ["stdout", "stderr"].map((k) => {
    R.logs[k] = el("pre", { class: "log", id: "log-" + k });
    return el("div", { class: "card" }, el("h2", {}, k + ".log"), R.logs[k]);
  });
  main.append(el("div", { class: "grid" }, R.info), ...panes);
  const tick = async () => {
    if (view !== R) return;
    try {
      const d = await (await api("/api/sweeps/" + id + "/experiments/" + encodeURIComponent(name))).json();
      drawRun(R, d);
      for (const k of ["stdout", "stderr"]) await follow(R, k, d.logs[k]);
      live(true, R.running ? "following" : "ended");
    } catch (e) { live(false, e.message); if (e.status === 404 || e.status === 403) { R.info.append(el("p", { class: "notice" }, e.message)); return; } }
    if (view === R) schedule(tick, LOG_MS);
  };
  tick();
}

function drawRun(R, d) {
  crumbs(el("a", { href: "#/" }, "sweeps"), el("a", { href: "#/s/" + R.id }, d.sweep), R.name);
  const last = d.attempts[d.attempts.length - 1];
  R.running = last && ["running", "queued"].includes(last.state);
  R.info.replaceChildren(el("div", { class: "row spread" }, el("h1", {}, R.name),
    config.allow_cancel && R.running ? el("button", { class: "danger", id: "cancel-run", onclick: () => cancelRuns(R.id, [R.name]) }, "Cancel") : null),
  el("div", { class: "tablewrap" }, el("table", { id: "attempts" }, el("thead", {}, el("tr", {}, ["attempt", "state", "slots", "started", "took", "exit", "metric", "reason"].map((h) => el("th", {}, h)))),
    el("tbody", {}, d.attempts.map((a) => el("tr", {}, el("td", {}, a.attempt), el("td", {}, stateBadge(a.state)),
      el("td", {}, Object.entries(a.slots).map(([h, ids]) => h + ":" + ids.join(",")).join("@")), el("td", {}, when(a.started_at)),
      el("td", { class: "num" }, a.started_at ? seconds((a.finished_at || Date.now() / 1000) - a.started_at) : ""),
      el("td", {}, a.exit_code ?? ""), el("td", { class: "num" }, number(a.metric)), el("td", { class: "why" }, [a.reason, a.detail].filter(Boolean).join(": "))))))),
  el("h2", { style: "margin-top:.8rem" }, "ds_config"), el("pre", {}, JSON.stringify(d.spec.ds_config, null, 2)));
}

async function follow(R, kind, path) {
  const pre = R.logs[kind];
  try {
    const response = await api("/api/sweeps/" + R.id + "/file?path=" + encodeURIComponent(path) + "&offset=" + R.offsets[kind]);
    const text = await response.text();
    const start = Number(response.headers.get("X-Offset")), next = Number(response.headers.get("X-Next"));
    if (R.offsets[kind] === -1 && start > 0) pre.textContent = "… (the start of the log is left out)\n";
    if (text) {
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.append(text);
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    }
    R.offsets[kind] = next;
  } catch (e) {
    if (e.status === 404) pre.textContent = "no " + kind + ".log yet";
    else throw e;
  }
}

// --- start ---------------------------------------------------------------------------------------------------
window.addEventListener("hashchange", route);
// The plots take their colours from the page's: drawn again when the system switches light and dark.
window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
  if (view && view.kind === "sweep" && view.tab === "plots") { view.plotted = 0; drawPlots(view); }
});
window.addEventListener("DOMContentLoaded", async () => {
  await signIn();
  if (token) {
    try { config = await (await api("/api/config")).json(); } catch (e) { live(false, e.message); }
  }
  route();
});
