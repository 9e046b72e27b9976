"use strict";
// The usage page's script, inlined into the document by services/admin_api/page.py. Everything from the
// API is inserted with textContent, never as HTML.

const POLL_MS = 5000; // without the live stream
const FULL_MS = 60000; // with it: everything again once a minute
const SOON_MS = 500; // events coalesce: a panel is fetched at most this often, or 4 times as long as
// its last fetch took (the API may share its process with the allocator)
const HISTORY_MS = 60000; // usage samples are a minute apart
const WINDOWS = ["hour", "day", "week"];
const WINDOW_SECONDS = { hour: 3600, day: 86400, week: 604800 };
const SEVERITY = { critical: 3, warning: 2, info: 1 };
const WAIT_KINDS = {
  quota: "quota",
  devices: "devices busy",
  unsatisfiable: "no such devices",
  budget: "placement budget",
  undecided: "not decided yet",
  unexplained: "not explained",
};
const STATE_ORDER = ["allocated", "idle", "throttled", "unhealthy", "stale"];
const ALERT_LIST_LIMIT = 100; // an opened alert kind lists its newest this many
const UNFLAVORED = "unflavored devices"; // usage of devices no flavor's selector accepts

let token = null;
let timer = null;
let live = false;
let stream = null;
let lastFull = 0;
let lastHistory = 0;
let scopeTenant = null; // a tenant-scoped token's tenant, once the API has said so
const data = { usage: null, waiting: null, estimates: null, counts: null, resolved: null, nodes: undefined };
let waitingAt = 0; // performance.now() when /v1/waiting answered: the oldest wait ticks from there
const alertLists = new Map(); // an opened alert kind -> its open alerts, newest first
const openGroups = new Set(); // waiting groups whose claims are shown, "tenant\nreason"
const cellsByKey = new Map(); // "driver/pool/device" -> its cell on the node map
const devicesByKey = new Map(); // the same key -> the device as the page knows it (the map's model)
const claimKeys = new Map(); // "tenant/claim" -> device keys it holds, as far as the page knows
const soonPanels = new Set();
let soonTimer = null;
let summaryFrame = 0;
let lastLoadMs = 0;
window.renderTimes = {};

// --- words and numbers ---------------------------------------------------------------------------

const integers = new Intl.NumberFormat("en", { maximumFractionDigits: 0 });
const tenths = new Intl.NumberFormat("en", { maximumFractionDigits: 1 });
const hundredths = new Intl.NumberFormat("en", { maximumFractionDigits: 2 });

/** A number as people write it: integers as integers, others with at most `digits` decimals. */
function num(n, digits = 1) {
  const value = Number(n) || 0;
  if (Number.isInteger(value)) return integers.format(value);
  return (digits >= 2 ? hundredths : tenths).format(value);
}

/** "1 claim", "3 claims", "0.5 GPU units". */
function plural(n, one, many) {
  return `${num(n, 2)} ${Number(n) === 1 ? one : many || `${one}s`}`;
}

/** A wait as a number and its unit: [9, "min"]. */
function durationParts(seconds) {
  const s = Math.max(0, Number(seconds) || 0);
  if (s < 90) return [num(Math.round(s)), "s"];
  if (s < 5400) return [num(Math.round(s / 60)), "min"];
  if (s < 172800) return [num(s / 3600), "h"];
  const days = s / 86400;
  return [num(days), Math.round(days * 10) === 10 ? "day" : "days"];
}

function duration(seconds) {
  return durationParts(seconds).join(" ");
}

/** How far off a start is, as a waiting person reads it: "in 45m", "in 3h20m", "in 2d4h" (two units at most,
 * as `claimbroker status` says it), "now" within the minute or past it. */
function fromNow(stamp, now = Date.now()) {
  const minutes = Math.floor((new Date(stamp).getTime() - now) / 60000);
  if (!(minutes >= 1)) return "now";
  const parts = [[Math.floor(minutes / 1440), "d"], [Math.floor(minutes / 60) % 24, "h"], [minutes % 60, "m"]]
    .filter(([n]) => n).map(([n, u]) => `${n}${u}`);
  return `in ${parts.slice(0, 2).join("")}`;
}

/** When, as short as it reads unambiguously: the time today, else the day and time. */
function when(stamp) {
  const at = new Date(stamp);
  const clock = { hour: "2-digit", minute: "2-digit", second: "2-digit" };
  if (at.toDateString() === new Date().toDateString()) return at.toLocaleTimeString([], clock);
  return at.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
}

function flavorName(flavor) {
  return flavor === null || flavor === undefined ? UNFLAVORED : flavor;
}

// --- the DOM ---------------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "style") node.style.cssText = v;
    else node.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function timed(name, render) {
  const started = performance.now();
  render();
  window.renderTimes[name] = Math.round((performance.now() - started) * 10) / 10;
}

async function get(path) {
  const response = await fetch(path, { headers: { Authorization: `Bearer ${token}` } });
  if (response.status === 401) throw Object.assign(new Error("the token was refused"), { auth: true });
  if (!response.ok) {
    let detail = response.statusText;
    try {
      detail = (await response.json()).detail;
    } catch {
      /* not JSON */
    }
    throw Object.assign(new Error(`${path}: ${detail}`), { status: response.status });
  }
  return response.json();
}

// --- the view: filters, sorting, opened alert kinds and the history's window, kept in the URL -----

const SORTS = {
  waiting: {
    tenant: (g) => g.tenant,
    claims: (g) => g.claims,
    devices: (g) => g.devices,
    oldest: (g) => g.oldestWaitSeconds,
    kind: (g) => WAIT_KINDS[g.kind] || g.kind,
    reason: (g) => g.reason,
  },
  alerts: {
    kind: (f) => f.kind,
    severity: (f) => SEVERITY[f.severity] || 0,
    open: (f) => f.open,
    last: (f) => f.lastSeen,
  },
};
const TEXT_SORTS = new Set(["tenant", "kind", "reason"]); // first click: A to Z; numbers: largest first
const DEFAULT_VIEW = {
  tenant: "",
  flavor: "",
  why: "",
  alert: "",
  "sort-waiting": "-oldest",
  "sort-alerts": "-severity",
  window: "hour",
  history: "",
  expand: "",
  group: "", // the node map's grouping: "" by generation, else a node label key (a gang topology key: a clique, a rack)
};
const view = { ...DEFAULT_VIEW };

function readView() {
  const params = new URL(window.location.href).searchParams;
  for (const key of Object.keys(DEFAULT_VIEW)) {
    const value = params.get(key);
    if (value !== null) view[key] = value;
  }
  if (!WINDOWS.includes(view.window)) view.window = "hour";
  for (const table of ["waiting", "alerts"]) {
    const key = view[`sort-${table}`].replace(/^-/, "");
    if (!(key in SORTS[table])) view[`sort-${table}`] = DEFAULT_VIEW[`sort-${table}`];
  }
}

