// autotune dashboard: the page. It asks the server only for what changed since the last transition it saw (and the
// running rows whose steps so far changed: GET /api/sweeps/ID?since=N&p=M), keeps every row in memory, and draws the
// table, the plots and the logs from them.
"use strict";

const POLL_MS = 500;          // what the runner records shows within a second
const PAGE_ROWS = 100;        // table rows drawn at once (sorting and filtering work on all of them)
const LOG_MS = 1000;
const RETRY_MS = 5000;        // a server that does not answer is asked again at most this far apart
const ANSWER_MS = 15000;      // a request unanswered this long counts as the server lost
const SHOWN_CHARS = 200;      // of a value in the table (its cell's tooltip holds more, the run's page all)

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

// Text that may break only after its separators (_ . - / @ , :), never inside a word: a long name wraps there.
const AFTER_SEPARATORS = /(?<=[_.\-/@,:])/, AFTER_HOSTS = /(?<=[@,])/;
function breakable(text, at = AFTER_SEPARATORS) {
  const parts = String(text).split(at);
  return parts.flatMap((p, i) => (i ? [el("wbr"), p] : [p]));
}

// A value as the table shows it: cut to SHOWN_CHARS (the cell's title holds more of it).
function shortText(v) {
  const text = typeof v === "object" && v !== null ? JSON.stringify(v) : number(v);
  return text.length > SHOWN_CHARS ? text.slice(0, SHOWN_CHARS - 1) + "…" : text;
}

const collator = new Intl.Collator(undefined, { numeric: true });

// --- the server reached or lost ------------------------------------------------------------------------------
// When the server stops answering, the page says so in a banner, greys what it shows (as of the last answer), and
// keeps asking, further apart; the first answer takes the banner away and the page goes on from where it was.
const connection = { asOf: null, failures: 0 };

function reached() {
  connection.asOf = new Date();
  connection.failures = 0;
  document.body.classList.remove("stale");
  const banner = document.getElementById("offline");
  if (banner) banner.remove();
}

function retryMs() { return Math.min(POLL_MS * 2 ** connection.failures, RETRY_MS); }

function banner(text) {
  let box = document.getElementById("offline");
  if (!box) {
    box = el("div", { id: "offline", class: "offline", role: "alert" });
    document.querySelector(".top").after(box);
  }
  box.textContent = text;
  document.body.classList.add("stale");
}

// A failed request: true when no answer came (the caller retries after retryMs()); an HTTP error is the caller's.
function lost(e) {
  const asOf = connection.asOf ? "as of " + connection.asOf.toLocaleTimeString() : "from before";
  if (e.status === 403) {
    banner("The dashboard refuses this page: " + e.message + ". What is shown is " + asOf +
      " (a dashboard started again prints a new URL).");
    live(false, "refused");
    return false;
  }
  if (e.status) return false;
  connection.failures++;
  banner("Disconnected: the dashboard server does not answer (" + e.message + "). What is shown is " + asOf +
    "; asking again every " + Math.round(retryMs() / 1000) + " s.");
  live(false, "disconnected");
  return true;
}

function ask(path) { return api(path, { signal: AbortSignal.timeout(ANSWER_MS) }); }

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

