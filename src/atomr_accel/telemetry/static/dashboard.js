// atomr-accel live dashboard: reads /api/events (Server-Sent Events) or polls /api/state.
// No build step and no external code: tables and SVG charts drawn from the state objects.
"use strict";

const HISTORY = 120;                       // points kept per chart line
const COLORS = ["#3b6fd4", "#d4493b", "#17803d", "#b26b00", "#7a3bd4", "#0f8c8c",
                "#c23b8f", "#5c6b00", "#444", "#e07b00", "#2a9df4", "#8c5a3b"];
const history = {};                        // library -> [{t, rate, p95}]
const panelHistory = {};                   // panel name -> {queued: [], last: stats}
const colorOf = {};
// A page opened with ?token=... (a system served with a token) sends it on with its reads.
const TOKEN = new URLSearchParams(location.search).get("token");

function api(path) {
  return TOKEN === null ? path : path + "?token=" + encodeURIComponent(TOKEN);
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

function ms(seconds) {
  return seconds === null || seconds === undefined ? "–" : (seconds * 1e3).toFixed(3);
}

function color(library) {
  if (!(library in colorOf)) colorOf[library] = COLORS[Object.keys(colorOf).length % COLORS.length];
  return colorOf[library];
}

function renderDevices(devices) {
  const body = document.querySelector("#devices tbody");
  const seen = new Set();
  for (const d of devices) {
    seen.add(d.name);
    let row = body.querySelector(`tr[data-device="${CSS.escape(d.name)}"]`);
    if (!row) {
      row = document.createElement("tr");
      row.dataset.device = d.name;
      for (const field of ["name", "backend", "host", "status", "generation", "restarts",
                           "in_flight", "queue_depth", "completed", "failed", "memory"]) {
        const cell = el("td");
        cell.dataset.field = field;
        row.appendChild(cell);
      }
      body.appendChild(row);
    }
    const cell = (f) => row.querySelector(`td[data-field="${f}"]`);
    cell("name").textContent = d.name;
    cell("backend").textContent = d.backend;
    cell("host").textContent = d.host.isolation + (d.host.pid ? " pid " + d.host.pid : "");
    cell("status").textContent = d.status;
    cell("status").className = "status-" + d.status;
    for (const f of ["generation", "restarts", "in_flight", "queue_depth", "completed", "failed"]) {
      cell(f).textContent = String(d[f]);
    }
    const mem = d.memory;
    const used = mem.used !== null ? mem.used : mem.allocated;
    const memCell = cell("memory");
    memCell.textContent = "";
    const bar = el("span", null, "bar");
    const fill = el("span");
    fill.style.width = mem.total ? Math.min(100, 100 * used / mem.total).toFixed(1) + "%" : "0";
    bar.appendChild(fill);
    memCell.appendChild(bar);
    memCell.appendChild(document.createTextNode(bytes(used) + " / " + bytes(mem.total)));
    memCell.title = "free " + bytes(mem.free) + ", held by live buffers " + bytes(mem.allocated);
  }
  for (const row of Array.from(body.rows)) {
    if (!seen.has(row.dataset.device)) row.remove();
  }
}

function renderLibraries(libraries, now) {
  const body = document.querySelector("#libraries tbody");
  body.textContent = "";
  for (const [name, lib] of Object.entries(libraries)) {
    const row = document.createElement("tr");
    row.dataset.library = name;
    for (const value of [name, lib.ops_total, lib.errors_total, lib.in_flight,
                         lib.rate_per_s.toFixed(1), ms(lib.p50_s), ms(lib.p95_s), ms(lib.p99_s)]) {
      row.appendChild(el("td", value));
    }
    body.appendChild(row);
    const points = history[name] || (history[name] = []);
    points.push({ t: now, rate: lib.rate_per_s, p95: lib.p95_s === null ? null : lib.p95_s * 1e3 });
    if (points.length > HISTORY) points.shift();
  }
}

function drawChart(svg, key) {
  const W = 600, H = 180, PAD = 24;
  svg.textContent = "";
  const ns = "http://www.w3.org/2000/svg";
  let max = 0, t0 = Infinity, t1 = -Infinity;
  for (const points of Object.values(history)) {
    for (const p of points) {
      if (p[key] !== null) max = Math.max(max, p[key]);
      t0 = Math.min(t0, p.t); t1 = Math.max(t1, p.t);
    }
  }
  const axis = document.createElementNS(ns, "line");
  axis.setAttribute("class", "axis");
  axis.setAttribute("x1", PAD); axis.setAttribute("x2", W);
  axis.setAttribute("y1", H - PAD); axis.setAttribute("y2", H - PAD);
  svg.appendChild(axis);
  const label = document.createElementNS(ns, "text");
  label.setAttribute("x", 2); label.setAttribute("y", 12);
  label.textContent = max ? max.toPrecision(3) : "0";
  svg.appendChild(label);
  if (!isFinite(t0) || max === 0) return;
  const span = Math.max(t1 - t0, 1);
  for (const [library, points] of Object.entries(history)) {
    const xy = points.filter((p) => p[key] !== null).map((p) =>
      [PAD + (W - PAD) * (p.t - t0) / span, (H - PAD) - (H - PAD - 8) * p[key] / max]);
    if (!xy.length) continue;
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", color(library));
    line.setAttribute("stroke-width", "1.5");
    line.setAttribute("points", xy.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" "));
    line.dataset.library = library;
    svg.appendChild(line);
  }
}

