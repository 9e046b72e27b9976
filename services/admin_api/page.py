"""The usage page served at `/`: one self-contained HTML document (inline CSS and JS, no CDN, no build).

It asks for a viewer token (or reads `?token=`, then drops it from the address bar and keeps it in
sessionStorage), then shows: the fleet over time (/v1/usage/history, SVG stacked areas per flavor, a
tenant's on click), usage against quota (/v1/usage), the node map (/v1/nodes, a cell per GPU and MIG
slice, by generation), the queue grouped by tenant and reason (/v1/waiting; a group's claims when it is
opened) and alerts, open first.

Live: it reads /v1/events (server-sent events over the broker's own events, with fetch so the token
travels as a header) and applies a claim's devices to the node map as its status arrives; other panels
are fetched again at most every 0.5 s, and only those an event touched. Without the stream (no bus in
this process, or it dropped) it polls every 5 s and tries the stream again. Everything from the API is
inserted with textContent, never as HTML. Each panel's render time is kept in `window.renderTimes`.
"""

USAGE_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>claim-broker usage</title>
<style>
  :root { --fg: #1d2330; --muted: #6b7280; --line: #e5e7eb; --used: #2563eb; --borrowed: #f59e0b;
          --nominal: #111827; --bg: #f8fafc; --idle: #d1fae5; }
  * { box-sizing: border-box; }
  body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); margin: 0;
         background: var(--bg); }
  header { display: flex; justify-content: space-between; align-items: baseline; padding: 12px 24px;
           background: #fff; border-bottom: 1px solid var(--line); }
  h1 { font-size: 18px; margin: 0; }
  h2 { font-size: 15px; margin: 24px 0 8px; }
  h3 { font-size: 14px; margin: 16px 0 6px; color: var(--muted); }
  main { padding: 0 24px 24px; max-width: 1100px; }
  #status { color: var(--muted); font-size: 12px; }
  .legend span { display: inline-block; margin-right: 16px; font-size: 12px; color: var(--muted); }
  .swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: middle; }
  .row { display: grid; grid-template-columns: 160px 1fr 230px; gap: 12px; align-items: center; margin: 4px 0; }
  .bar { position: relative; height: 16px; background: #fff; border: 1px solid var(--line); border-radius: 3px; }
  .bar .in { position: absolute; top: 0; bottom: 0; left: 0; background: var(--used); }
  .bar .over { position: absolute; top: 0; bottom: 0; background: var(--borrowed); }
  .bar .nominal { position: absolute; top: -3px; bottom: -3px; width: 2px; background: var(--nominal); }
  .numbers { font-variant-numeric: tabular-nums; font-size: 12px; }
  table { border-collapse: collapse; width: 100%; background: #fff; }
  th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
  th { font-weight: 600; font-size: 12px; color: var(--muted); }
  .empty { color: var(--muted); font-style: italic; }
  .sev-critical { color: #b91c1c; font-weight: 600; }
  .sev-warning { color: #b45309; }
  .sev-info { color: var(--muted); }
  form { margin: 48px auto; max-width: 420px; background: #fff; padding: 24px; border: 1px solid var(--line); }
  input { width: 100%; padding: 6px; margin: 8px 0; font: inherit; }
  .error { color: #b91c1c; }
  .panel { padding-bottom: 8px; }
  .controls button { font: inherit; font-size: 12px; padding: 2px 8px; margin-right: 4px; background: #fff;
                     border: 1px solid var(--line); border-radius: 3px; cursor: pointer; }
  .controls button.on { background: var(--fg); color: #fff; }
  .controls select { font: inherit; font-size: 12px; margin-left: 12px; }
  .charts { display: flex; flex-wrap: wrap; gap: 12px; }
  .chart { background: #fff; border: 1px solid var(--line); padding: 6px 8px; width: 358px; }
  .chart svg { display: block; }
  .chart .axis { font-size: 10px; fill: var(--muted); }
  .usage-row .who { cursor: pointer; text-decoration: underline dotted; }
  .generation h3 { margin: 12px 0 4px; }
  .nodes { display: flex; flex-wrap: wrap; gap: 4px; }
  .node { background: #fff; border: 1px solid var(--line); padding: 3px; }
  .node .name { font-size: 10px; color: var(--muted); max-width: 120px; overflow: hidden; white-space: nowrap; }
  .node.stale { opacity: .6; }
  .cells { display: flex; flex-wrap: wrap; gap: 2px; max-width: 120px; }
  .cell { width: 12px; height: 12px; border-radius: 2px; background: var(--idle); }
  .gpu-box { display: flex; flex-wrap: wrap; gap: 1px; width: 12px; height: 12px; }
  .gpu-box .cell { width: 5px; height: 5px; border-radius: 1px; }
  .cell.allocated { background: var(--used); } .cell.allocated.others { background: #94a3b8; }
  .cell.throttled { background: var(--borrowed); } .cell.unhealthy { background: #b91c1c; }
  .cell.stale { background: #e5e7eb; }
  #nodes.small .node { padding: 1px; } #nodes.small .node .name { display: none; }
  #nodes.small .cells { gap: 1px; max-width: 28px; }
  #nodes.small .cell, #nodes.small .gpu-box { width: 6px; height: 6px; }
  #nodes.small .gpu-box .cell { width: 2px; height: 2px; }
  #status.live::before { content: "\u25cf "; color: #16a34a; }
</style>
</head>
<body>
<header><h1>claim-broker usage</h1><div id="status">not loaded</div></header>
<main>
  <form id="login" hidden>
    <label for="token">Viewer token (from <code>claimbroker token create --role viewer</code>)</label>
    <input id="token" type="password" autocomplete="off" required>
    <button type="submit">Show usage</button>
    <p id="login-error" class="error"></p>
  </form>
  <div id="data" hidden>
    <section class="panel" id="panel-history">
    <h2>Fleet over time</h2>
    <div class="controls"><span id="windows"></span><select id="history-tenant" aria-label="whose usage">
      <option value="">whole fleet</option></select></div>
    <div class="legend" id="history-legend"></div>
    <div id="history" class="charts"></div>
    </section>
    <section class="panel" id="panel-usage">
    <h2>Usage by flavor</h2>
    <div class="legend"><span><i class="swatch" style="background:var(--used)"></i>used within nominal</span>
      <span><i class="swatch" style="background:var(--borrowed)"></i>borrowed</span>
      <span><i class="swatch" style="background:var(--nominal)"></i>nominal quota</span>
      <span>a tenant's name shows its usage over time</span></div>
    <div id="usage"></div>
    </section>
    <section class="panel" id="panel-nodes">
    <h2>Node map</h2>
    <div class="legend"><span><i class="swatch" style="background:var(--used)"></i>allocated</span>
      <span><i class="swatch" style="background:#94a3b8"></i>allocated to another tenant</span>
      <span><i class="swatch" style="background:var(--idle)"></i>idle</span>
      <span><i class="swatch" style="background:var(--borrowed)"></i>throttled</span>
      <span><i class="swatch" style="background:#b91c1c"></i>unhealthy</span>
      <span><i class="swatch" style="background:#e5e7eb"></i>stale inventory</span>
      <span>small squares: MIG slices inside their GPU; hover for temperature and throttle reasons</span></div>
    <div id="nodes"></div>
    </section>
    <section class="panel" id="panel-waiting">
    <h2>Waiting, by tenant and reason</h2>
    <div id="pending-demand" class="numbers"></div>
    <table><thead><tr><th>tenant</th><th>claims</th><th>devices</th><th>oldest wait</th><th>reason</th></tr></thead>
      <tbody id="pending"></tbody></table>
    <h3>Waits per tenant</h3>
    <table><thead><tr><th>tenant</th><th>waiting</th><th>p50</th><th>p90</th><th>max</th>
      <th>past its pendingAlertAfter</th></tr></thead><tbody id="waits"></tbody></table>
    <h3 id="admitted-title">Waited before admission, per tenant and flavor</h3>
    <table><thead><tr><th>tenant</th><th>flavor</th><th>admitted</th><th>p50</th><th>p90</th><th>max</th></tr></thead>
      <tbody id="admitted"></tbody></table>
    </section>
    <section class="panel" id="panel-alerts">
    <h2>Alerts (open first)</h2>
    <table><thead><tr><th>last seen</th><th>severity</th><th>kind</th><th>summary</th><th>count</th></tr></thead>
      <tbody id="alerts"></tbody></table>
    </section>
  </div>
</main>
<script>
"use strict";
const POLL_MS = 5000;        // without the live stream
const FULL_MS = 60000;       // with it: everything again once a minute (stale inventory is a matter of time)
const SOON_MS = 500;         // events coalesce: a panel is fetched at most this often, or 4 times as long as
                             // its last fetch took (the API may share its process with the allocator)
const HISTORY_MS = 60000;    // usage samples are a minute apart
const WINDOWS = ["hour", "day", "week"];
let token = null, timer = null, live = false, stream = null, lastFull = 0, lastHistory = 0;
let historyWindow = "hour", historyTenant = "";
const cellsByKey = new Map();    // "driver/pool/device" -> its cell on the node map
const claimKeys = new Map();     // "tenant/claim" -> device keys it holds, as far as the page knows
const soonPanels = new Set();
let soonTimer = null;
window.renderTimes = {};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "style") node.style.cssText = v; else node.setAttribute(k, String(v));
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
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
  const response = await fetch(path, {headers: {"Authorization": "Bearer " + token}});
  if (response.status === 401) throw Object.assign(new Error("the token was refused"), {auth: true});
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail; } catch (e) { /* not JSON */ }
    throw new Error(path + ": " + detail);
  }
  return response.json();
}

// --- fleet over time -------------------------------------------------------------------------

function renderHistory(history) {
  const box = document.getElementById("history");
  box.replaceChildren();
  const tenant = history.tenant;
  const layers = tenant ? [["used", "var(--used)", "used within nominal"], ["borrowed", "var(--borrowed)", "borrowed"]]
                        : [["used", "var(--used)", "used within nominal"], ["borrowed", "var(--borrowed)", "borrowed"],
                           ["idle", "var(--idle)", "idle"]];
  const legend = document.getElementById("history-legend");
  legend.replaceChildren(...layers.map(([, color, label]) =>
    el("span", {}, el("i", {class: "swatch", style: `background:${color}`}), label)));
  if (tenant) legend.append(el("span", {}, el("i", {class: "swatch", style: "background:var(--nominal)"}),
                               `${tenant}'s nominal quota`));
  if (tenant && !historyTenant) {  // a tenant-scoped token: the API answers with its own tenant only
    const select = document.getElementById("history-tenant");
    select.options[0].hidden = true;
    select.options[0].textContent = tenant;
  }
  const W = 340, H = 110, PAD = 18;
  for (const f of history.flavors) {
    const points = f.points, n = points.length;
    const top = p => layers.reduce((sum, [k]) => sum + (p[k] || 0), 0);
    const scale = Math.max(1, ...points.map(p => Math.max(top(p), tenant ? (p.nominal || 0) : 0)));
    const x = i => (n > 1 ? i / (n - 1) : 0) * W;
    const y = v => PAD + (H - PAD) * (1 - v / scale);
    const line = (run, value) =>
      run.map((i, j) => `${j ? "L" : "M"}${x(i).toFixed(1)},${y(value(j)).toFixed(1)}`).join("");
    const chart = svg("svg", {width: W, height: H + 14, viewBox: `0 0 ${W} ${H + 14}`, role: "img",
                              "aria-label": `${f.flavor} devices over the last ${history.window}`});
    let runs = [], run = [];  // stretches with samples; a gap is left blank, not drawn as zero
    points.forEach((p, i) => { if (p.used === null) { if (run.length) runs.push(run); run = []; } else run.push(i); });
    if (run.length) runs.push(run);
    for (const r of runs) {
      let below = r.map(() => 0);
      for (const [k, color] of layers) {
        const above = r.map((i, j) => below[j] + (points[i][k] || 0));
        const path = line(r, j => above[j]) + "L" +
          line(r.slice().reverse(), j => below[r.length - 1 - j]).slice(1) + "Z";
        chart.append(svg("path", {d: r.length > 1 ? path : `M${x(r[0])},${y(above[0])}h2V${y(below[0])}h-2Z`,
                                  fill: color, class: `layer layer-${k}`}));
        below = above;
      }
      if (tenant) {
        chart.append(svg("path", {d: line(r, j => points[r[j]].nominal || 0), stroke: "var(--nominal)",
                                  fill: "none", "stroke-width": 1.5, class: "nominal-line"}));
      }
    }
    const label = (t, anchor, xx, yy) => {
      const text = svg("text", {x: xx, y: yy, class: "axis", "text-anchor": anchor});
      text.textContent = t;
      return text;
    };
    const first = new Date(points[0].at * 1000), last = new Date(points[n - 1].at * 1000);
    const clock = {hour: "2-digit", minute: "2-digit"};
    const when = d => history.window === "hour" ? d.toLocaleTimeString([], clock)
                                                : d.toLocaleString([], {weekday: "short", ...clock});
    const units = f.unitsPerDevice ? ` (${+(scale * f.unitsPerDevice).toFixed(1)} GPU units)` : "";
    chart.append(label(`${Math.round(scale)} devices${units}`, "start", 0, 10), label(when(first), "start", 0, H + 12),
                 label(when(last), "end", W, H + 12));
    const latest = [...points].reverse().find(p => p.used !== null);
    const now = latest ? `at ${new Date(latest.at * 1000).toLocaleTimeString([], clock)}: ` +
      layers.map(([k, , l]) => `${l} ${(latest[k] || 0).toFixed(1)}`).join(", ") : "no samples yet";
    box.append(el("div", {class: "chart", "data-flavor": f.flavor, "data-runs": runs.length},
                  el("div", {class: "numbers"}, el("b", {}, f.flavor), " · " + now), chart));
  }
  if (!history.flavors.length) box.append(el("p", {class: "empty"},
    "no usage samples yet: the notifier writes one a minute once flavors and quotas are set"));
}

async function loadHistory() {
  const query = `/v1/usage/history?window=${historyWindow}` +
                (historyTenant ? `&tenant=${encodeURIComponent(historyTenant)}` : "");
  const history = await get(query);
  timed("history", () => renderHistory(history));
  lastHistory = Date.now();
}

function showHistory(window_, tenant) {
  if (window_ !== undefined) historyWindow = window_;
  if (tenant !== undefined) historyTenant = tenant;
  for (const b of document.querySelectorAll("#windows button")) {
    b.classList.toggle("on", b.dataset.window === historyWindow);
  }
  document.getElementById("history-tenant").value = historyTenant;
  loadHistory().catch(failed);
  soon("waiting");  // its waits before admission follow the window
}

// --- usage against quota -----------------------------------------------------------------------

function renderUsage(usage) {
  const box = document.getElementById("usage");
  box.replaceChildren();
  const byFlavor = new Map();
  for (const row of usage.items) {
    const key = row.flavor === null ? "(no flavor)" : row.flavor;
    if (!byFlavor.has(key)) byFlavor.set(key, []);
    byFlavor.get(key).push(row);
  }
  if (byFlavor.size === 0) box.append(el("p", {class: "empty"}, "no quotas and no devices in use"));
  if (!usage.enforced) box.append(el("p", {class: "empty"}, "no quota is set: the fleet is open to every tenant"));
  for (const [flavor, rows] of byFlavor) {
    const section = el("section", {class: "flavor", "data-flavor": flavor}, el("h3", {}, flavor));
    const scale = Math.max(1, ...rows.map(r => Math.max(r.used, r.nominal)));
    for (const r of rows) {
      const within = Math.min(r.used, r.nominal), borrowed = r.borrowed;
      const bar = el("div", {class: "bar", title: `${r.used} used of ${r.nominal} nominal`},
        el("div", {class: "in", style: `width:${100 * within / scale}%`}),
        el("div", {class: "over", style: `left:${100 * within / scale}%;width:${100 * borrowed / scale}%`}),
        el("div", {class: "nominal", style: `left:calc(${100 * r.nominal / scale}% - 1px)`}));
      let text = `${r.used} / ${r.nominal} used`;
      if (borrowed) text += `, ${borrowed} borrowed`;
      if (r.lent) text += `, ${r.lent} lent`;
      text += ` (${r.usedUnits} GPU units)`;
      const who = el("div", {class: "who", title: `${r.tenant}'s usage over time`},
                     r.tenant + (r.cohort ? ` (${r.cohort})` : ""));
      who.addEventListener("click", () => showHistory(undefined, r.tenant));
      section.append(el("div", {class: "row usage-row", "data-tenant": r.tenant, "data-flavor": flavor,
                                "data-used": r.used, "data-nominal": r.nominal, "data-borrowed": borrowed,
                                "data-lent": r.lent}, who, bar, el("div", {class: "numbers"}, text)));
    }
    box.append(section);
  }
  const select = document.getElementById("history-tenant");
  const tenants = [...new Set(usage.items.map(r => r.tenant))].sort();
  const have = [...select.options].slice(1).map(o => o.value);
  if (tenants.join("\\n") !== have.join("\\n")) {
    select.replaceChildren(el("option", {value: ""}, "whole fleet"), ...tenants.map(t => el("option", {value: t}, t)));
    select.value = historyTenant;
  }
}

// --- node map ----------------------------------------------------------------------------------

function cellTitle(node, d) {
  let text = `${node} ${d.name}${d.model ? " (" + d.model + ")" : ""}: ${d.state}`;
  if (d.state === "allocated") text += d.tenant ? ` to ${d.tenant} (${d.claim})` : " (another tenant)";
  if (d.temperatureC !== null && d.temperatureC !== undefined) text += `; ${d.temperatureC} °C`;
  if (d.throttleReasons && d.throttleReasons.length) text += `; throttle reasons: ${d.throttleReasons.join(", ")}`;
  return text;
}

function cellFor(node, d) {
  const classes = ["cell", d.kind === "mig" ? "mig" : "gpu", d.state];
  if (d.state === "allocated" && !d.tenant) classes.push("others");
  const key = `${d.driver}/${d.pool}/${d.name}`;
  const cell = el("div", {class: classes.join(" "), "data-node": node, "data-device": d.name, "data-key": key,
                          "data-state": d.state, "data-tenant": d.tenant || "", title: cellTitle(node, d)});
  cellsByKey.set(key, cell);
  if (d.tenant && d.claim) {
    const claim = `${d.tenant}/${d.claim}`;
    if (!claimKeys.has(claim)) claimKeys.set(claim, new Set());
    claimKeys.get(claim).add(key);
  }
  return cell;
}

function renderNodes(nodes) {  // grouped by generation; a cell per GPU, its MIG slices inside it; nodes wrap
  const box = document.getElementById("nodes");
  box.replaceChildren();
  cellsByKey.clear(); claimKeys.clear();
  const devices = nodes.reduce((sum, n) => sum + n.devices.length, 0);
  box.classList.toggle("small", devices > 1500);  // a thousand 8-GPU nodes fit a screen or two
  let section = null, generation = null;
  for (const n of nodes) {
    if (n.generation !== generation) {
      generation = n.generation;
      const inGeneration = nodes.filter(m => m.generation === generation);
      const counts = {};
      for (const m of inGeneration) for (const d of m.devices) counts[d.state] = (counts[d.state] || 0) + 1;
      const summary = Object.entries(counts).map(([state, count]) => `${count} ${state}`).join(", ");
      section = el("div", {class: "nodes"});
      box.append(el("section", {class: "generation", "data-generation": generation},
        el("h3", {}, `${generation}: ${inGeneration.length} node${inGeneration.length === 1 ? "" : "s"}, ${summary}`),
        section));
    }
    const cells = el("div", {class: "cells"});
    const boxes = new Map();  // GPU name -> the box its MIG slices go in
    for (const d of n.devices.filter(d => d.kind === "mig")) {
      if (!boxes.has(d.parent)) boxes.set(d.parent, el("div", {class: "gpu-box", title: `${n.node} ${d.parent}: MIG`}));
      boxes.get(d.parent).append(cellFor(n.node, d));
    }
    for (const d of n.devices) {
      if (d.kind === "mig") continue;
      cells.append(cellFor(n.node, d));
      if (boxes.has(d.name)) { cells.append(boxes.get(d.name)); boxes.delete(d.name); }
    }
    for (const orphan of boxes.values()) cells.append(orphan);  // slices whose GPU is not listed
    section.append(el("div", {class: "node" + (n.stale ? " stale" : ""), "data-node": n.node, title: n.node},
                      el("div", {class: "name"}, n.node), cells));
  }
  if (!nodes.length) box.append(el("p", {class: "empty"}, "no inventory yet"));
}

function setCell(key, state, tenant, claim) {
  const cell = cellsByKey.get(key);
  if (!cell) return;
  cell.dataset.state = state;
  cell.dataset.tenant = tenant || "";
  cell.className = `cell ${cell.classList.contains("mig") ? "mig" : "gpu"} ${state}` +
                   (state === "allocated" && !tenant ? " others" : "");
  cell.title = `${cell.dataset.node} ${cell.dataset.device}: ${state}` +
               (state === "allocated" ? (tenant ? ` to ${tenant} (${claim})` : " (another tenant)") : "");
}

function applyStatus(event) {  // the node map follows a claim's devices as its status arrives
  // Returns whether the map must be fetched again: a freed device's own state (idle, throttled, unhealthy)
  // is the server's to say, and another tenant's released claim names no devices.
  const claim = event.tenant ? `${event.tenant}/${event.claim}` : null;
  let freed = event.state === "Released" || event.state === "Preempted";
  if (event.state === "Allocated") {
    for (const d of event.devices) setCell(`${d.driver}/${d.pool}/${d.device}`, "allocated", event.tenant, event.claim);
    if (claim) claimKeys.set(claim, new Set(event.devices.map(d => `${d.driver}/${d.pool}/${d.device}`)));
  } else if (claim && claimKeys.has(claim)) {
    for (const key of claimKeys.get(claim)) setCell(key, "idle");
    claimKeys.delete(claim);
    freed = true;
  }
  window.lastStatusApplied = {claim, state: event.state, at: Date.now()};
  return freed;
}

// --- waiting and alerts --------------------------------------------------------------------------

function duration(seconds) {
  if (seconds < 90) return `${Math.round(seconds)}s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)}m`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)}h`;
  return `${(seconds / 86400).toFixed(1)}d`;
}

async function showClaims(row, group) {  // a group's claims, fetched when it is opened
  if (row.dataset.loaded) return;
  row.dataset.loaded = "1";
  const page = await get(`/v1/claims?state=Pending&namespace=${encodeURIComponent(group.tenant)}&limit=200`);
  const names = page.items.filter(c => (c.reason || "not decided yet") === group.reason).map(c => c.name);
  row.querySelector(".claims").textContent = names.join(", ") + (page.next ? " ..." : "");
}

function renderPending(waiting, usage) {
  const body = document.getElementById("pending");
  body.replaceChildren();
  for (const g of waiting.groups) {
    const details = el("details", {}, el("summary", {class: "reason"}, g.reason), el("div", {class: "claims numbers"}));
    const row = el("tr", {class: "waiting-group", "data-tenant": g.tenant, "data-claims": g.claims,
                         "data-devices": g.devices},
      el("td", {}, g.tenant), el("td", {class: "numbers"}, g.claims), el("td", {class: "numbers"}, g.devices),
      el("td", {class: "numbers", title: new Date(g.oldestSubmittedAt).toLocaleString()},
         duration(g.oldestWaitSeconds)),
      el("td", {}, details));
    details.addEventListener("toggle", () => { if (details.open) showClaims(row, g).catch(() => {}); });
    body.append(row);
  }
  if (!waiting.groups.length) body.append(el("tr", {}, el("td", {colspan: 5, class: "empty"}, "nothing waits")));
  const waits = document.getElementById("waits");
  waits.replaceChildren();
  for (const t of waiting.tenants) {
    waits.append(el("tr", {class: "tenant-waits", "data-tenant": t.tenant},
      el("td", {}, t.tenant), el("td", {class: "numbers"}, t.waiting),
      el("td", {class: "numbers"}, duration(t.p50WaitSeconds)),
      el("td", {class: "numbers"}, duration(t.p90WaitSeconds)),
      el("td", {class: "numbers"}, duration(t.maxWaitSeconds)), el("td", {class: "numbers"}, t.pastAlertAfter)));
  }
  const admitted = document.getElementById("admitted");
  admitted.replaceChildren();
  for (const a of waiting.admitted) {
    admitted.append(el("tr", {class: "admitted-waits", "data-tenant": a.tenant, "data-flavor": a.flavor || ""},
      el("td", {}, a.tenant), el("td", {}, a.flavor || "(no flavor)"), el("td", {class: "numbers"}, a.admitted),
      ...[a.p50WaitSeconds, a.p90WaitSeconds, a.maxWaitSeconds].map(v => el("td", {class: "numbers"}, duration(v)))));
  }
  if (!waiting.admitted.length) {
    const none = `nothing admitted in the last ${waiting.window}`;
    admitted.append(el("tr", {}, el("td", {colspan: 6, class: "empty"}, none)));
  }
  document.getElementById("admitted-title").textContent =
    `Waited before admission, per tenant and flavor, over the last ${waiting.window}`;
  const demand = usage.pending.map(p => `${p.tenant}: ${p.claims} claims, ${p.devices} devices`).join(" · ");
  document.getElementById("pending-demand").textContent = demand;
}

function renderAlerts(open, recent) {
  const body = document.getElementById("alerts");
  body.replaceChildren();
  const shown = new Set(open.map(a => a.key + "@" + a.lastSeen));
  const alerts = [...open, ...recent.filter(a => a.resolved && !shown.has(a.key + "@" + a.lastSeen))];
  for (const a of alerts) {
    body.append(el("tr", {class: "alert", "data-key": a.key},
      el("td", {}, new Date(a.lastSeen).toLocaleString()), el("td", {class: "sev-" + a.severity}, a.severity),
      el("td", {}, a.kind + (a.resolved ? " (resolved)" : "")), el("td", {}, a.summary), el("td", {}, a.count)));
  }
  if (!alerts.length) body.append(el("tr", {}, el("td", {colspan: 5, class: "empty"}, "no alerts")));
}

// --- fetching --------------------------------------------------------------------------------------

async function load(panels) {  // fetch what these panels show, then render them
  const want = new Set(panels);
  const jobs = {};
  if (want.has("usage") || want.has("waiting")) {
    jobs.usage = get("/v1/usage");
    jobs.waiting = get(`/v1/waiting?window=${historyWindow}`);
  }
  if (want.has("alerts")) {
    jobs.open = get("/v1/alerts?resolved=false&limit=50");
    jobs.recent = get("/v1/alerts?limit=20");
  }
  if (want.has("nodes")) jobs.nodes = get("/v1/nodes").catch(() => []);  // no fleet view in this process: no map
  const got = Object.fromEntries(await Promise.all(Object.entries(jobs).map(async ([k, p]) => [k, await p])));
  if (got.usage) {
    timed("usage", () => renderUsage(got.usage));
    timed("waiting", () => renderPending(got.waiting, got.usage));
  }
  if (got.open) timed("alerts", () => renderAlerts(got.open, got.recent));
  if (got.nodes) timed("nodes", () => renderNodes(got.nodes));
}

function showStatus() {
  const status = document.getElementById("status");
  status.textContent = `updated ${new Date().toLocaleTimeString()}, ` +
    (live ? "live" : `polling every ${POLL_MS / 1000}s`);
  status.className = live ? "live" : "";
}

function failed(error) {
  if (error.auth) { askForToken("the token was refused; paste a viewer token"); return; }
  const status = document.getElementById("status");
  status.textContent = "refresh failed: " + error.message + " (retrying)";
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
  } catch (error) { failed(error); }
}

let lastLoadMs = 0;

function soon(...panels) {
  panels.forEach(p => soonPanels.add(p));
  if (soonTimer) return;
  soonTimer = setTimeout(async () => {
    const panels = [...soonPanels];
    soonPanels.clear();
    const started = performance.now();
    await load(panels).then(showStatus, failed);
    lastLoadMs = performance.now() - started;
    soonTimer = null;
    if (soonPanels.size) soon();  // what arrived meanwhile
  }, Math.max(SOON_MS, 4 * lastLoadMs));
}

function onEvent(event) {
  if (event.type === "status") { soon("usage", "waiting", ...(applyStatus(event) ? ["nodes"] : [])); }
  else if (event.type === "inventory") soon("nodes");
  else if (event.type === "alert") soon("alerts");
  else if (event.type === "resync") refresh();
}

async function follow() {  // the live stream; returns when it ends
  const controller = new AbortController();
  stream = controller;
  const response = await fetch("/v1/events", {headers: {"Authorization": "Bearer " + token},
                                               signal: controller.signal});
  if (response.status === 401) throw Object.assign(new Error("the token was refused"), {auth: true});
  if (response.status === 503) {  // no bus in this API process: polling it is, asking again now and then
    await new Promise(resolve => setTimeout(resolve, 6 * POLL_MS));
    return;
  }
  if (!response.ok || !response.body) return;
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, {stream: true});
    let cut;
    while ((cut = buffer.indexOf("\\n\\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let kind = "message", data = "";
      for (const line of block.split("\\n")) {
        if (line.startsWith("event:")) kind = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trim();
      }
      if (kind === "hello") { live = true; showStatus(); refresh(); }
      else if (kind === "bye") return;
      else if (data) onEvent(JSON.parse(data));
    }
  }
}

async function keepFollowing() {
  const mine = token;
  while (token === mine && token) {
    try { await follow(); } catch (error) { if (error.auth) { failed(error); return; } }
    if (live) { live = false; showStatus(); }
    await new Promise(resolve => setTimeout(resolve, POLL_MS));  // polling covers the gap; then try again
  }
}

function askForToken(message) {
  clearInterval(timer); timer = null; token = null; live = false;
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
  timer = setInterval(() => { if (!live || Date.now() - lastFull >= FULL_MS) refresh(); }, POLL_MS);
  keepFollowing();
}

document.getElementById("windows").append(...WINDOWS.map(w => {
  const button = el("button", {type: "button", "data-window": w, class: w === historyWindow ? "on" : ""}, w);
  button.addEventListener("click", () => showHistory(w));
  return button;
}));
document.getElementById("history-tenant").addEventListener("change", e => showHistory(undefined, e.target.value));
document.getElementById("login").addEventListener("submit", event => {
  event.preventDefault();
  start(document.getElementById("token").value.trim());
});

const url = new URL(window.location.href);
const fromUrl = url.searchParams.get("token");
if (fromUrl) {  // keep the token out of the address bar, history and screenshots
  url.searchParams.delete("token");
  history.replaceState(null, "", url.pathname + url.search);
}
const initial = fromUrl || sessionStorage.getItem("claimbroker-token");
if (initial) start(initial); else askForToken("");
</script>
</body>
</html>
"""
