"""The usage page served at `/`: one self-contained HTML document (inline CSS and JS, no CDN, no build).

It asks for a viewer token (or reads `?token=`, then drops it from the address bar and keeps it in
sessionStorage), fetches /v1/usage, the queue grouped by tenant and reason (/v1/waiting; a group's
claims when it is opened), open alerts and recent ones with it, and polls every 5 seconds. Everything
from the API is inserted with textContent, never as HTML.
"""

USAGE_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>claim-broker usage</title>
<style>
  :root { --fg: #1d2330; --muted: #6b7280; --line: #e5e7eb; --used: #2563eb; --borrowed: #f59e0b;
          --nominal: #111827; --bg: #f8fafc; }
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
  #nodes { display: flex; flex-wrap: wrap; gap: 6px; }
  .node { background: #fff; border: 1px solid var(--line); padding: 4px; }
  .node .name { font-size: 11px; color: var(--muted); }
  .cells { display: flex; flex-wrap: wrap; gap: 2px; max-width: 120px; }
  .cell { width: 12px; height: 12px; border-radius: 2px; background: #d1fae5; }
  .cell.mig { width: 6px; }
  .cell.allocated { background: var(--used); } .cell.allocated.others { background: #94a3b8; }
  .cell.throttled { background: var(--borrowed); } .cell.unhealthy { background: #b91c1c; }
  .cell.stale { background: #e5e7eb; }
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
    <h2>Usage by flavor</h2>
    <div class="legend"><span><i class="swatch" style="background:var(--used)"></i>used within nominal</span>
      <span><i class="swatch" style="background:var(--borrowed)"></i>borrowed</span>
      <span><i class="swatch" style="background:var(--nominal)"></i>nominal quota</span></div>
    <div id="usage"></div>
    <h2>Node map</h2>
    <div class="legend"><span><i class="swatch" style="background:var(--used)"></i>allocated</span>
      <span><i class="swatch" style="background:#d1fae5"></i>idle</span>
      <span><i class="swatch" style="background:var(--borrowed)"></i>throttled</span>
      <span><i class="swatch" style="background:#b91c1c"></i>unhealthy</span>
      <span><i class="swatch" style="background:#e5e7eb"></i>stale inventory</span></div>
    <div id="nodes"></div>
    <h2>Waiting, by tenant and reason</h2>
    <div id="pending-demand" class="numbers"></div>
    <table><thead><tr><th>tenant</th><th>claims</th><th>devices</th><th>oldest wait</th><th>reason</th></tr></thead>
      <tbody id="pending"></tbody></table>
    <h3>Waits per tenant</h3>
    <table><thead><tr><th>tenant</th><th>waiting</th><th>p50</th><th>p90</th><th>max</th>
      <th>past its pendingAlertAfter</th></tr></thead><tbody id="waits"></tbody></table>
    <h2>Alerts (open first)</h2>
    <table><thead><tr><th>last seen</th><th>severity</th><th>kind</th><th>summary</th><th>count</th></tr></thead>
      <tbody id="alerts"></tbody></table>
  </div>
</main>
<script>
"use strict";
const REFRESH_MS = 5000;  // polling: simple, and enough for a page people glance at
let token = null, timer = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "style") node.style.cssText = v; else node.setAttribute(k, String(v));
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
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
      section.append(el("div", {class: "row usage-row", "data-tenant": r.tenant, "data-flavor": flavor,
                                "data-used": r.used, "data-nominal": r.nominal, "data-borrowed": borrowed,
                                "data-lent": r.lent},
        el("div", {}, r.tenant + (r.cohort ? ` (${r.cohort})` : "")), bar, el("div", {class: "numbers"}, text)));
    }
    box.append(section);
  }
}

function renderNodes(nodes) {  // a cell per device (a narrow one per MIG slice), nodes wrapping
  const box = document.getElementById("nodes");
  box.replaceChildren();
  for (const n of nodes) {
    const cells = el("div", {class: "cells"});
    for (const d of n.devices) {
      const holder = d.state === "allocated" ? (d.tenant ? ` to ${d.tenant} (${d.claim})` : " (another tenant)") : "";
      const classes = ["cell", d.kind === "mig" ? "mig" : "gpu", d.state];
      if (d.state === "allocated" && !d.tenant) classes.push("others");
      cells.append(el("div", {class: classes.join(" "), "data-node": n.node, "data-device": d.name,
                              "data-state": d.state, "data-tenant": d.tenant || "",
                              title: `${n.node} ${d.name}${d.model ? " (" + d.model + ")" : ""}: ` +
                                     `${d.state}${holder}`}));
    }
    box.append(el("div", {class: "node", "data-node": n.node}, el("div", {class: "name"}, n.node), cells));
  }
  if (!nodes.length) box.append(el("p", {class: "empty"}, "no inventory yet"));
}

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

async function refresh() {
  const status = document.getElementById("status");
  try {
    const [usage, waiting, open, recent] = await Promise.all([
      get("/v1/usage"), get("/v1/waiting"), get("/v1/alerts?resolved=false&limit=50"), get("/v1/alerts?limit=20")]);
    renderUsage(usage); renderPending(waiting, usage); renderAlerts(open, recent);
    renderNodes(await get("/v1/nodes").catch(() => []));  // no fleet view in this process: no map
    document.getElementById("data").hidden = false;
    document.getElementById("login").hidden = true;
    status.textContent = `updated ${new Date().toLocaleTimeString()}, polling every ${REFRESH_MS / 1000}s`;
    status.className = "";
  } catch (error) {
    if (error.auth) { askForToken("the token was refused; paste a viewer token"); return; }
    status.textContent = "refresh failed: " + error.message + " (retrying)";
    status.className = "error";
  }
}

function askForToken(message) {
  clearInterval(timer); timer = null; token = null;
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
  timer = setInterval(refresh, REFRESH_MS);
}

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