// The formats made once: toLocaleString with options makes a new one each call (about 0.1 ms: a plot's thousand
// hover texts took 100 ms).
const WHOLE = new Intl.NumberFormat("en-US"), TENTHS = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
function number(v) {
  if (v === null || v === undefined) return "";
  if (typeof v !== "number") return String(v);
  const a = Math.abs(v);
  // From 1e21 on with an exponent, as the report writes it: grouped digits past a float's ~17 would be noise, and a
  // script's step may carry any finite value (1e308: 309 digits).
  if (a >= 1e21) return String(Number(v.toPrecision(4)));
  if (Number.isInteger(v)) return WHOLE.format(v);
  return a >= 1000 ? TENTHS.format(v) : a >= 1 ? v.toFixed(3) : v.toPrecision(4);
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
    el("thead", {}, el("tr", {}, SWEEP_COLUMNS.map(([h, title]) => el("th", { title }, h)))), body)));
  const tick = async () => {
    if (view.kind !== "sweeps") return;
    try {
      const data = await (await ask("/api/sweeps")).json();
      reached();
      body.replaceChildren(...data.sweeps.map(sweepLine));
      if (!data.sweeps.length) body.append(el("tr", {}, el("td", { colspan: SWEEP_COLUMNS.length, class: "muted" }, "No sweep yet: they appear here as they start.")));
      live(true, "live");
    } catch (e) {
      if (lost(e)) { schedule(tick, retryMs()); return; }
      if (e.status === 403) return;
      live(false, e.message);
    }
    if (view.kind === "sweeps") schedule(tick, 2000);
  };
  tick();
}

const SWEEP_COLUMNS = [["sweep", ""], ["directory", ""], ["state", ""],
  ["ended", "experiments that ended (succeeded, failed, timed out, stopped, cancelled or interrupted) of all"],
  ["succeeded", ""], ["failed", "failed or timed out"],
  ["cut short", "stopped (could not win), cancelled or interrupted"], ["running", ""],
  ["queued", ""], ["best", "the best run so far and its value of the sweep's metric"], ["ETA", ""]];

function sweepLine(s) {
  if (s.error) return el("tr", {}, el("td", {}, s.name), el("td", { colspan: SWEEP_COLUMNS.length - 1, class: "why" }, s.error));
  const c = s.counts, best = s.best[0];
  const eta = s.eta.end ? seconds(s.eta.end - Date.now() / 1000) : (s.eta.why === "finished" ? "done" : "?");
  const count = (...states) => states.reduce((n, k) => n + (c[k] || 0), 0);
  const ended = s.total - count("queued", "running");
  return el("tr", {},
    el("td", { class: "name" }, el("a", { href: "#/s/" + s.id }, breakable(s.name))), el("td", { class: "path" }, breakable(s.directory)),
    el("td", {}, s.runner ? stateBadge("running") : el("span", { class: "muted" }, (c.queued || c.running) ? "stopped (no runner)" : "finished")),
    el("td", { class: "num" }, number(ended) + " of " + number(s.total)),
    el("td", { class: "num" }, number(count("succeeded"))), el("td", { class: "num" }, number(count("failed", "timed_out"))),
    el("td", { class: "num" }, number(count("stopped", "cancelled", "interrupted"))),
    el("td", { class: "num" }, number(count("running"))), el("td", { class: "num" }, number(count("queued"))),
    el("td", { class: "name" }, best ? [breakable(best.name), el("span", { class: "muted" }, " · " + s.metric.name + " " + number(best.value))] : ""),
    el("td", {}, eta));
}

