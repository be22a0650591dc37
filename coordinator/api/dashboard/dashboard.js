// charm dashboard: polls GET /dashboard/state once a second (docs/api.md) and draws it.
// Plain browser JavaScript, no framework, nothing fetched from elsewhere. The API key,
// when the server has one, comes from the page's #key=... fragment (never sent to the
// server as part of the URL) or from the form, and is kept in sessionStorage.
"use strict";

const POLL_MS = 1000;
const FETCH_TIMEOUT_MS = 5000;
const TIER_RGB = { V: [200, 110, 255], P: [70, 140, 255], L: [60, 200, 120], D: [240, 150, 50], "?": [140, 140, 140] };
const TIER_NAME = { V: "VRAM", P: "RAM, pinned", L: "RAM, LRU slot", D: "disk only", "?": "not reported yet" };

let apiKey = sessionStorage.getItem("charm.apiKey") || "";
let previous = null;   // the last state, for the live token rate
let liveRate = null;   // tokens sampled per second between the last two polls (running requests too)
let lastHeat = null;   // for the heat map's tooltip
const $ = (id) => document.getElementById(id);

function takeKeyFromFragment() {
  const m = /(?:^#|&)key=([^&]*)/.exec(location.hash);
  if (!m) return;
  apiKey = decodeURIComponent(m[1]);
  sessionStorage.setItem("charm.apiKey", apiKey);
  history.replaceState(null, "", location.pathname + location.search);  // out of the address bar
}

function fmtInt(n) { return Number(n).toLocaleString("en-US"); }
function fmtFixed(x, digits) { return Number(x).toFixed(digits); }
function fmtPct(x) { return (100 * x).toFixed(1) + " %"; }
function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}
function fmtDuration(s) {
  s = Math.floor(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + (s % 60) + "s";
}

function setStatus(text, ok) {
  const el = $("status");
  el.textContent = text;
  el.className = "status " + (ok ? "ok" : "bad");
}

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function tierBar(byTier, held) {
  const wrap = document.createElement("span");
  const bar = document.createElement("span");
  bar.className = "bar small";
  for (const tier of ["vram", "ram", "disk"]) {
    const n = byTier[tier] || 0;
    if (!n || !held) continue;
    const part = document.createElement("span");
    part.className = tier;
    part.style.width = (100 * n / held) + "%";
    bar.appendChild(part);
  }
  wrap.appendChild(bar);
  // "VRAM / RAM / disk" where a worker has a VRAM tier, else "RAM / disk".
  const parts = (byTier.vram ? ["vram", "ram", "disk"] : ["ram", "disk"]).map((t) => byTier[t] || 0);
  const text = Object.keys(byTier).length ? parts.join(" / ") : "–";
  wrap.appendChild(document.createTextNode(text));
  return wrap;
}

function drawWorkers(workers) {
  const body = $("workers").tBodies[0];
  body.replaceChildren();
  for (const w of workers) {
    const tr = document.createElement("tr");
    tr.dataset.worker = w.name;
    cell(tr, w.name, "name");
    cell(tr, w.address);
    cell(tr, w.state + (w.slow ? " (slow)" : ""), "state-" + w.state);
    cell(tr, fmtFixed(w.rtt_p50_ms, 2) + " / " + fmtFixed(w.rtt_p99_ms, 2));
    cell(tr, fmtInt(w.requests), "requests");
    cell(tr, fmtInt(w.failovers));
    cell(tr, "").appendChild(tierBar(w.experts_by_tier, w.experts_held));
    cell(tr, w.expert_hits + w.expert_misses ? fmtPct(w.hit_rate) : "–");
    cell(tr, fmtBytes(w.expert_bytes_read));
    cell(tr, w.last_error, "error");
    body.appendChild(tr);
  }
}

function drawTotals(s) {
  const t = s.totals, l = s.load;
  if (previous && s.uptime_s > previous.uptime_s) {
    liveRate = (l.tokens_sampled - previous.load.tokens_sampled) / (s.uptime_s - previous.uptime_s);
  }
  $("tok-live").textContent = liveRate === null ? "–" : fmtFixed(liveRate, 1);
  $("tok-decode").textContent = t.decode_tokens_per_s ? fmtFixed(t.decode_tokens_per_s, 1) : "–";
  $("ttft").textContent = t.generations ? fmtFixed(t.ttft_mean_ms, 1) + " ms" : "–";
  $("completion-tokens").textContent = fmtInt(t.completion_tokens);
  $("prompt-tokens").textContent = fmtInt(t.prompt_tokens);
  $("hit-rate").textContent = t.expert_hits + t.expert_misses ? fmtPct(t.hit_rate) : "–";
  $("bytes-read").textContent = fmtBytes(t.expert_bytes_read);
  $("queue").textContent = l.running + " / " + l.waiting;
  const total = Math.max(1, l.kv_blocks_total);
  $("kv-text").textContent = "(" + l.kv_blocks_used + " used, " + l.kv_blocks_cached + " cached prefix, of " +
                             l.kv_blocks_total + " × " + l.kv_block_tokens + " tokens)";
  const bar = $("kv-bar").children;
  bar[0].style.width = (100 * l.kv_blocks_used / total) + "%";
  bar[1].style.width = (100 * l.kv_blocks_cached / total) + "%";
  $("model").textContent = s.model;
  $("uptime").textContent = "up " + fmtDuration(s.uptime_s);
}

function heatGeometry(heat) {
  const cw = Math.max(3, Math.min(32, Math.floor(1150 / Math.max(1, heat.num_experts))));
  return { cw, ch: Math.max(6, Math.min(18, cw)), left: 44 };
}

function drawHeat(heat) {
  lastHeat = heat;
  const canvas = $("heat");
  const g = heatGeometry(heat);
  const width = g.left + heat.num_experts * g.cw, height = Math.max(1, heat.layers.length * g.ch);
  if (canvas.width !== width || canvas.height !== height) { canvas.width = width; canvas.height = height; }
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, width, height);
  const logMax = Math.log1p(heat.max_count);
  ctx.font = Math.min(11, g.ch) + "px sans-serif";
  ctx.textBaseline = "middle";
  heat.layers.forEach((layer, r) => {
    ctx.fillStyle = "#8b939d";
    if (r % Math.ceil(10 / g.ch) === 0) ctx.fillText("L" + layer.layer, 2, r * g.ch + g.ch / 2);
    for (let e = 0; e < heat.num_experts; e++) {
      const rgb = TIER_RGB[layer.tiers[e]] || TIER_RGB["?"];
      const share = logMax > 0 ? Math.log1p(layer.counts[e]) / logMax : 0;
      ctx.fillStyle = "rgba(" + rgb.join(",") + "," + (0.12 + 0.88 * share).toFixed(3) + ")";
      ctx.fillRect(g.left + e * g.cw, r * g.ch, g.cw - (g.cw > 4 ? 1 : 0), g.ch - 1);
    }
  });
  const ages = previous ? previous.workers.map((w) => w.residency_age_ms).filter((a) => a >= 0) : [];
  $("heat-note").textContent = heat.layers.length + " MoE layers × " + heat.num_experts + " experts; busiest: " +
      fmtInt(heat.max_count) + " tokens" + (ages.length ? "; residency as of " + fmtFixed(Math.max(...ages), 0) +
      " ms ago" : "");
}