function renderLegend() {
  const legend = document.getElementById("legend");
  legend.textContent = "";
  for (const library of Object.keys(history)) {
    const item = el("span");
    const swatch = el("i");
    swatch.style.background = color(library);
    item.appendChild(swatch);
    item.appendChild(document.createTextNode(library));
    legend.appendChild(item);
  }
}

function figures(stats) {
  const table = document.createElement("table");
  for (const [key, value] of Object.entries(stats)) {
    const row = document.createElement("tr");
    row.appendChild(el("td", key));
    row.appendChild(el("td", typeof value === "object" && value !== null
      ? JSON.stringify(value) : value));
    table.appendChild(row);
  }
  return table;
}

function batchingPanel(box, name, stats) {
  const past = panelHistory[name] || (panelHistory[name] = { queued: [], last: null, size: null });
  if (past.last && stats.batches > past.last.batches) {
    past.size = (stats.completed + stats.failed - past.last.completed - past.last.failed) /
                (stats.batches - past.last.batches);
  }
  past.last = stats;
  past.queued.push(stats.queued);
  if (past.queued.length > HISTORY) past.queued.shift();
  const mean = stats.batches ? (stats.completed + stats.failed) / stats.batches : null;
  box.appendChild(el("p", `queue depth ${stats.queued} · running batches ${stats.running_batches}` +
    ` · batches ${stats.batches} · mean batch size ${mean === null ? "–" : mean.toFixed(2)}` +
    ` · latest batch size ${past.size === null ? "–" : past.size.toFixed(2)}`));
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 600 60");
  svg.style.height = "60px";
  const max = Math.max(1, ...past.queued);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", "#3b6fd4");
  line.setAttribute("points", past.queued.map((q, i) =>
    (600 * i / Math.max(1, HISTORY - 1)).toFixed(1) + "," + (58 - 54 * q / max).toFixed(1)).join(" "));
  svg.appendChild(line);
  box.appendChild(svg);
  box.appendChild(figures(stats));
}

