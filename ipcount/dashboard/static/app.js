// ipcount dashboard: polls /api/top and /api/health every second and draws SVG by hand.
"use strict";
const SVG = "http://www.w3.org/2000/svg";
const state = { n: 10, selected: null, data: null };

function el(name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
const fmt = (x) => x.toLocaleString("en-US");
const utc = (ms) => new Date(ms).toISOString().slice(11, 19) + "Z";
const day = (ms) => new Date(ms).toISOString().slice(0, 10);

function clear(svg) { while (svg.firstChild) svg.removeChild(svg.firstChild); }

function drawTop(w) {
  const svg = document.getElementById("top-chart");
  const title = document.getElementById("top-title");
  clear(svg);
  const width = svg.clientWidth || 900;
  if (!w) {
    title.textContent = "Top IPs";
    svg.setAttribute("viewBox", `0 0 ${width} 40`);
    svg.setAttribute("height", 40);
    svg.appendChild(el("text", { x: 8, y: 24, class: "muted" }, "no window results yet"));
    return;
  }
  const late = w.late ? `, ${fmt(w.late)} late` : "";
  const final = w.final ? "" : " (no final result: every record came late)";
  title.textContent = `Top ${w.top.length} IPs — window ${day(w.window_start)} ` +
    `${utc(w.window_start)}–${utc(w.window_end)}: ${fmt(w.total)} requests from ${fmt(w.ips)} IPs${late}${final}`;
  const row = 26, labelW = Math.min(300, Math.max(120, 8 * Math.max(...w.top.map((r) => r.ip.length)))), numW = 130;
  const height = w.top.length * row + 8;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("height", height);
  const max = Math.max(...w.top.map((r) => r.count), 1);
  const span = Math.max(10, width - labelW - numW - 16);
  w.top.forEach((r, i) => {
    const y = 4 + i * row;
    const g = el("g", { class: "row", "data-ip": r.ip });
    g.appendChild(el("text", { x: labelW - 8, y: y + 17, "text-anchor": "end", class: "ip" }, r.ip));
    const len = (r.count / max) * span, lateLen = (r.late / max) * span;
    g.appendChild(el("rect", { class: "bar", "data-ip": r.ip, "data-count": r.count,
      x: labelW, y: y + 3, width: Math.max(1, len - lateLen), height: row - 8, rx: 2 }));
    if (r.late) g.appendChild(el("rect", { class: "bar-late", x: labelW + len - lateLen,
      y: y + 3, width: lateLen, height: row - 8 }));
    const share = (100 * r.share).toFixed(1) + "%";
    g.appendChild(el("text", { x: labelW + len + 8, y: y + 17, class: "count" },
      `${fmt(r.count)} · ${share}` + (r.late ? ` · +${fmt(r.late)} late` : "")));
    svg.appendChild(g);
  });
}

function drawSeries(windows, selected) {
  const svg = document.getElementById("series-chart");
  clear(svg);
  const width = svg.clientWidth || 900, height = 200, left = 60, bottom = 24, top = 10;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("height", height);
  const shown = windows.slice(-Math.max(10, Math.floor((width - left) / 8)));
  if (!shown.length) return;
  const max = Math.max(...shown.map((w) => w.total), 1);
  const plotH = height - bottom - top, step = (width - left - 8) / shown.length;
  svg.appendChild(el("line", { class: "axis", x1: left, x2: width - 8, y1: height - bottom, y2: height - bottom }));
  svg.appendChild(el("text", { x: left - 6, y: top + 10, "text-anchor": "end", class: "muted" }, fmt(max)));
  svg.appendChild(el("text", { x: left - 6, y: height - bottom, "text-anchor": "end", class: "muted" }, "0"));
  const every = Math.ceil(shown.length / Math.max(1, Math.floor((width - left) / 90)));
  shown.forEach((w, i) => {
    const h = (w.total / max) * plotH, lh = (w.late / max) * plotH;
    const x = left + i * step + 1, bw = Math.max(1, step - 2);
    const sel = w.window_start === selected ? " selected" : "";
    const bar = el("rect", { class: "series" + sel, "data-start": w.window_start,
      x, y: height - bottom - h, width: bw, height: Math.max(0, h - lh) });
    bar.appendChild(el("title", {}, `${utc(w.window_start)}: ${fmt(w.total)} requests (${fmt(w.late)} late)`));
    bar.addEventListener("click", () => { state.selected = w.window_start; render(); });
    svg.appendChild(bar);
    if (lh > 0) svg.appendChild(el("rect", { class: "series-late", x, y: height - bottom - lh, width: bw, height: lh }));
    if (i % every === 0) svg.appendChild(el("text", { x: x + bw / 2, y: height - 6, "text-anchor": "middle", class: "muted" }, utc(w.window_start)));
  });
}

function drawFeed(feed) {
  const box = document.getElementById("feed");
  const topics = feed.late ? `${feed.sink} + ${feed.late}` : feed.sink;
  let text = `${topics} (${feed.isolation}) · ${fmt(feed.records)} records read`;
  if (feed.caught_up_at) text += ` · up to date at ${new Date(feed.caught_up_at * 1000).toISOString().slice(11, 19)}Z`;
  // Late corrections for windows let go, and final results of the older windows of a backlog.
  if (feed.forgotten) text += ` · ${fmt(feed.forgotten)} records (final results or corrections) for windows older than the newest ${feed.keep} not shown`;
  if (feed.error) text = `${topics}: ${feed.error}`;
  box.textContent = text;
  box.className = "feed" + (feed.error ? " error" : "");
}

function tile(label, value, cls) {
  const d = document.createElement("div");
  d.className = "tile" + (cls ? " " + cls : "");
  d.innerHTML = '<div class="label"></div><div class="value"></div>';
  d.firstChild.textContent = label;
  d.lastChild.textContent = value;
  return d;
}

function drawHealth(h) {
  const box = document.getElementById("health");
  box.replaceChildren();
  if (h.status !== "ok") {
    const p = document.createElement("div");
    p.className = "note" + (h.status === "none" ? "" : " tile bad");
    p.textContent = h.message;
    box.appendChild(p);
    return;
  }
  const num = (v, d, unit) => (v === null || v === undefined ? "–" : Number(v).toFixed(d) + (unit || ""));
  box.append(
    tile("query", h.up === null ? "–" : h.up ? "up" : "down", h.up === false ? "bad" : "good"),
    tile("source lag", h.lag_records === null ? "–" : fmt(h.lag_records) + " records"),
    tile("watermark delay", num(h.watermark_delay_seconds, 1, " s")),
    tile("batch time", num(h.batch_seconds, 2, " s")),
    tile("records/s", num(h.records_per_second, 0)),
    tile("records", h.records_total === null ? "–" : fmt(h.records_total)),
    tile("late", h.late_total === null ? "–" : fmt(h.late_total)),
    tile("malformed", h.malformed_total === null ? "–" : fmt(h.malformed_total), h.malformed_total ? "bad" : ""),
  );
}

function render() {
  const d = state.data;
  if (!d) return;
  const windows = d.windows;
  let w = windows.find((x) => x.window_start === state.selected);
  if (!w) { w = windows[windows.length - 1]; }
  drawTop(w);
  drawSeries(windows, w ? w.window_start : null);
  drawFeed(d.feed);
}

function serverDown(err) {
  const box = document.getElementById("feed");
  box.textContent = `dashboard server unreachable (${err}); retrying`;
  box.className = "feed error";
}

async function getJson(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

// The two endpoints are fetched and drawn independently: a failing health read must not stop
// the top-N chart (nor the other way round).
async function poll() {
  const [top, health] = await Promise.allSettled([
    getJson(`/api/top?n=${state.n}`),
    getJson("/api/health"),
  ]);
  if (top.status === "fulfilled") {
    state.data = top.value;
    render();
  } else {
    serverDown(top.reason);
  }
  if (health.status === "fulfilled") {
    drawHealth(health.value);
  } else {
    drawHealth({ status: "unreachable", message: `job health unavailable (${health.reason}); retrying` });
  }
}

document.getElementById("n").addEventListener("change", (e) => {
  const v = parseInt(e.target.value, 10);
  if (v >= 1 && v <= 100) { state.n = v; poll(); }
});
document.getElementById("latest").addEventListener("click", () => { state.selected = null; render(); });
const fromUrl = parseInt(new URLSearchParams(location.search).get("n"), 10);
if (fromUrl >= 1 && fromUrl <= 100) { state.n = fromUrl; document.getElementById("n").value = fromUrl; }
window.addEventListener("resize", render);
poll();
setInterval(poll, 1000);