// --- one sweep -------------------------------------------------------------------------------------------------
function showSweep(main, id, tab) {
  const S = view = { kind: "sweep", id, tab, seq: -1, sv: null, p: "", columns: [], rows: new Map(), summary: null,
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
      const url = "/api/sweeps/" + id + "?since=" + S.seq + (S.sv ? "&sv=" + encodeURIComponent(S.sv) : "") +
        (S.p ? "&p=" + encodeURIComponent(S.p) : "");
      const data = await (await ask(url)).json();
      reached();
      apply(S, data);
      live(true, "live · transition " + S.seq);
    } catch (e) {
      if (lost(e)) { schedule(tick, retryMs()); return; }
      if (e.status === 403) return;
      live(false, e.message);
      if (e.status === 404) { S.body.replaceChildren(el("p", { class: "notice" }, e.message)); return; }
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
  S.p = data.p;  // the running rows' readings seen: only those that change after it are sent
  if (data.summary) { S.summary = data.summary; S.sv = data.sv; drawTop(S); }
  else if (S.summary) drawEta(S);
  if (S.table) tickDurations(S.table);
  if (!S.dirty) return;
  rank(S);
  S.dirty = false;
  if (S.tab === "experiments") drawTable(S);
  else if (S.tab === "plots" && window.plotsChanged) plotsChanged(S);  // drawn when due (plots.js)
}

function rank(S) {
  // 1 is the best, as the report ranks: by the metric, per GPU type where the sweep ran on several.
  const m = S.col.metric, t = S.col.gpu_type, sign = S.summary && S.summary.metric.direction.startsWith("lower") ? 1 : -1;
  const ok = [...S.rows.values()].filter((r) => r[S.col.state] === "succeeded" && r[m] !== null);
  const type = (r) => (r[t] === null || r[t] === undefined ? "" : String(r[t]));
  ok.sort((a, b) => (type(a) < type(b) ? -1 : type(a) > type(b) ? 1 : 0) || sign * (a[m] - b[m]) || a[S.col.position] - b[S.col.position]);
  S.ranks = new Map();
  let kind, n = 0;
  for (const r of ok) { if (r[t] !== kind) { kind = r[t]; n = 0; } S.ranks.set(r[0], ++n); }
}

function drawTop(S) {
  const s = S.summary;
  crumbs(el("a", { href: "#/" }, "sweeps"), s.name);
  const counts = el("div", { class: "counts" }, ["succeeded", "failed", "timed_out", "stopped", "running", "queued", "cancelled", "interrupted"]
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
    el("div", { class: "spaced" }, counts), S.etaLine,
    s.gpu_hours ? el("div", { class: "muted", id: "gpu-hours" }, s.gpu_hours.line) : null);
  const bests = el("div", { class: "card", id: "best" }, el("h2", {}, "Best so far"),
    s.best.length ? s.best.map((b) => el("div", {},
      el("div", {}, b.gpu_type ? el("b", {}, b.gpu_type + ": ") : null,
        el("a", { href: "#/s/" + S.id + "/run/" + encodeURIComponent(b.name) }, breakable(b.name)), " · " + s.metric.name + " " + number(b.value),
        b.interval ? el("span", { class: "muted interval" }, b.interval) : null),
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
    el("div", { class: "muted legend" }, "■ busy  □ free  ▨ lost"));
  S.top.replaceChildren(el("div", { class: "grid" }, head, bests, nodes), s.training ? trainingCard(s.training) : "");
  drawEta(S);
}

// A tune that stated its training run: each config's time, GPU-hours and cost, the front, the deadline, the fastest
// and the cheapest named, as the report's training section shows them (the server's rows, every value as text).
function trainingCard(t) {
  const card = el("div", { class: "card", id: "training" }, el("h2", {}, "Training run ", t.title ? el("span", { class: "muted" }, "(" + t.title + ")") : null));
  if (t.error) { card.append(el("p", { class: "muted" }, t.error)); return card; }
  const named = { [t.fastest]: "fastest" };
  if (t.cheapest) named[t.cheapest] = named[t.cheapest] ? "fastest, cheapest" : "cheapest";
  card.append(...t.verdict.map((line) => el("div", { class: "verdict" }, line)),
    el("div", { class: "scroll" }, el("table", { class: "training" },
      el("thead", {}, el("tr", {}, t.headers.map((h) => el("th", {}, h)), el("th", {}, ""))),
      el("tbody", {}, t.cells.map((row, i) => el("tr", { "data-name": t.candidates[i].name, class: t.candidates[i].front ? "front" : "" },
        row.map((v) => el("td", {}, v)), el("td", { class: "muted" }, named[t.candidates[i].name] || "")))))),
    el("ul", { class: "muted" }, t.notes.map((line) => el("li", {}, line))));
  return card;
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
    ["", "succeeded", "failed", "timed_out", "stopped", "running", "queued", "cancelled", "interrupted"].map((v) => el("option", { value: v }, v || "every state")));
  S.count = el("span", { class: "muted" });
  S.table = el("table", { id: "experiments" });
  S.pager = el("div", { class: "row pager" });
  S.body.replaceChildren(el("div", { class: "row filters" }, S.filterBox, S.stateBox, S.count),
    el("div", { class: "tablewrap" }, S.table), S.pager);
}

// The sweep's metric's column shows each run's 95% interval under its value (a running one's mean so far), and the
// steps column (once a run's steps were read) how many steps measured it: the report's columns that hold them apart
// are not repeated.
function primary(S) { return S.summary ? "metric:" + S.summary.metric.name : null; }

function tableColumns(S) {
  const c = S.columns, own = primary(S);
  const shown = new Set([own + "_low", own + "_high", "metric:steps_measured"]);
  const params = c.filter((x) => x.startsWith("param:"));
  const metrics = c.filter((x) => x.startsWith("metric:") && !shown.has(x));
  const typed = S.summary && S.summary.types.length > 1;
  const stepping = [...S.rows.values()].some((r) => r[S.col.steps] !== null);  // once a run's steps were read
  return ["rank", "name", "state", ...(typed ? ["gpu_type"] : []), ...params, ...metrics, ...(stepping ? ["steps"] : []),
    "duration", "gpu_hours", "slots", ...(config.allow_cancel ? ["action"] : [])];
}

// A value of the sweep's metric with how sure it is: "2,180" over "95% 2,150 – 2,210"; a running run's mean so far.
function measuredCell(S, r) {
  const c = S.col, running = r[c.state] === "running", value = running ? r[c.so_far] : r[c[primary(S)]];
  const low = r[c.low], high = r[c.high];
  const interval = low === null || low === undefined ? null
    : "95% " + number(low) + " – " + (high === null || high === undefined ? "no upper bound" : number(high));
  const title = [running && value !== null && value !== undefined ? "mean so far" : null, interval && interval.replace("95%", "95% interval"),
    r[c.steps] ? "over " + number(r[c.steps]) + " steps" : null].filter(Boolean).join(", ");
  return el("td", { class: "num measured" + (running ? " so-far" : ""), title: title || null },
    value === null || value === undefined ? "" : number(value), running && value !== null && value !== undefined ? el("span", { class: "muted" }, " so far") : null,
    interval ? el("div", { class: "interval" }, interval) : null);
}

function cell(S, r, key) {
  const c = S.col;
  if (key === "rank") return S.ranks.get(r[0]) ?? null;
  if (key === "duration") return r[c.started] && r[c.finished] ? r[c.finished] - r[c.started] : r[c.started] ? Date.now() / 1000 - r[c.started] : null;
  if (key === "why") return [r[c.reason], r[c.detail]].filter(Boolean).join(": ");
  return r[c[key]];
}

// What a row sorts by in a column: its cell's value, but in the sweep's metric's column a running row's mean so far
// (the value its cell shows, marked "so far"), so that it sorts among the ended rows' values and moves as its
// steps are read, rather than with the rows that have no value. (A key function: keys worked out beforehand, in
// arrays or a Map, made a sort of 10,000 rows half as slow again.)
function sortKey(S, col) {
  const c = S.col, own = c[col], state = c.state, soFar = c.so_far;
  return col === primary(S) ? (r) => (r[state] === "running" ? r[soFar] : r[own]) : (r) => cell(S, r, col);
}

function visible(S) {
  const rows = [...S.rows.values()].filter((r) => (!S.state || r[S.col.state] === S.state) &&
    (!S.filter || r.some((v) => v !== null && String(v).toLowerCase().includes(S.filter))));
  const { col, dir } = S.sort, key = sortKey(S, col), at = S.col.position;
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    if (x === y) return a[at] - b[at];
    if (x === null || x === undefined || x === "") return 1;
    if (y === null || y === undefined || y === "") return -1;
    return (typeof x === "number" && typeof y === "number" ? x - y : collator.compare(String(x), String(y))) * dir;
  });
  return rows;
}