/** The view into the address bar (never the token), so a wall screen is set up once and bookmarked. */
function writeView() {
  const url = new URL(window.location.href);
  const params = new URLSearchParams();
  for (const [key, value] of url.searchParams) {
    if (!(key in DEFAULT_VIEW) && key !== "token") params.append(key, value);
  }
  for (const [key, fallback] of Object.entries(DEFAULT_VIEW)) { // always in this order: an address reads alike
    if (view[key] && view[key] !== fallback) params.set(key, view[key]);
  }
  const query = params.toString();
  history.replaceState(null, "", url.pathname + (query ? `?${query}` : ""));
}

function expanded() {
  return new Set(view.expand ? view.expand.split(",") : []);
}

function sortRows(rows, table) {
  const spec = view[`sort-${table}`];
  const descending = spec.startsWith("-");
  const value = SORTS[table][spec.replace(/^-/, "")];
  const keyed = rows.map((row, i) => [value(row), i, row]);
  keyed.sort((a, b) => {
    const order = typeof a[0] === "number" ? a[0] - b[0] : String(a[0]).localeCompare(String(b[0]));
    return (descending ? -order : order) || a[1] - b[1]; // ties keep the API's order
  });
  return keyed.map((k) => k[2]);
}

/** Headers of a sortable table become buttons (keyboard: Tab, then Enter or Space); aria-sort says how. */
function sortable(table, render) {
  for (const th of document.querySelectorAll(`th[data-table="${table}"][data-sort]`)) {
    const button = el("button", { type: "button", class: "sort" }, th.textContent);
    th.replaceChildren(button);
    button.addEventListener("click", () => {
      const key = th.dataset.sort;
      const now = view[`sort-${table}`];
      let next = TEXT_SORTS.has(key) ? key : `-${key}`;
      if (now.replace(/^-/, "") === key) next = now.startsWith("-") ? key : `-${key}`;
      view[`sort-${table}`] = next;
      writeView();
      render();
    });
  }
}

function showSort(table) {
  const spec = view[`sort-${table}`];
  const key = spec.replace(/^-/, "");
  for (const th of document.querySelectorAll(`th[data-table="${table}"][data-sort]`)) {
    const on = th.dataset.sort === key;
    th.setAttribute("aria-sort", on ? (spec.startsWith("-") ? "descending" : "ascending") : "none");
  }
}

/** A select's options, replaced only when they changed (an open select keeps its place). */
function fillSelect(select, everything, values, label) {
  const wanted = ["", ...values];
  const have = [...select.options].map((o) => o.value);
  if (wanted.join("\n") !== have.join("\n")) {
    select.replaceChildren(el("option", { value: "" }, everything), ...values.map((v) => el("option", { value: v }, label ? label(v) : v)));
  }
}

function renderFilters() {
  const tenants = new Set();
  const flavors = new Set();
  const whys = new Set();
  const alertKinds = new Set();
  for (const r of data.usage?.items || []) {
    tenants.add(r.tenant);
    if (r.flavor !== null) flavors.add(r.flavor);
  }
  for (const g of data.waiting?.groups || []) {
    tenants.add(g.tenant);
    whys.add(g.kind);
    for (const f of g.flavors || []) flavors.add(f);
  }
  for (const c of data.counts || []) {
    if (c.tenant) tenants.add(c.tenant);
    if (c.flavor) flavors.add(c.flavor);
    alertKinds.add(c.kind);
  }
  // what the address asks for stays on offer while nothing has it (a wall screen keeps its filter)
  if (view.tenant) tenants.add(view.tenant);
  if (view.flavor) flavors.add(view.flavor);
  if (view.why) whys.add(view.why);
  if (view.alert) alertKinds.add(view.alert);
  const sort = (set) => [...set].sort();
  const pairs = [
    ["filter-tenant", "all tenants", sort(tenants), null, "tenant"],
    ["filter-flavor", "all flavors", sort(flavors), null, "flavor"],
    ["filter-why", "every reason", Object.keys(WAIT_KINDS).filter((k) => whys.has(k)), (k) => WAIT_KINDS[k], "why"],
    ["filter-alert", "every kind", sort(alertKinds), null, "alert"],
  ];
  for (const [id, everything, values, label, key] of pairs) {
    const select = document.getElementById(id);
    fillSelect(select, everything, values, label);
    select.value = view[key];
  }
  document.getElementById("filter-tenant").closest("label").hidden = Boolean(scopeTenant);
}

function filtersWired() {
  for (const [id, key] of [["filter-tenant", "tenant"], ["filter-flavor", "flavor"], ["filter-why", "why"], ["filter-alert", "alert"]]) {
    document.getElementById(id).addEventListener("change", (event) => {
      view[key] = event.target.value;
      writeView();
      rerender(); // the filters work on what the page holds: nothing is fetched again
    });
  }
  document.getElementById("filter-clear").addEventListener("click", () => {
    Object.assign(view, { tenant: "", flavor: "", why: "", alert: "" });
    writeView();
    rerender();
  });
  sortable("waiting", () => timed("waiting", renderWaiting));
  sortable("alerts", () => timed("alerts", renderAlerts));
}

function rerender() {
  renderFilters();
  if (data.waiting) timed("waiting", renderWaiting);
  if (data.counts) timed("alerts", renderAlerts);
}

// --- the summary strip ---------------------------------------------------------------------------
// Its numbers are the panels' own: GPUs from the node map's model (/v1/nodes, then the live statuses), the
// queue from /v1/waiting, the alerts from /v1/alerts/counts. It shows what the token may see, whatever the
// tables' filters.

/** Per generation: its nodes, GPUs and MIG slices, and each GPU's state (allocated when it or any of its
 * slices is); what the strip and the node map's headings say. */
function fleetSummary() {
  const generations = new Map();
  for (const d of devicesByKey.values()) {
    let g = generations.get(d.generation);
    if (!g) {
      g = { generation: d.generation, nodes: new Set(), slices: 0, gpus: new Map() };
      generations.set(d.generation, g);
    }
    g.nodes.add(d.node);
    if (d.kind === "mig") g.slices += 1;
    let gpu = g.gpus.get(d.gpu);
    if (!gpu) {
      gpu = { allocated: false, mine: false, own: null, worst: "idle" };
      g.gpus.set(d.gpu, gpu);
    }
    if (d.state === "allocated") {
      gpu.allocated = true;
      if (d.tenant) gpu.mine = true;
    }
    if (d.kind !== "mig") gpu.own = d.state;
    else if (STATE_ORDER.indexOf(d.state) > STATE_ORDER.indexOf(gpu.worst)) gpu.worst = d.state;
  }
  return [...generations.values()].map((g) => {
    const states = {};
    let mine = 0;
    for (const gpu of g.gpus.values()) {
      const state = gpu.allocated ? "allocated" : gpu.own || gpu.worst;
      states[state] = (states[state] || 0) + 1;
      if (gpu.mine) mine += 1;
    }
    return { generation: g.generation, nodes: g.nodes.size, slices: g.slices, gpus: g.gpus.size,
             used: states.allocated || 0, mine, states };
  });
}

function stateWords(states, skip) {
  return STATE_ORDER.filter((s) => s !== skip && states[s]).map((s) => `${num(states[s])} ${s}`).join(" · ");
}