function fairSharePanel(box, stats) {
  const costs = stats.completed_cost;
  const total = Object.values(costs).reduce((a, b) => a + b, 0);
  const table = document.createElement("table");
  const head = document.createElement("tr");
  for (const h of ["tenant", "share of completed cost", "queued", "in flight", "completed"]) {
    head.appendChild(el("th", h));
  }
  table.appendChild(head);
  for (const tenant of Object.keys(costs)) {
    const row = document.createElement("tr");
    row.dataset.tenant = tenant;
    row.appendChild(el("td", tenant));
    const share = total ? costs[tenant] / total : 0;
    const cell = el("td");
    const bar = el("span", null, "bar");
    const fill = el("span");
    fill.style.width = (100 * share).toFixed(1) + "%";
    bar.appendChild(fill);
    cell.appendChild(bar);
    cell.appendChild(document.createTextNode((100 * share).toFixed(1) + " %"));
    row.appendChild(cell);
    for (const key of ["queued", "in_flight", "completed"]) {
      row.appendChild(el("td", stats[key][tenant] || 0));
    }
    table.appendChild(row);
  }
  box.appendChild(table);
}

function renderPanels(panels) {
  const holder = document.getElementById("panels");
  if (!panels.length) {
    if (!holder.querySelector(".muted")) {
      holder.textContent = "";
      holder.appendChild(el("p", "no blueprint panels (add one with " +
        "system.telemetry.dashboard.add_panel(client))", "muted"));
    }
    return;
  }
  holder.textContent = "";
  for (const panel of panels) {
    const box = el("div", null, "panel");
    box.dataset.panel = panel.name;
    box.appendChild(el("h3", panel.name + (panel.kind ? " · " + panel.kind : "")));
    if (panel.error) box.appendChild(el("p", panel.error, "status-stopped"));
    else if (panel.kind === "BatchingStats") batchingPanel(box, panel.name, panel.stats);
    else if (panel.kind === "FairShareStats") fairSharePanel(box, panel.stats);
    else box.appendChild(figures(panel.stats));
    holder.appendChild(box);
  }
}

function renderSections(devices) {
  // Per-device sections (dashboard.add_device_section): one box per device and section.
  const holder = document.getElementById("device-sections");
  holder.textContent = "";
  for (const d of devices) {
    for (const [name, figuresOf] of Object.entries(d.sections || {})) {
      const box = el("div", null, "panel");
      box.dataset.device = d.name;
      box.dataset.section = name;
      box.appendChild(el("h3", d.name + " · " + name));
      box.appendChild(typeof figuresOf === "object" && figuresOf !== null
        ? figures(figuresOf) : el("p", figuresOf));
      holder.appendChild(box);
    }
  }
}

function renderEvents(events) {
  const list = document.getElementById("events");
  list.textContent = "";
  for (const e of events.slice(-50).reverse()) {
    const when = new Date(e.time * 1000).toLocaleTimeString();
    const item = el("li", `${when} ${e.kind} ${e.device || e.actor}: ${e.detail}`, "kind-" + e.kind);
    item.dataset.seq = e.seq;
    list.appendChild(item);
  }
}

function render(state) {
  document.getElementById("system").textContent = state.system;
  document.getElementById("updated").textContent =
    "updated " + new Date(state.time * 1000).toLocaleTimeString();
  renderDevices(state.devices);
  renderSections(state.devices);
  renderLibraries(state.libraries, state.time);
  drawChart(document.getElementById("rate-chart"), "rate");
  drawChart(document.getElementById("latency-chart"), "p95");
  renderLegend();
  renderPanels(state.panels);
  renderEvents(state.events);
}

function disconnected() {
  document.getElementById("updated").textContent = "disconnected, retrying…";
}

function poll() {
  fetch(api("api/state"), { cache: "no-store" })
    .then((r) => (r.ok ? r.json() : Promise.reject(new Error(r.statusText))))
    .then(render, disconnected)
    .finally(() => setTimeout(poll, 500));
}

if (typeof EventSource === "function") {
  const source = new EventSource(api("api/events"));
  source.onmessage = (message) => render(JSON.parse(message.data));
  source.onerror = disconnected;
} else {
  poll();
}