// A column's first sort puts the best first: the sweep's metric as it is declared (`loss:min` lower first), any
// other metric by its name (a latency lower first, the rest higher), every other column ascending.
function firstDirection(S, k) {
  if (k === primary(S)) return S.summary.metric.direction.startsWith("lower") ? 1 : -1;
  return k.startsWith("metric:") && !k.endsWith("latency") ? -1 : 1;
}

function drawTable(S) {
  if (!S.table || !S.col) return;
  const keys = tableColumns(S);
  const rows = visible(S);
  const pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
  S.page = Math.min(S.page, pages - 1);
  const label = (k) => k === "gpu_hours" ? "GPU-hours" : k.replace(/^(param|metric):/, "");
  const head = el("tr", {}, keys.map((k) => el("th", { "data-col": k, class: S.sort.col === k ? (S.sort.dir > 0 ? "sorted-asc" : "sorted-desc") : "",
    title: label(k), onclick: () => { S.sort = { col: k, dir: S.sort.col === k ? -S.sort.dir : firstDirection(S, k) }; drawTable(S); } },
    breakable(label(k)))));
  const best = new Set((S.summary ? S.summary.best : []).map((b) => b.name));
  const body = rows.slice(S.page * PAGE_ROWS, (S.page + 1) * PAGE_ROWS).map((r) => el("tr", { "data-name": r[0], class: best.has(r[0]) ? "best" : "" },
    keys.map((k) => {
      const v = cell(S, r, k);
      if (k === "name") return el("td", { class: "name" }, el("a", { href: "#/s/" + S.id + "/run/" + encodeURIComponent(r[0]) }, breakable(r[0])));
      if (k === "state") {  // the reason a run failed or stopped under its state: never a column off-screen
        const why = cell(S, r, "why");
        return el("td", {}, stateBadge(v), why ? el("div", { class: "why", title: why.slice(0, 2000) }, why.length > 600 ? why.slice(0, 599) + "…" : why) : null);
      }
      if (k === "slots") return el("td", { class: "slots" }, breakable(v || "", AFTER_HOSTS));
      if (k === primary(S)) return measuredCell(S, r);
      if (k === "duration") return el("td", { class: "num", "data-started": r[S.col.started] && !r[S.col.finished] ? r[S.col.started] : null },
        v === null ? "" : seconds(v));
      if (k === "action") return el("td", {}, ["running", "queued"].includes(r[S.col.state])
        ? el("button", { class: "small danger", onclick: () => cancelRuns(S.id, [r[0]]) }, "cancel") : null);
      if (typeof v === "number") return el("td", { class: "num" }, number(v));
      const text = typeof v === "object" && v !== null ? JSON.stringify(v) : number(v);  // a value cut to its cell's width
      return el("td", { class: "val", title: text.length > 20 ? text.slice(0, 2000) : null }, shortText(v));
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
// The plots (plots.js, drawn by chart.js) are loaded when the tab is first opened: no other page loads them.
let plotting = null;
function loadPlots() {
  plotting = plotting || Promise.all(["/static/chart.js", "/static/plots.js"].map((src) => new Promise((resolve, reject) => {
    const script = el("script", { src });
    script.async = false;  // run in this order
    script.addEventListener("load", resolve);
    script.addEventListener("error", () => { plotting = null; reject(new Error("could not load " + src)); });
    document.head.append(script);
  })));
  return plotting;
}

function buildPlots(S) {
  const keys = ["metric", "best", "timeline", "parallel"];
  S.plots = {}; S.plotTitles = {}; S.plotCaptions = {};
  const cards = keys.map((k) => el("div", { class: "card" },
    S.plotTitles[k] = el("h2", { id: "title-" + k }), S.plotCaptions[k] = el("p", { class: "caption muted", id: "caption-" + k }),
    S.plots[k] = el("div", { class: "plot", id: "plot-" + k })));
  S.body.replaceChildren(el("div", { class: "plots" }, cards));
  loadPlots().then(() => { if (view === S) plotsChanged(S); }, (e) => toast(e.message));
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
        el("br"), el("span", { class: "muted" }, "A: " + (S.summary ? S.summary.directory : d.a) + " · B: " + (other ? other.directory : d.b)),
        el("br"), el("span", { class: "muted", id: "compare-gpu-hours" }, "A: " + d.gpu_hours.a + " · B: " + d.gpu_hours.b)),
      el("div", { class: "tablewrap" }, el("table", { id: "comparison" }, el("thead", {}, el("tr", {}, ["experiment", "A", "A " + d.metric, "B", "B " + d.metric, "B / A", ""].map((h) => el("th", {}, h)))),
        el("tbody", {}, d.rows.map((r) => el("tr", {}, el("td", { class: "name" }, r.name), el("td", {}, stateBadge(r.a_state)), el("td", { class: "num" }, number(r.a_metric)),
          el("td", {}, stateBadge(r.b_state)), el("td", { class: "num" }, number(r.b_metric)), el("td", { class: "num" }, r.ratio ? r.ratio.toFixed(3) : ""), el("td", {}, r.verdict)))))),
      d.only_a.length || d.only_b.length ? el("p", { class: "muted" }, "only in A: " + (d.only_a.join(", ") || "none") + " · only in B: " + (d.only_b.join(", ") || "none")) : null,
    ].filter(Boolean));
  };
}

// --- one run: its attempts, config, and logs followed as they grow ----------------------------------------------
function showRun(main, id, name) {
  const R = view = { kind: "run", id, name, offsets: { stdout: -1, stderr: -1 }, running: true, started: false };
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
      const d = await (await ask("/api/sweeps/" + id + "/experiments/" + encodeURIComponent(name))).json();
      drawRun(R, d);
      for (const k of ["stdout", "stderr"]) await follow(R, k, d.logs[k]);
      reached();
      live(true, R.running ? "following" : "ended");
    } catch (e) {
      if (lost(e)) { schedule(tick, retryMs()); return; }
      if (e.status === 403) return;
      live(false, e.message);
      if (e.status === 404) { R.info.append(el("p", { class: "notice" }, e.message)); return; }
    }
    if (view === R) schedule(tick, LOG_MS);
  };
  tick();
}