/** A tile of the strip: a label, a large numeral with its unit (beside it, `inline`), a line below. */
function tile(kind, label, value, unit, sub, attrs, inline) {
  const unitNode = el("span", { class: "unit" }, unit);
  return el("div", { class: `tile ${kind}`, ...attrs },
    el("div", { class: "label", title: label }, label),
    el("div", { class: "value" }, el("span", { class: "num" }, value, inline ? " " : null, inline ? unitNode : null), inline ? null : unitNode),
    el("div", { class: "sub" }, sub));
}

function renderSummary() {
  const strip = document.getElementById("summary");
  const tiles = [];
  if (data.nodes === null) {
    tiles.push(tile("quiet", "GPUs", "–", "", "this API process has no view of the fleet", { "data-summary": "gpus" }));
  }
  for (const g of fleetSummary()) {
    const rest = g.used === g.gpus ? "all in use" : stateWords(g.states, "allocated");
    const sub = [scopeTenant ? `${num(g.mine)} yours` : "", rest].filter(Boolean).join(" · ");
    tiles.push(tile(g.used ? "" : "quiet", g.generation, `${num(g.used)} / ${num(g.gpus)}`,
      g.gpus === 1 ? "GPU in use" : "GPUs in use", sub,
      { "data-summary": "gpus", "data-generation": g.generation, "data-used": g.used, "data-total": g.gpus,
        "data-mine": g.mine }));
  }
  const waiting = data.waiting;
  if (waiting) {
    const claims = waiting.tenants.reduce((sum, t) => sum + t.waiting, 0);
    const devices = waiting.groups.reduce((sum, g) => sum + g.devices, 0);
    const late = waiting.tenants.reduce((sum, t) => sum + t.pastAlertAfter, 0);
    const sub = claims ? `${plural(devices, "device")} asked · ${num(late)} past their alert time` : "nothing waits";
    tiles.push(tile(claims ? "queue" : "quiet", scopeTenant ? `${scopeTenant}: waiting` : "waiting", num(claims),
      claims === 1 ? "claim waiting" : "claims waiting", sub, { "data-summary": "waiting", "data-value": claims }));
    const oldest = waiting.groups.reduce((best, g) => (!best || g.oldestWaitSeconds > best.oldestWaitSeconds ? g : best), null);
    const [value, unit] = oldest ? durationParts(oldestNow(oldest)) : ["–", ""];
    tiles.push(tile(oldest ? "queue" : "quiet", "oldest wait", value, unit,
      oldest ? `${oldest.tenant} · ${WAIT_KINDS[oldest.kind] || oldest.kind}` : "nothing waits",
      { "data-summary": "oldest", "data-seconds": oldest ? oldest.oldestWaitSeconds : "",
        "data-submitted-at": oldest ? oldest.oldestSubmittedAt : "" }, true));
  }
  if (data.counts) {
    const open = (severity) => data.counts.filter((c) => c.severity === severity).reduce((sum, c) => sum + c.open, 0);
    const critical = open("critical");
    const warnings = open("warning");
    tiles.push(tile(critical ? "alarm" : "quiet", scopeTenant ? `${scopeTenant}: alerts` : "alerts", num(critical),
      critical === 1 ? "critical alert open" : "critical alerts open", warnings ? `${plural(warnings, "warning")} open` : "no warnings open",
      { "data-summary": "critical", "data-value": critical, "data-warnings": warnings }));
  }
  strip.replaceChildren(...tiles);
  for (const g of fleetSummary()) {
    const heading = document.querySelector(`#nodes .generation[data-generation="${CSS.escape(g.generation)}"] h3`);
    if (heading) heading.textContent = generationHeading(g);
  }
  refreshGroupHeadings();
}

function summarySoon() {  // after live statuses: one summary a frame, however many arrived
  if (summaryFrame) return;
  summaryFrame = requestAnimationFrame(() => {
    summaryFrame = 0;
    timed("summary", renderSummary);
  });
}

function oldestNow(group) {  // the API's figure plus the time since it answered: no clock skew
  return group.oldestWaitSeconds + (performance.now() - waitingAt) / 1000;
}

function tick() {  // the oldest wait goes on growing between fetches
  const oldest = document.querySelector('[data-summary="oldest"]');
  if (!oldest?.dataset.seconds || !data.waiting) return;
  const [value, unit] = durationParts(Number(oldest.dataset.seconds) + (performance.now() - waitingAt) / 1000);
  oldest.querySelector(".num").firstChild.textContent = value;
  oldest.querySelector(".unit").textContent = unit;
}

// --- fleet over time -------------------------------------------------------------------------------

function historyLayers(history) {
  if (history.tenant) {
    return [["used", "var(--used)", "used within nominal", (p) => p.used],
            ["borrowed", "var(--borrowed)", "borrowed", (p) => p.borrowed]];
  }
  if (data.usage && !data.usage.enforced) { // no quota: nothing is borrowed, devices are in use or idle
    return [["inuse", "var(--used)", "in use", (p) => (p.used || 0) + (p.borrowed || 0)],
            ["idle", "var(--idle)", "idle", (p) => p.idle]];
  }
  return [["used", "var(--used)", "used within nominal", (p) => p.used],
          ["borrowed", "var(--borrowed)", "borrowed", (p) => p.borrowed],
          ["idle", "var(--idle)", "idle", (p) => p.idle]];
}