function heatTip(ev) {
  if (!lastHeat) return;
  const g = heatGeometry(lastHeat);
  const rect = $("heat").getBoundingClientRect();
  const e = Math.floor((ev.clientX - rect.left - g.left) / g.cw), r = Math.floor((ev.clientY - rect.top) / g.ch);
  const layer = lastHeat.layers[r];
  if (!layer || e < 0 || e >= lastHeat.num_experts) { $("heat-tip").textContent = "\u00a0"; return; }
  $("heat-tip").textContent = "layer " + layer.layer + ", expert " + e + ": " + fmtInt(layer.counts[e]) +
      " tokens, " + TIER_NAME[layer.tiers[e]];
}

async function fetchState() {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), FETCH_TIMEOUT_MS);
  try {
    const headers = apiKey ? { Authorization: "Bearer " + apiKey } : {};
    return await fetch("/dashboard/state", { headers, cache: "no-store", signal: controller.signal });
  } finally {
    clearTimeout(timer);
  }
}

async function poll() {
  try {
    const res = await fetchState();
    if (res.status === 401) {
      $("key-form").hidden = false;
      setStatus(apiKey ? "API key refused" : "API key needed", false);
      return;  // no further polls until a key is given
    }
    if (!res.ok) throw new Error("HTTP " + res.status);
    const state = await res.json();
    drawTotals(state);
    drawWorkers(state.workers);
    previous = state;
    drawHeat(state.heat);
    setStatus("live · " + new Date().toLocaleTimeString(), true);
  } catch (err) {
    setStatus("no answer from the server (" + (err.name === "AbortError" ? "timeout" : err.message) + ")", false);
  }
  setTimeout(poll, POLL_MS);
}

$("key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  apiKey = $("key-input").value.trim();
  sessionStorage.setItem("charm.apiKey", apiKey);
  $("key-form").hidden = true;
  poll();
});
$("heat").addEventListener("mousemove", heatTip);
takeKeyFromFragment();
poll();