function drawRun(R, d) {
  crumbs(el("a", { href: "#/" }, "sweeps"), el("a", { href: "#/s/" + R.id }, d.sweep), R.name);
  const last = d.attempts[d.attempts.length - 1];
  R.running = !last || ["running", "queued"].includes(last.state);
  R.started = d.attempts.some((a) => a.started_at);
  // Every metric the runs measured, a column each: the sweep's own first (the one whose value the run's metric is).
  const own = d.attempts.map((a) => Object.keys(a.metrics || {}).find((k) => a.metrics[k] === a.metric)).find(Boolean);
  const names = [...new Set(d.attempts.flatMap((a) => Object.keys(a.metrics || {})))]
    .sort((a, b) => (b === own) - (a === own) || collator.compare(a, b));
  if (!names.length && d.attempts.some((a) => a.metric !== null)) names.push("metric");
  const valueOf = (a, n) => (a.metrics && n in a.metrics ? a.metrics[n] : n === "metric" ? a.metric : null);
  R.info.replaceChildren(el("div", { class: "row spread" }, el("h1", {}, R.name),
    config.allow_cancel && R.running ? el("button", { class: "danger", id: "cancel-run", onclick: () => cancelRuns(R.id, [R.name]) }, "Cancel") : null),
  el("div", { class: "tablewrap" }, el("table", { id: "attempts" }, el("thead", {}, el("tr", {},
    [...["attempt", "state", "slots", "started", "took", "exit"].map((h) => el("th", {}, h)),
      ...names.map((n) => el("th", { class: "metric", title: n }, breakable(n.length > 60 ? n.slice(0, 59) + "…" : n))), el("th", {}, "reason")])),
    el("tbody", {}, d.attempts.map((a) => el("tr", {}, el("td", {}, a.attempt), el("td", {}, stateBadge(a.state)),
      el("td", { class: "slots" }, breakable(Object.entries(a.slots).map(([h, ids]) => h + ":" + ids.join(",")).join("@"), AFTER_HOSTS)), el("td", {}, when(a.started_at)),
      el("td", { class: "num" }, a.started_at ? seconds((a.finished_at || Date.now() / 1000) - a.started_at) : ""),
      el("td", {}, a.exit_code ?? ""), ...names.map((n) => el("td", { class: "num" }, number(valueOf(a, n)))),
      el("td", { class: "why" }, [a.reason, a.detail].filter(Boolean).join(": "))))))),
  last ? progressCard(last, d.metric, d.runner) : null,
  el("h2", { class: "spaced" }, "ds_config"), el("pre", {}, JSON.stringify(d.spec.ds_config, null, 2)));
  // What an empty log means: nothing yet, or nothing at all.
  for (const pre of Object.values(R.logs)) pre.dataset.empty = R.running ? (R.started ? "(empty so far)" : "(not started yet)") : "(empty)";
}