function renderHistory(history) {
  const box = document.getElementById("history");
  box.replaceChildren();
  const tenant = history.tenant;
  const layers = historyLayers(history);
  const legend = document.getElementById("history-legend");
  legend.replaceChildren(...layers.map(([, color, label]) =>
    el("span", {}, el("i", { class: "swatch", style: `background:${color}` }), label)));
  if (tenant) legend.append(el("span", {}, el("i", { class: "swatch", style: "background:var(--nominal)" }),
                                `${tenant}'s nominal quota`));
  if (tenant && !view.history) { // a tenant-scoped token: the API answers with its own tenant only
    const select = document.getElementById("history-tenant");
    select.options[0].hidden = true;
    select.options[0].textContent = tenant;
    if (scopeTenant !== tenant) {
      scopeTenant = tenant;
      showScope();
      renderFilters();
      timed("summary", renderSummary);
    }
  }
  const W = 340;
  const H = 110;
  const PAD = 18;
  const quiet = [];
  for (const f of history.flavors) {
    const points = f.points;
    const n = points.length;
    const top = (p) => layers.reduce((sum, [, , , value]) => sum + (value(p) || 0), 0);
    if (!points.some((p) => top(p) > 0 || (tenant && p.nominal))) {
      quiet.push(f.flavor); // no devices and no use in the window: a name in a line, not an empty chart
      continue;
    }
    const scale = Math.max(1, ...points.map((p) => Math.max(top(p), tenant ? p.nominal || 0 : 0)));
    const x = (i) => (n > 1 ? i / (n - 1) : 0) * W;
    const y = (v) => PAD + (H - PAD) * (1 - v / scale);
    const line = (run, value) =>
      run.map((i, j) => `${j ? "L" : "M"}${x(i).toFixed(1)},${y(value(j)).toFixed(1)}`).join("");
    const chart = svg("svg", { viewBox: `0 0 ${W} ${H + 14}`, role: "img",
                               "aria-label": `${f.flavor} devices over the last ${history.window}` });
    const runs = []; // stretches with samples; a gap is left blank, not drawn as zero
    let run = [];
    points.forEach((p, i) => {
      if (p.used === null) {
        if (run.length) runs.push(run);
        run = [];
      } else run.push(i);
    });
    if (run.length) runs.push(run);
    for (const r of runs) {
      let below = r.map(() => 0);
      for (const [k, color, , value] of layers) {
        const above = r.map((i, j) => below[j] + (value(points[i]) || 0));
        const path = `${line(r, (j) => above[j])}L${line(r.slice().reverse(), (j) => below[r.length - 1 - j]).slice(1)}Z`;
        chart.append(svg("path", { d: r.length > 1 ? path : `M${x(r[0])},${y(above[0])}h2V${y(below[0])}h-2Z`,
                                   fill: color, class: `layer layer-${k}` }));
        below = above;
      }
      if (tenant) {
        chart.append(svg("path", { d: line(r, (j) => points[r[j]].nominal || 0), stroke: "var(--nominal)",
                                   fill: "none", "stroke-width": 1.5, class: "nominal-line" }));
      }
    }
    const label = (t, anchor, xx, yy) => {
      const text = svg("text", { x: xx, y: yy, class: "axis", "text-anchor": anchor });
      text.textContent = t;
      return text;
    };
    const first = new Date(points[0].at * 1000);
    const last = new Date(points[n - 1].at * 1000);
    const clock = { hour: "2-digit", minute: "2-digit" };
    const when = (d) => (history.window === "hour" ? d.toLocaleTimeString([], clock)
                                                   : d.toLocaleString([], { weekday: "short", ...clock }));
    const top_ = Math.round(scale);
    const units = f.unitsPerDevice ? ` (${plural(top_ * f.unitsPerDevice, "GPU unit")})` : "";
    chart.append(label(`${plural(top_, "device")}${units}`, "start", 0, 10), label(when(first), "start", 0, H + 12),
                 label(when(last), "end", W, H + 12));
    const latest = [...points].reverse().find((p) => p.used !== null);
    const now = latest
      ? `${layers.map(([, , l, value]) => `${l} ${num(value(latest) || 0)}`).join(", ")} at ${new Date(latest.at * 1000).toLocaleTimeString([], clock)}`
      : "no samples yet";
    box.append(el("div", { class: "chart", "data-flavor": f.flavor, "data-runs": runs.length },
                  el("div", { class: "numbers" }, el("b", {}, f.flavor), ` · ${now}`), chart));
  }
  const folded = document.getElementById("history-quiet");
  folded.textContent = quiet.length
    ? `${tenant ? `${tenant} used` : "No devices of"} ${tenant ? "none of " : ""}${quiet.join(", ")} in the last ${history.window}`
    : "";
  if (!history.flavors.length) box.append(el("p", { class: "empty" },
    "no usage samples yet: the notifier writes one a minute once flavors and quotas are set"));
}

async function loadHistory() {
  const query = `/v1/usage/history?window=${view.window}${view.history ? `&tenant=${encodeURIComponent(view.history)}` : ""}`;
  const history = await get(query);
  timed("history", () => renderHistory(history));
  lastHistory = Date.now();
}

function showHistory(window_, tenant) {
  if (window_ !== undefined) view.window = window_;
  if (tenant !== undefined) view.history = tenant;
  writeView();
  for (const b of document.querySelectorAll("#windows button")) {
    b.classList.toggle("on", b.dataset.window === view.window);
    b.setAttribute("aria-pressed", String(b.dataset.window === view.window));
  }
  document.getElementById("history-tenant").value = view.history;
  loadHistory().catch(failed);
  soon("waiting"); // its waits before admission follow the window
}

// --- usage against quota ---------------------------------------------------------------------------

function usageText(r, enforced) {
  const parts = [];
  if (enforced) {
    parts.push(`${num(r.used)} of ${num(r.nominal)} nominal`);
    if (r.borrowed) parts.push(`${num(r.borrowed)} borrowed`);
    if (r.lent) parts.push(`${num(r.lent)} lent`);
  } else parts.push(`${num(r.used)} in use`);
  parts.push(plural(r.usedUnits, "GPU unit"));
  if (r.pending) parts.push(`${plural(r.pending, "device")} more asked`);
  return parts.join(" · ");
}

function renderUsage() {
  const usage = data.usage;
  const box = document.getElementById("usage");
  box.replaceChildren();
  const byFlavor = new Map();
  for (const row of usage.items) {
    const key = flavorName(row.flavor);
    if (!byFlavor.has(key)) byFlavor.set(key, []);
    byFlavor.get(key).push(row);
  }
  document.getElementById("usage-legend").hidden = !usage.enforced;
  if (byFlavor.size === 0) box.append(el("p", { class: "empty" }, "no quotas and no devices in use"));
  if (!usage.enforced) box.append(el("p", { class: "empty" }, "no quota is set: the fleet is open to every tenant"));
  for (const [flavor, rows] of byFlavor) {
    const title = flavor === UNFLAVORED ? "devices that no flavor's selector accepts" : null;
    const section = el("section", { class: "flavor", "data-flavor": flavor }, el("h3", { title }, flavor));
    const scale = Math.max(1, ...rows.map((r) => Math.max(r.used, usage.enforced ? r.nominal : 0)));
    for (const r of rows) {
      const within = usage.enforced ? Math.min(r.used, r.nominal) : r.used;
      const borrowed = usage.enforced ? r.borrowed : 0;
      const bar = el("div", { class: "bar", title: usageText(r, usage.enforced) },
        el("div", { class: "in", style: `width:${(100 * within) / scale}%` }),
        el("div", { class: "over", style: `left:${(100 * within) / scale}%;width:${(100 * borrowed) / scale}%` }),
        usage.enforced ? el("div", { class: "nominal", style: `left:calc(${(100 * r.nominal) / scale}% - 1px)` }) : null);
      const who = el("div", { class: "who", title: `${r.tenant}'s usage over time`, tabindex: 0, role: "button" },
                     r.tenant + (r.cohort ? ` (${r.cohort})` : ""));
      who.addEventListener("click", () => showHistory(undefined, r.tenant));
      who.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); showHistory(undefined, r.tenant); } });
      section.append(el("div", { class: "row usage-row", "data-tenant": r.tenant, "data-flavor": r.flavor ?? "",
                                 "data-used": r.used, "data-nominal": r.nominal, "data-borrowed": borrowed,
                                 "data-lent": r.lent }, who, bar, el("div", { class: "numbers" }, usageText(r, usage.enforced))));
    }
    box.append(section);
  }
  const select = document.getElementById("history-tenant");
  fillSelect(select, "whole fleet", [...new Set(usage.items.map((r) => r.tenant))].sort());
  select.value = view.history;
  renderShares(usage);
  renderCohortTree(usage.cohorts || []);
}

