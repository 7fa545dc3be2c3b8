// Skein's fleet page: the live hardware graph (nodes, GPUs, links, the model shards on
// each GPU), runs, sessions and reflex events, from one server-sent event stream
// (`GET /v1/live`). Layout by ELK, drawing by D3; ES modules, no build step
// (docs/web.md). This module wires them: each event of the stream to what it
// changes, the buttons to what they do.
//
//   dom.js       element helpers
//   fleet.js     memory, splits, levels and formats, from the API's JSON (pure)
//   layout.js    the ELK graph and the places inside a node box (pure)
//   sse.js       the server-sent event parser (pure)
//   state.js     what the page knows
//   live.js      the token, API requests, the live stream and its reconnection
//   graph.js     the graph: layout, structure, zoom, the per-frame redraw
//   cards.js     a GPU card's figures, a collapsed node, host offload, split brackets
//   panels.js    the GPU table, the tabs, a GPU's or an instance's details
//   runs.js      a step's agent loop as rows, approvals (a step's, an item's) (pure)
//   activity.js  runs (steps, agent loops, approvals to decide), sessions, reflex events
//   usage.js     the usage chart's model, users' totals, groups' rows (pure)
//   usageview.js the Usage tab: the chart, the tables, the CSV download

import { renderEvents, renderRuns, renderSessions } from "./activity.js";
import { $ } from "./dom.js";
import { gpuKey, recordSamples } from "./fleet.js";
import { fit, graphChanged, scheduleDraw, timings } from "./graph.js";
import { api, connect, listen, signIn, wireSignIn } from "./live.js";
import { renderDetails, renderTable, selectItem, showTable, wireTabs } from "./panels.js";
import { hooks, state } from "./state.js";
import { renderUsage } from "./usageview.js";

/** The benchmark (web/tests/bench.mjs) reads the layout and redraw times here. */
window.skeinTimings = timings;

hooks.select = selectItem;
hooks.details = renderDetails;
hooks.table = renderTable;
hooks.usage = () => renderUsage();

function dispatch(name, data) {
  state.lastUpdate = Date.now();
  switch (name) {
    case "hello":
      state.user = data.user;
      state.admin = data.admin;
      state.sampleIntervalMs = data.sample_interval_ms;
      $("who").textContent = `${data.user}${data.admin ? " (admin)" : ""}`;
      $("sign-out").hidden = false;
      break;
    case "graph":
      state.nodes = new Map(data.nodes.map((n) => [n.id, n]));
      for (const node of data.nodes) recordSamples(state.history, node.inventory.name, node.gpus.map((g) => [g.facts.index, g.latest]));
      state.samplesWanted = true;
      graphChanged();
      break;
    case "node":
      state.nodes.set(data.id, data);
      recordSamples(state.history, data.inventory.name, data.gpus.map((g) => [g.facts.index, g.latest]));
      graphChanged();
      break;
    case "telemetry":
      for (const update of data) applyTelemetry(update);
      break;
    case "instances":
      state.instances = data;
      state.allDirty = true;
      scheduleDraw();
      renderDetails();
      break;
    case "runs":
      state.runs = data;
      renderRuns(true);
      break;
    case "sessions":
      state.sessions = data;
      renderSessions();
      if (state.selected) renderDetails();
      break;
    case "reflexes":
      state.reflexes = data;
      renderEvents();
      break;
    case "reflex":
      state.reflexes.unshift(data);
      state.reflexes.length = Math.min(state.reflexes.length, 500);
      renderEvents();
      break;
    case "error":
      $("graph-note").textContent = `The server says: ${data.message}`;
      break;
    case "lagged":
      api("/v1/events?limit=100").then((page) => { state.reflexes = page.data; renderEvents(); }).catch(() => {});
      break;
    default:
      break;
  }
}

/** A node's new samples: its GPUs' latest values, health and drain state. */
function applyTelemetry(update) {
  const node = state.nodes.get(update.node);
  if (!node) return;
  node.last_seen_ms = update.last_seen_ms;
  node.host = update.host;
  let healthChanged = false;
  for (const g of update.gpus) {
    const gpu = node.gpus[g.index];
    if (!gpu) continue;
    if (gpu.health.state !== g.health.state || (gpu.drained || null) !== (g.drained || null)) healthChanged = true;
    gpu.latest = g.latest;
    gpu.health = g.health;
    gpu.drained = g.drained;
    state.dirty.add(gpuKey(node.inventory.name, g.index));
  }
  recordSamples(state.history, node.inventory.name, update.gpus.map((g) => [g.index, g.latest]));
  if (healthChanged || state.collapsed.has(node.id)) state.allDirty = true;
  scheduleDraw();
  const sel = state.selected;
  if (sel && sel.kind === "gpu" && sel.node === node.inventory.name) renderDetails(true);
}

// ---------------------------------------------------------------- wiring
wireSignIn();
listen(dispatch);
$("fit").addEventListener("click", fit);
$("collapse-all").addEventListener("click", () => {
  for (const n of state.nodes.values()) { state.collapsed.add(n.id); state.expanded.delete(n.id); }
  graphChanged();
});
$("expand-all").addEventListener("click", () => {
  for (const n of state.nodes.values()) { state.expanded.add(n.id); state.collapsed.delete(n.id); }
  graphChanged();
});
window.addEventListener("resize", () => { if (state.layout) fit(); });
$("view-toggle").addEventListener("click", () => showTable(!state.table));
wireTabs();

// ---------------------------------------------------------------- start
renderRuns(false);
renderSessions();
renderEvents();
if (state.token) connect();
else signIn("");