// A time in seconds as the run's figures give it: to the millisecond under a minute (a start-up of 0.4 s is not "0s").
function span(s) { return s === null || s === undefined ? "?" : s < 60 ? number(s) + " s" : seconds(s); }

// The latest attempt's steps: while it runs, as the runner last read them (every few seconds; replaced at each
// poll), how many so far, the metric's mean so far with its 95% interval, start-up (launch to the end of its first
// step) and step time; once it ended, its final figures: its value and interval as recorded with its metrics.
function progressCard(a, metric, runner) {
  const m = a.measured, running = a.state === "running", metrics = a.metrics || {};
  if (!a.started_at) return null;
  const box = el("div", { id: "progress", class: "progress" + (running ? " so-far" : "") },
    el("h2", { class: "spaced" }, running ? "Progress so far" : "Steps measured"));
  if (!m) {
    box.append(el("p", { class: "muted" }, !running ? "no steps were read from this run"
      : !runner ? "no steps read: no runner follows this sweep now (autotune resume follows its runs again)"
      : "no steps read yet: the runner reads them every few seconds, once the run "
      + "writes its progress file or DeepSpeed prints its throughput lines"));
    return box;
  }
  // An ended run that recorded no value (it failed, or was cut short): its steps' mean when it ended, said so.
  const recorded = !running && metrics[metric + "_low"] !== undefined, unvalued = !running && a.metric === null;
  const value = running || unvalued ? m.mean : a.metric, low = recorded ? metrics[metric + "_low"] : m.low;
  const high = recorded ? metrics[metric + "_high"] ?? null : m.high;
  const items = [
    ["steps", number(m.steps) + (running ? " so far" : "")],
    [metric, value === null || value === undefined ? (running ? "not yet: no step measured it" : "none")
      : number(value) + (running ? " so far (mean)" : unvalued ? " (its steps' mean; the run recorded no value)" : "")],
    ["95% interval", low === null || low === undefined ? (running ? "not yet: too few steps" : "none")
      : number(low) + " – " + (high === null ? "no upper bound" : number(high))],
    ["start-up", span(m.startup)], ["step time", span(m.step_seconds)]];
  box.append(el("dl", { class: "figures" }, items.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-key": k }, v)])));
  return box;
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
    if (e.status === 404) pre.textContent = R.running ? "no " + kind + ".log yet" : "no " + kind + ".log: the run left none";
    else throw e;
  }
}

// --- start ---------------------------------------------------------------------------------------------------
window.addEventListener("hashchange", route);
// The plots are laid out for the page's size and drawn in its colours: drawn again when either changes.
function redrawPlots() {
  if (view && view.kind === "sweep" && view.tab === "plots" && window.plotsChanged) { view.plotted = 0; plotsChanged(view); }
}
window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", redrawPlots);
window.addEventListener("resize", redrawPlots);
window.addEventListener("DOMContentLoaded", async () => {
  await signIn();
  if (token) {
    try { config = await (await api("/api/config")).json(); } catch (e) { live(false, e.message); }
  }
  route();
});