/** Fair share per tenant, next in line first: with fairSharing.halfLife, its past use and when it halves. */
function renderShares(usage) {
  const halfLife = Number(usage.halfLife) || 0;
  document.getElementById("shares-hint").textContent = halfLife > 0
    ? `share = (GPU units in use + past use) / weight; past use halves every ${duration(halfLife)}`
    : "share = GPU units in use / weight (no fairSharing.halfLife: past use is not counted)";
  const body = document.getElementById("shares");
  body.replaceChildren(...(usage.shares || []).map((s) => el("tr", { "data-tenant": s.tenant },
    el("td", {}, s.tenant), el("td", { class: "num" }, num(s.weight, 2)), el("td", { class: "num" }, num(s.inUse, 2)),
    el("td", { class: "num" }, halfLife > 0 ? num(s.pastUse, 2) : "–"), el("td", { class: "num" }, num(s.share, 2)),
    el("td", { class: "num" }, s.halvesIn == null ? "–" : duration(s.halvesIn)))));
}

/** The cohort tree, children indented under their parents: per flavor, what the subtree holds of its nominal. */
function renderCohortTree(cohorts) {
  document.getElementById("tree-title").hidden = cohorts.length === 0;
  const limit = (n) => (n == null ? "–" : num(n));
  const rows = [];
  for (const c of cohorts) {
    const flavors = c.flavors.length ? c.flavors : [null];
    flavors.forEach((f, i) => {
      const name = el("td", { style: `padding-left:${0.3 + 1.2 * c.depth}em` }, i === 0 ? c.name : "");
      rows.push(el("tr", { "data-cohort": c.name, "data-flavor": f ? f.flavor : "" }, name,
        el("td", {}, f ? f.flavor : ""), el("td", { class: "num" }, f ? `${num(f.used)} / ${num(f.nominal)}` : ""),
        el("td", { class: "num" }, f ? num(f.ownNominal) : ""), el("td", { class: "num" }, f ? limit(f.borrowingLimit) : ""),
        el("td", { class: "num" }, f ? limit(f.lendingLimit) : "")));
    });
  }
  document.getElementById("cohort-tree").replaceChildren(...rows);
}

// --- node map ----------------------------------------------------------------------------------

function cellTitle(node, d) {
  let text = `${node} ${d.name}${d.model ? ` (${d.model})` : ""}: ${d.state}`;
  if (d.state === "allocated") text += d.tenant ? ` to ${d.tenant} (${d.claim})` : " (another tenant)";
  if (d.temperatureC !== null && d.temperatureC !== undefined) text += `; ${d.temperatureC} °C`;
  if (d.throttleReasons?.length) text += `; throttle reasons: ${d.throttleReasons.join(", ")}`;
  return text;
}

function cellFor(node, generation, d) { // 8,000 of these on a large fleet: built without el()'s generality
  const key = `${d.driver}/${d.pool}/${d.name}`;
  const cell = document.createElement("div");
  cell.className = `cell ${d.kind === "mig" ? "mig" : "gpu"} ${d.state}${d.state === "allocated" && !d.tenant ? " others" : ""}`;
  cell.setAttribute("data-node", node);
  cell.setAttribute("data-device", d.name);
  cell.setAttribute("data-key", key);
  cell.setAttribute("data-state", d.state);
  cell.setAttribute("data-tenant", d.tenant || "");
  cell.title = cellTitle(node, d);
  cellsByKey.set(key, cell);
  // a MIG slice counts towards its GPU: the GPU is in use while any of its slices is
  devicesByKey.set(key, { node, generation, kind: d.kind, state: d.state, tenant: d.tenant || "",
                          gpu: d.kind === "mig" && d.parent ? `${d.driver}/${d.pool}/${d.parent}` : key });
  if (d.tenant && d.claim) {
    const claim = `${d.tenant}/${d.claim}`;
    if (!claimKeys.has(claim)) claimKeys.set(claim, new Set());
    claimKeys.get(claim).add(key);
  }
  return cell;
}

function generationHeading(g) {
  const slices = g.slices ? ` (${plural(g.slices, "MIG slice")})` : "";
  return `${g.generation}: ${plural(g.nodes, "node")}, ${plural(g.gpus, "GPU")}${slices}: ${stateWords(g.states)}`;
}

/** The node map's groups: by generation (the order the API gives), or by the value of node label `key` (a gang
 * topology key: a gang's members share one), those without it last; each with its nodes. */
function nodeGroups(nodes, key) {
  if (!key) {
    const groups = [];
    for (const n of nodes) {
      if (!groups.length || groups[groups.length - 1].name !== n.generation) groups.push({ name: n.generation, nodes: [] });
      groups[groups.length - 1].nodes.push(n);
    }
    return groups;
  }
  const byValue = new Map();
  for (const n of nodes) {
    const value = n.labels?.[key];
    const name = value === undefined ? `no ${key}` : `${key}=${value}`;
    if (!byValue.has(name)) byValue.set(name, { name, nodes: [], labelled: value !== undefined });
    byValue.get(name).nodes.push(n);
  }
  return [...byValue.values()].sort((a, b) => (b.labelled - a.labelled) || a.name.localeCompare(b.name));
}

function refreshGroupHeadings() { // a label value's nodes: what a gang asking for one value finds there, kept live
  for (const section of document.querySelectorAll("#nodes .generation[data-group]")) {
    const gpus = section.querySelectorAll(".cell.gpu").length;
    const idle = section.querySelectorAll('.cell.gpu[data-state="idle"]').length;
    const nodes = section.querySelectorAll(".node").length;
    section.querySelector("h3").textContent = `${section.dataset.group}: ${plural(nodes, "node")}, ${plural(gpus, "GPU")}, ${idle} idle`;
  }
}

function renderNodeGrouping(nodes) { // the label keys any node carries, as choices
  const keys = [...new Set(nodes.flatMap((n) => Object.keys(n.labels || {})))].sort();
  const select = document.getElementById("nodes-group");
  fillSelect(select, "generation", keys.includes(view.group) || !view.group ? keys : [...keys, view.group]);
  select.value = view.group;
}

function renderNodes() { // grouped by generation or a node label; a cell per GPU, its MIG slices inside it; nodes wrap
  const nodes = data.nodes || [];
  renderNodeGrouping(nodes);
  const box = document.getElementById("nodes");
  box.replaceChildren();
  cellsByKey.clear();
  devicesByKey.clear();
  claimKeys.clear();
  const devices = nodes.reduce((sum, n) => sum + n.devices.length, 0);
  box.classList.toggle("small", devices > 1500); // a thousand 8-GPU nodes fit a screen or two
  for (const group of nodeGroups(nodes, view.group)) {
    const section = el("div", { class: "nodes" });
    const attrs = view.group ? { class: "generation", "data-group": group.name } : { class: "generation", "data-generation": group.name };
    box.append(el("section", attrs, el("h3", {}, group.name), section));
    for (const n of group.nodes) renderNode(section, n);
  }
  refreshGroupHeadings();
  if (!nodes.length) box.append(el("p", { class: "empty" }, data.nodes === null ? "this API process has no view of the fleet" : "no inventory yet"));
  for (const g of view.group ? [] : fleetSummary()) { // headings from the same counts as the strip
    const heading = box.querySelector(`.generation[data-generation="${CSS.escape(g.generation)}"] h3`);
    if (heading) heading.textContent = generationHeading(g);
  }
}

function renderNode(section, n) {
  const generation = n.generation;
  const cells = el("div", { class: "cells" });
  const boxes = new Map(); // GPU name -> the box its MIG slices go in
  for (const d of n.devices) {
    if (d.kind !== "mig") continue;
    if (!boxes.has(d.parent)) boxes.set(d.parent, el("div", { class: "gpu-box", title: `${n.node} ${d.parent}: MIG` }));
    boxes.get(d.parent).append(cellFor(n.node, generation, d));
  }
  for (const d of n.devices) {
    if (d.kind === "mig") continue;
    cells.append(cellFor(n.node, generation, d));
    if (boxes.has(d.name)) {
      cells.append(boxes.get(d.name));
      boxes.delete(d.name);
    }
  }
  for (const orphan of boxes.values()) cells.append(orphan); // slices whose GPU is not listed
  section.append(el("div", { class: `node${n.stale ? " stale" : ""}`, "data-node": n.node, title: n.node },
                    el("div", { class: "name" }, n.node), cells));
}

function setCell(key, state, tenant, claim) {
  const cell = cellsByKey.get(key);
  if (!cell) return;
  cell.dataset.state = state;
  cell.dataset.tenant = tenant || "";
  cell.className = `cell ${cell.classList.contains("mig") ? "mig" : "gpu"} ${state}${state === "allocated" && !tenant ? " others" : ""}`;
  cell.title = `${cell.dataset.node} ${cell.dataset.device}: ${state}${state === "allocated" ? (tenant ? ` to ${tenant} (${claim})` : " (another tenant)") : ""}`;
  const device = devicesByKey.get(key);
  if (device) {
    device.state = state;
    device.tenant = tenant || "";
  }
}

function applyStatus(event) { // the node map follows a claim's devices as its status arrives
  // Returns whether the map must be fetched again: a freed device's own state (idle, throttled, unhealthy)
  // is the server's to say, and another tenant's released claim names no devices.
  const claim = event.tenant ? `${event.tenant}/${event.claim}` : null;
  let freed = event.state === "Released" || event.state === "Preempted";
  if (event.state === "Allocated") {
    for (const d of event.devices) setCell(`${d.driver}/${d.pool}/${d.device}`, "allocated", event.tenant, event.claim);
    if (claim) claimKeys.set(claim, new Set(event.devices.map((d) => `${d.driver}/${d.pool}/${d.device}`)));
  } else if (claim && claimKeys.has(claim)) {
    for (const key of claimKeys.get(claim)) setCell(key, "idle");
    claimKeys.delete(claim);
    freed = true;
  }
  summarySoon();
  window.lastStatusApplied = { claim, state: event.state, at: Date.now() };
  return freed;
}

// --- waiting ---------------------------------------------------------------------------------------

function groupKey(g) {
  return `${g.tenant}\n${g.reason}`;
}

function claimEta(c) { // a waiting claim's name and, where one was published, its estimated start (p50)
  const p50 = c.estimatedStart?.p50;
  if (!p50) return el("span", { class: "claim-eta", "data-claim": c.name }, c.name);
  const p90 = c.estimatedStart.p90;
  return el("span", { class: "claim-eta", "data-claim": c.name, "data-p50": p50,
                      title: `estimated start ${new Date(p50).toLocaleString()}${p90 ? `, p90 ${new Date(p90).toLocaleString()}` : ""}` },
    c.name, " ", el("span", { class: "eta" }, `(${fromNow(p50)}, ${when(p50)})`));
}

async function showClaims(row, group) { // a group's claims, fetched when it is opened
  const page = await get(`/v1/claims?state=Pending&namespace=${encodeURIComponent(group.tenant)}&limit=200`);
  const shown = page.items.filter((c) => (c.reason || "not decided yet") === group.reason);
  const list = row.querySelector(".claims");
  list.replaceChildren();
  for (const [i, c] of shown.entries()) list.append(...(i ? [", "] : []), claimEta(c));
  if (page.next) list.append(" …");
}

function waitingShown(g) {
  return (!view.tenant || g.tenant === view.tenant) && (!view.flavor || (g.flavors || []).includes(view.flavor))
    && (!view.why || g.kind === view.why);
}

function renderWaiting() {
  const waiting = data.waiting;
  showSort("waiting");
  const body = document.getElementById("pending");
  body.replaceChildren();
  const shown = sortRows(waiting.groups.filter(waitingShown), "waiting");
  for (const g of shown) {
    const details = el("details", {}, el("summary", { class: "reason" }, g.reason), el("div", { class: "claims numbers" }));
    const row = el("tr", { class: "waiting-group", "data-tenant": g.tenant, "data-claims": g.claims,
                           "data-devices": g.devices, "data-kind": g.kind, "data-flavors": (g.flavors || []).join(" ") },
      el("td", {}, g.tenant), el("td", { class: "num" }, num(g.claims)), el("td", { class: "num" }, num(g.devices)),
      el("td", { class: "num", title: new Date(g.oldestSubmittedAt).toLocaleString() }, duration(g.oldestWaitSeconds)),
      el("td", { title: (g.flavors || []).length ? `would take ${g.flavors.join(", ")}` : null }, WAIT_KINDS[g.kind] || g.kind),
      el("td", {}, details));
    details.addEventListener("toggle", () => {
      if (details.open) {
        openGroups.add(groupKey(g));
        showClaims(row, g).catch(() => {});
      } else openGroups.delete(groupKey(g));
    });
    if (openGroups.has(groupKey(g))) details.open = true; // kept open across live updates
    body.append(row);
  }
  if (!shown.length) {
    body.append(el("tr", {}, el("td", { colspan: 6, class: "empty" },
      waiting.groups.length ? "nothing waits that the filters let through" : "nothing waits")));
  }
  const claims = (groups) => groups.reduce((sum, g) => sum + g.claims, 0);
  document.getElementById("waiting-shown").textContent = shown.length === waiting.groups.length
    ? `${plural(claims(shown), "claim")} in ${plural(shown.length, "group")}`
    : `${plural(claims(shown), "claim")} in ${plural(shown.length, "group")} of ${num(claims(waiting.groups))} in ${num(waiting.groups.length)}`;
  const waits = document.getElementById("waits");
  waits.replaceChildren();
  for (const t of waiting.tenants.filter((t) => !view.tenant || t.tenant === view.tenant)) {
    waits.append(el("tr", { class: "tenant-waits", "data-tenant": t.tenant },
      el("td", {}, t.tenant), el("td", { class: "num" }, num(t.waiting)),
      el("td", { class: "num" }, duration(t.p50WaitSeconds)),
      el("td", { class: "num" }, duration(t.p90WaitSeconds)),
      el("td", { class: "num" }, duration(t.maxWaitSeconds)), el("td", { class: "num" }, num(t.pastAlertAfter))));
  }
  const admitted = document.getElementById("admitted");
  admitted.replaceChildren();
  const rows = waiting.admitted.filter((a) => (!view.tenant || a.tenant === view.tenant) && (!view.flavor || a.flavor === view.flavor));
  for (const a of rows) {
    admitted.append(el("tr", { class: "admitted-waits", "data-tenant": a.tenant, "data-flavor": a.flavor || "" },
      el("td", {}, a.tenant), el("td", {}, a.flavor === null ? "unflavored" : a.flavor), el("td", { class: "num" }, num(a.admitted)),
      ...[a.p50WaitSeconds, a.p90WaitSeconds, a.maxWaitSeconds].map((v) => el("td", { class: "num" }, duration(v)))));
  }
  if (!rows.length) {
    admitted.append(el("tr", {}, el("td", { colspan: 6, class: "empty" }, `nothing admitted in the last ${waiting.window}`)));
  }
  document.getElementById("admitted-title").textContent =
    `Waited before admission, per tenant and flavor, over the last ${waiting.window}`;
  renderEstimates(waiting.window);
}

function renderEstimates(window_) { // the start estimates' error (GET /v1/estimates), per tenant and flavor
  const body = document.getElementById("estimates");
  body.replaceChildren();
  const found = data.estimates;
  document.getElementById("estimates-title").textContent =
    `Start estimates' error, per tenant and flavor, over the last ${window_}`;
  if (!found) {
    body.append(el("tr", {}, el("td", { colspan: 7, class: "empty" }, "this API does not measure start estimates")));
    return;
  }
  const rows = found.groups.filter((g) => (!view.tenant || g.tenant === view.tenant) && (!view.flavor || g.flavor === view.flavor));
  const cell = (v) => el("td", { class: "num" }, v === null || v === undefined ? "–" : duration(v));
  for (const g of rows) {
    body.append(el("tr", { class: "estimate-error", "data-tenant": g.tenant, "data-flavor": g.flavor || "",
                           "data-last-p50": g.lastP50 },
      el("td", {}, g.tenant), el("td", {}, g.flavor === null ? "unflavored" : g.flavor), el("td", { class: "num" }, num(g.claims)),
      cell(g.firstP50), cell(g.firstP90), cell(g.lastP50), cell(g.lastP90)));
  }
  if (rows.length > 1 && found.overall && !view.tenant && !view.flavor) {
    const o = found.overall;
    body.append(el("tr", { class: "estimate-error overall", "data-tenant": "", "data-flavor": "", "data-last-p50": o.lastP50 },
      el("td", { colspan: 2 }, "all"), el("td", { class: "num" }, num(o.claims)),
      cell(o.firstP50), cell(o.firstP90), cell(o.lastP50), cell(o.lastP90)));
  }
  if (!rows.length) {
    body.append(el("tr", {}, el("td", { colspan: 7, class: "empty" },
      `no claim allocated in the last ${window_} had an estimate published`)));
  }
}

// --- alerts, folded by kind ------------------------------------------------------------------------

function alertShown(a) { // a count row or an alert: the filters compare its tenant, flavor and kind
  const flavor = a.flavor !== undefined ? a.flavor : a.labels?.flavor ?? null;
  return (!view.tenant || a.tenant === view.tenant) && (!view.flavor || flavor === view.flavor)
    && (!view.alert || a.kind === view.alert);
}

function folds() { // the open alerts' counts, per kind: the strip's counts are these
  const byKind = new Map();
  for (const c of data.counts.filter(alertShown)) {
    let f = byKind.get(c.kind);
    if (!f) {
      f = { kind: c.kind, severity: c.severity, open: 0, tenants: new Set(), lastSeen: c.lastSeen };
      byKind.set(c.kind, f);
    }
    f.open += c.open;
    if ((SEVERITY[c.severity] || 0) > (SEVERITY[f.severity] || 0)) f.severity = c.severity;
    if (c.tenant) f.tenants.add(c.tenant);
    if (c.lastSeen > f.lastSeen) f.lastSeen = c.lastSeen;
  }
  return [...byKind.values()];
}

function alertRow(a) {
  return el("tr", { class: "alert", "data-key": a.key, "data-kind": a.kind },
    el("td", { colspan: 2 }, a.summary),
    el("td", { class: "num", title: "times it was raised or repeated" }, num(a.count)),
    el("td", {}, a.tenant || "fleet"),
    el("td", { title: `first seen ${new Date(a.firstSeen).toLocaleString()}` }, when(a.lastSeen)));
}

function renderAlerts() {
  showSort("alerts");
  const body = document.getElementById("alerts");
  body.replaceChildren();
  const open = expanded();
  const shown = sortRows(folds(), "alerts");
  for (const f of shown) {
    const isOpen = open.has(f.kind);
    const button = el("button", { type: "button", class: "fold", "aria-expanded": String(isOpen) }, f.kind);
    button.addEventListener("click", () => toggleKind(f.kind));
    const tenants = [...f.tenants].sort();
    body.append(el("tr", { class: "alert-kind", "data-kind": f.kind, "data-open": f.open, "data-severity": f.severity },
      el("td", {}, button), el("td", { class: `sev-${f.severity}` }, f.severity),
      el("td", { class: "num" }, num(f.open)),
      el("td", {}, tenants.length ? tenants.join(", ") : "fleet"),
      el("td", { title: new Date(f.lastSeen).toLocaleString() }, when(f.lastSeen))));
    if (!isOpen) continue;
    const list = alertLists.get(f.kind);
    if (!list) {
      body.append(el("tr", { class: "alert-loading" }, el("td", { colspan: 5, class: "empty" }, "loading…")));
      continue;
    }
    const items = list.filter(alertShown);
    for (const a of items) body.append(alertRow(a));
    if (list.length >= ALERT_LIST_LIMIT && items.length < f.open) {
      body.append(el("tr", {}, el("td", { colspan: 5, class: "empty" },
        `the newest ${num(items.length)} of ${num(f.open)}`)));
    }
  }
  if (!shown.length) {
    body.append(el("tr", {}, el("td", { colspan: 5, class: "empty" },
      data.counts.length ? "no open alert that the filters let through" : "no open alerts")));
  }
  const total = shown.reduce((sum, f) => sum + f.open, 0);
  document.getElementById("alerts-shown").textContent = `${plural(total, "open alert")} of ${plural(shown.length, "kind")}`;
  const resolved = document.getElementById("resolved");
  resolved.replaceChildren();
  const recent = (data.resolved || []).filter(alertShown);
  for (const a of recent) resolved.append(alertRow(a));
  if (!recent.length) resolved.append(el("tr", {}, el("td", { colspan: 5, class: "empty" }, "none")));
  document.getElementById("resolved-title").textContent = `Recently resolved (${num(recent.length)})`;
}

async function loadAlertLists() { // the open alerts of each opened kind
  const kinds = [...expanded()];
  const lists = await Promise.all(kinds.map((kind) =>
    get(`/v1/alerts?kind=${encodeURIComponent(kind)}&resolved=false&limit=${ALERT_LIST_LIMIT}`)));
  alertLists.clear();
  for (const [i, kind] of kinds.entries()) alertLists.set(kind, lists[i]);
}

function toggleKind(kind) {
  const open = expanded();
  if (open.has(kind)) open.delete(kind);
  else open.add(kind);
  view.expand = [...open].sort().join(",");
  writeView();
  timed("alerts", renderAlerts);
  if (open.has(kind)) loadAlertLists().then(() => timed("alerts", renderAlerts), failed);
}

// --- fetching --------------------------------------------------------------------------------------

async function load(panels) { // fetch what these panels show, then render them
  const want = new Set(panels);
  const jobs = {};
  if (want.has("usage") || want.has("waiting")) {
    jobs.usage = get("/v1/usage");
    jobs.waiting = get(`/v1/waiting?window=${view.window}`);
    jobs.estimates = get(`/v1/estimates?window=${WINDOW_SECONDS[view.window]}`).catch((error) => {
      if (error.status === 404) return null; // an API from before start estimates
      throw error;
    });
  }
  if (want.has("alerts")) {
    jobs.counts = get("/v1/alerts/counts");
    jobs.resolved = get("/v1/alerts?resolved=true&limit=20");
    jobs.lists = loadAlertLists();
  }
  if (want.has("nodes")) { // no fleet view in this process (503): no map
    jobs.nodes = get("/v1/nodes").catch((error) => {
      if (error.status === 503) return null;
      throw error;
    });
  }
  const got = Object.fromEntries(await Promise.all(Object.entries(jobs).map(async ([k, p]) => [k, await p])));
  if (got.usage) {
    data.usage = got.usage;
    data.waiting = got.waiting;
    data.estimates = got.estimates;
    waitingAt = performance.now();
  }
  if (got.counts) {
    data.counts = got.counts;
    data.resolved = got.resolved;
  }
  if ("nodes" in got) data.nodes = got.nodes;
  renderFilters();
  if (got.usage) {
    timed("usage", renderUsage);
    timed("waiting", renderWaiting);
  }
  if (got.counts) timed("alerts", renderAlerts);
  if ("nodes" in got) timed("nodes", renderNodes);
  timed("summary", renderSummary);
}

function showStatus() {
  const status = document.getElementById("status");
  status.textContent = `updated ${new Date().toLocaleTimeString()}, ${live ? "live" : `polling every ${POLL_MS / 1000}s`}`;
  status.className = live ? "live" : "";
}

function showScope() {
  document.getElementById("scope").textContent = scopeTenant
    ? `tenant ${scopeTenant}: its claims and alerts, the whole fleet's GPUs`
    : "";
}

function failed(error) {
  if (error.auth) {
    askForToken("the token was refused; paste a viewer token");
    return;
  }
  const status = document.getElementById("status");
  status.textContent = `refresh failed: ${error.message} (retrying)`;
  status.className = "error";
}

async function refresh() {
  const started = performance.now();
  try {
    await load(["usage", "waiting", "alerts", "nodes"]);
    if (Date.now() - lastHistory >= HISTORY_MS) await loadHistory();
    document.getElementById("data").hidden = false;
    document.getElementById("login").hidden = true;
    lastFull = Date.now();
    window.renderTimes.total = Math.round(performance.now() - started);
    showStatus();
  } catch (error) {
    failed(error);
  }
}

function soon(...panels) {
  for (const p of panels) soonPanels.add(p);
  if (soonTimer) return;
  soonTimer = setTimeout(async () => {
    const panels_ = [...soonPanels];
    soonPanels.clear();
    const started = performance.now();
    await load(panels_).then(showStatus, failed);
    lastLoadMs = performance.now() - started;
    soonTimer = null;
    if (soonPanels.size) soon(); // what arrived meanwhile
  }, Math.max(SOON_MS, 4 * lastLoadMs));
}

function onEvent(event) {
  if (event.type === "status") soon("usage", "waiting", ...(applyStatus(event) ? ["nodes"] : []));
  else if (event.type === "inventory") soon("nodes");
  else if (event.type === "alert") soon("alerts");
  else if (event.type === "resync") refresh();
}

async function follow() { // the live stream; returns when it ends
  const controller = new AbortController();
  stream = controller;
  const response = await fetch("/v1/events", { headers: { Authorization: `Bearer ${token}` }, signal: controller.signal });
  if (response.status === 401) throw Object.assign(new Error("the token was refused"), { auth: true });
  if (response.status === 503) { // no bus in this API process: polling it is, asking again now and then
    await new Promise((resolve) => setTimeout(resolve, 6 * POLL_MS));
    return;
  }
  if (!response.ok || !response.body) return;
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut = buffer.indexOf("\n\n");
    while (cut >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let kind = "message";
      let payload = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) kind = line.slice(6).trim();
        else if (line.startsWith("data:")) payload += line.slice(5).trim();
      }
      if (kind === "hello") {
        live = true;
        showStatus();
        refresh();
      } else if (kind === "bye") return;
      else if (payload) onEvent(JSON.parse(payload));
      cut = buffer.indexOf("\n\n");
    }
  }
}

async function keepFollowing() {
  const mine = token;
  while (token === mine && token) {
    try {
      await follow();
    } catch (error) {
      if (error.auth) {
        failed(error);
        return;
      }
    }
    if (live) {
      live = false;
      showStatus();
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS)); // polling covers the gap; then try again
  }
}

function askForToken(message) {
  clearInterval(timer);
  timer = null;
  token = null;
  live = false;
  if (stream) stream.abort();
  sessionStorage.removeItem("claimbroker-token");
  document.getElementById("data").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message || "";
}

function start(value) {
  token = value;
  sessionStorage.setItem("claimbroker-token", value);
  refresh();
  clearInterval(timer);
  timer = setInterval(() => {
    if (!live || Date.now() - lastFull >= FULL_MS) refresh();
  }, POLL_MS);
  keepFollowing();
}

// --- start -----------------------------------------------------------------------------------------

const fromUrl = new URL(window.location.href).searchParams.get("token");
readView();
writeView(); // keeps the token out of the address bar, history and screenshots
document.getElementById("windows").append(...WINDOWS.map((w) => {
  const button = el("button", { type: "button", "data-window": w, class: w === view.window ? "on" : "",
                                "aria-pressed": String(w === view.window) }, w);
  button.addEventListener("click", () => showHistory(w));
  return button;
}));
document.getElementById("history-tenant").addEventListener("change", (e) => showHistory(undefined, e.target.value));
document.getElementById("nodes-group").addEventListener("change", (e) => {
  view.group = e.target.value;
  writeView();
  renderNodes();
});
document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  start(document.getElementById("token").value.trim());
});
filtersWired();
setInterval(tick, 1000);
const initial = fromUrl || sessionStorage.getItem("claimbroker-token");
if (initial) start(initial);
else askForToken("");
