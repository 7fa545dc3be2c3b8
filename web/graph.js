// The hardware graph: ELK lays it out (only when the topology changes), D3 draws the
// structure (node boxes, the PCIe bus, NVLink islands, network links, empty GPU cards)
// and, once per animation frame, redraws only the GPUs whose data changed (cards.js);
// zoom, panning and Fit; the fleet line in the header.

import { drawCollapsed, drawGpu, drawOffload, drawSplits } from "./cards.js";
import { $, onKeyActivate } from "./dom.js";
import { clip, gib, gpuKey, memoryOf, mergeHistory, nodesInOrder, plural, shortName } from "./fleet.js";
import {
  BUS_Y, GPU_H, GPU_W, NODE_PAD, collapsedBy, elkGraph, nodeLayout, pcieLabel, textWidth, topologyKey,
} from "./layout.js";
import { api } from "./live.js";
import { hooks, state } from "./state.js";

const TITLE_CHARS = 20; // what fits left of the health badge, at 12 px

/** How long layouts and redraws took, milliseconds, the last 500 of each (read by
 *  the benchmark, web/tests/bench.mjs, as `window.skeinTimings`). */
export const timings = { layout: [], draw: [] };
function timing(kind, started) {
  const list = timings[kind];
  list.push(performance.now() - started);
  if (list.length > 500) list.shift();
}

const svg = d3.select("#graph");
const viewport = svg.append("g").attr("class", "viewport");
/** The smallest zoom: the graph's smallest text (11 px) stays at 9 px or more; a
 *  fleet larger than the window scrolls instead of shrinking. */
const MIN_TEXT_PX = 11;
const MIN_ZOOM = Math.ceil((9 / MIN_TEXT_PX) * 1000) / 1000;
const zoom = d3.zoom().scaleExtent([MIN_ZOOM, 4])
  // The wheel scrolls (pans); Ctrl or ⌘ with the wheel zooms, as on a map.
  .filter((e) => (e.type === "wheel" ? e.ctrlKey || e.metaKey : !e.ctrlKey && !e.button))
  .on("zoom", (e) => {
    viewport.attr("transform", e.transform);
    $("graph").dataset.scale = e.transform.k.toFixed(3);
  });
svg.call(zoom).on("dblclick.zoom", null);
svg.on("wheel.pan", (e) => {
  if (e.ctrlKey || e.metaKey) return;
  e.preventDefault();
  const k = d3.zoomTransform(svg.node()).k;
  zoom.translateBy(svg, -(e.shiftKey ? e.deltaY : e.deltaX) / k, -(e.shiftKey ? 0 : e.deltaY) / k);
});
const elk = new ELK();

/** Whether a node is drawn collapsed (the user's choice, or the fleet's size). */
export const isCollapsed = collapsedBy(state);

let layoutRunning = false;
let layoutAgain = false;
let firstFit = true;

/** The nodes changed: a new layout if the topology did, else a redraw. */
export function graphChanged() {
  state.gpuCount = 0;
  for (const n of state.nodes.values()) state.gpuCount += n.gpus.length;
  updateFleetLine();
  const key = topologyKey(state.nodes.values(), isCollapsed);
  if (key !== state.topology) {
    state.topology = key;
    relayout();
  } else {
    state.allDirty = true;
    scheduleDraw();
    samplesAfterDraw();
  }
  hooks.details();
}

/** Reads every GPU's recent samples once the whole graph is drawn (so the first
 *  picture does not wait for them). */
function samplesAfterDraw() {
  if (!state.samplesWanted) return;
  state.samplesWanted = false;
  setTimeout(loadAllHistory, 0);
}

/** Every GPU's recent samples from the server (`GET /v1/graph/samples`, one
 *  request), so the sparklines start with the last minutes rather than empty. */
async function loadAllHistory() {
  try {
    const answer = await api("/v1/graph/samples");
    const at = Object.fromEntries(answer.columns.map((c, i) => [c, i]));
    for (const node of answer.nodes) {
      for (const gpu of node.gpus) {
        const key = gpuKey(node.node, gpu.index);
        const ring = gpu.samples.map((r) => ({ t: r[at.unix_ms], util: r[at.utilization_pct], temp: r[at.temperature_c], used: r[at.memory_used], power: r[at.power_mw] }));
        mergeHistory(state.history, key, ring);
      }
    }
    state.samplesLoaded = true;
    state.allDirty = true;
    scheduleDraw();
    if (state.selected?.kind === "gpu") hooks.details(true);
  } catch (error) {
    // The sparklines then start with the live samples.
  }
}

async function relayout() {
  if (layoutRunning) {
    layoutAgain = true;
    return;
  }
  layoutRunning = true;
  try {
    const started = performance.now();
    state.layout = await elk.layout(elkGraph(state.nodes.values(), isCollapsed));
    drawStructure();
    state.allDirty = true;
    drawGpus();
    boundPanning();
    timing("layout", started);
    samplesAfterDraw();
    if (firstFit && state.nodes.size) {
      firstFit = false;
      fit();
    }
  } catch (error) {
    $("graph-note").textContent = `layout failed: ${error.message}`;
  } finally {
    layoutRunning = false;
    if (layoutAgain) {
      layoutAgain = false;
      relayout();
    }
  }
}

function edgePath(edge) {
  const s = edge.sections && edge.sections[0];
  if (!s) return "";
  const pts = [s.startPoint, ...(s.bendPoints || []), s.endPoint];
  return "M" + pts.map((p) => `${p.x},${p.y}`).join("L");
}

/** The drawn node boxes by node name and GPU cards by "node:gpu" (D3 selections),
 *  so that updates find them without querying the document; `boxes`: each node
 *  box's place, for the lines that join a replica split across nodes. */
const drawn = { nodes: new Map(), gpus: new Map(), boxes: new Map(), splits: null };

/** Draws what the layout decides: node boxes, the PCIe bus, NVLink islands, links,
 *  GPU cards (empty). */
function drawStructure() {
  const layout = state.layout;
  const nodes = new Map(nodesInOrder(state.nodes.values()).map((n) => [n.id, n]));
  viewport.selectAll("*").remove();
  drawn.nodes.clear();
  drawn.gpus.clear();
  drawn.boxes.clear();
  const edgeLayer = viewport.append("g").attr("class", "edges");
  for (const e of layout.edges || []) {
    edgeLayer.append("path").attr("class", "edge network").attr("d", edgePath(e));
    for (const l of e.labels || []) {
      edgeLayer.append("text").attr("class", "edge-label").attr("x", l.x + 4).attr("y", l.y + 12).text(l.text);
    }
  }
  const net = layout.children.find((c) => c.id === "net");
  const netG = viewport.append("g").attr("class", "net").attr("transform", `translate(${net.x},${net.y})`);
  netG.append("rect").attr("width", net.width).attr("height", net.height).attr("rx", 8);
  netG.append("text").attr("x", 12).attr("y", 22).attr("class", "node-title").text("network");
  netG.append("text").attr("x", 12).attr("y", 40).attr("class", "node-sub").text(plural(nodes.size, "node"));

  for (const box of layout.children) {
    const node = nodes.get(box.id);
    if (!node) continue;
    drawn.boxes.set(node.inventory.name, box);
    const g = viewport.append("g").attr("class", "node").attr("data-node", node.inventory.name).attr("transform", `translate(${box.x},${box.y})`);
    drawn.nodes.set(node.inventory.name, g);
    g.append("rect").attr("class", `node-box${node.connected ? "" : " down"}`).attr("width", box.width).attr("height", box.height).attr("rx", 8);
    const collapsed = isCollapsed(node);
    const toggle = g.append("g").attr("class", "node-toggle").attr("role", "button").attr("tabindex", 0)
      .attr("aria-expanded", String(!collapsed))
      .attr("aria-label", `${collapsed ? "Expand" : "Collapse"} node ${node.inventory.name}`)
      .attr("transform", `translate(${box.width - 34},10)`);
    toggle.append("rect").attr("width", 24).attr("height", 24).attr("rx", 4);
    toggle.append("text").attr("x", 12).attr("y", 17).attr("text-anchor", "middle").text(collapsed ? "+" : "−");
    const flip = () => {
      if (isCollapsed(node)) { state.collapsed.delete(node.id); state.expanded.add(node.id); }
      else { state.expanded.delete(node.id); state.collapsed.add(node.id); }
      graphChanged();
    };
    toggle.on("click", flip).on("keydown", onKeyActivate(flip));
    g.append("text").attr("class", "node-title").attr("x", 14).attr("y", 22).text(node.inventory.name);
    g.append("text").attr("class", "node-sub node-line").attr("x", 14).attr("y", 38);
    g.append("text").attr("class", "node-sub node-offload").attr("x", 14).attr("y", 54);
    if (collapsed) {
      g.append("text").attr("class", "node-sub node-summary").attr("x", 14).attr("y", 58);
      g.append("text").attr("class", "node-sub node-summary2").attr("x", 14).attr("y", 76);
      continue;
    }
    drawInside(g, node, box);
  }
  drawn.splits = viewport.append("g").attr("class", "splits");
  markSelection();
}

/** An expanded node's inside: the PCIe bus, the NVLink islands, the GPU cards. */
function drawInside(g, node, box) {
  const inside = nodeLayout(node);
  const centre = (c) => c.x + GPU_W / 2;
  // One PCIe bus: its label, a trunk down the left, a branch above each row and a
  // drop to each GPU.
  const busText = pcieLabel(node);
  const trunkX = NODE_PAD + 8;
  const busTop = BUS_Y + 22;
  let bus = "";
  let lastBranch = busTop;
  for (let r = 0; r < inside.rows; r++) {
    const row = inside.cards.filter((c) => c.row === r);
    if (!row.length) continue;
    const y = row[0].y - 12;
    lastBranch = y;
    bus += `M${trunkX},${y}H${centre(row[row.length - 1])}`;
    for (const c of row) bus += `M${centre(c)},${y}V${c.y}`;
  }
  bus = `M${trunkX},${busTop}V${lastBranch}` + bus;
  g.append("path").attr("class", "edge pcie").attr("data-gpus", inside.cards.length).attr("d", bus);
  const hub = g.append("g").attr("class", "hub pcie-bus").attr("transform", `translate(${NODE_PAD},${BUS_Y})`);
  hub.append("rect").attr("width", Math.max(170, textWidth(busText) + 16)).attr("height", 22).attr("rx", 4);
  hub.append("text").attr("x", 8).attr("y", 15).text(busText);
  // Each NVLink island: a band under its members in each row, joined on the right.
  inside.islands.forEach((island, i) => {
    const members = inside.cards.filter((c) => island.members.has(c.index));
    if (!members.length) return;
    const rowsOf = [...new Set(members.map((c) => c.row))].sort((a, b) => a - b);
    const right = box.width - 10;
    let d = "";
    const bands = [];
    for (const r of rowsOf) {
      const inRow = members.filter((c) => c.row === r);
      const y = inRow[0].y + GPU_H + 12 + i * 4;
      bands.push(y);
      const end = rowsOf.length > 1 ? right : centre(inRow[inRow.length - 1]);
      d += `M${centre(inRow[0])},${y}H${end}`;
      for (const c of inRow) d += `M${centre(c)},${c.y + GPU_H}V${y}`;
    }
    if (bands.length > 1) d += `M${right},${bands[0]}V${bands[bands.length - 1]}`;
    g.append("path").attr("class", "edge nvlink").attr("data-members", [...island.members].sort((a, b) => a - b).join(",")).attr("d", d);
    const text = `NVLink${island.gbps ? ` · ${island.gbps} GB/s` : ""}`;
    const first = members.filter((c) => c.row === rowsOf[0]);
    const w = textWidth(text) + 8;
    const mid = first.length > 1 ? (centre(first[0]) + centre(first[1])) / 2 : centre(first[0]) + 20;
    const label = g.append("g").attr("class", "hub nvlink-hub").attr("transform", `translate(${mid - w / 2},${bands[0] - 9})`);
    label.append("rect").attr("width", w).attr("height", 18).attr("rx", 4);
    label.append("text").attr("x", 8).attr("y", 13).text(text);
  });
  for (const place of inside.cards) {
    const index = place.index;
    const gpu = node.gpus[index];
    const key = gpuKey(node.inventory.name, index);
    const card = g.append("g").attr("class", "gpu").attr("data-gpu", key).attr("transform", `translate(${place.x},${place.y})`);
    drawn.gpus.set(key, card);
    card.attr("tabindex", 0).attr("role", "button");
    card.append("rect").attr("class", "card").attr("width", GPU_W).attr("height", GPU_H).attr("rx", 6);
    card.append("text").attr("class", "title").attr("x", 8).attr("y", 17).text(clip(`GPU ${index} · ${shortName(gpu.facts.name)}`, TITLE_CHARS));
    const badge = card.append("g").attr("class", "badge").attr("transform", `translate(${GPU_W - 68},5)`);
    badge.append("rect").attr("class", "badge-bg").attr("width", 62).attr("height", 16).attr("rx", 8);
    badge.append("text").attr("class", "badge-text").attr("x", 31).attr("y", 12).attr("text-anchor", "middle");
    card.append("text").attr("class", "mem-text").attr("x", 8).attr("y", 36);
    card.append("text").attr("class", "sub mem-detail").attr("x", 8).attr("y", 51);
    card.append("g").attr("class", "bar").attr("transform", "translate(8,57)");
    card.append("text").attr("class", "sub shard-text").attr("x", 8).attr("y", 85);
    card.append("text").attr("class", "sub shard-text2").attr("x", 8).attr("y", 99);
    card.append("text").attr("class", "util-text").attr("x", 8).attr("y", 116);
    card.append("text").attr("class", "temp-text").attr("x", 84).attr("y", 116);
    card.append("text").attr("class", "sub power-text").attr("x", 146).attr("y", 116);
    card.append("text").attr("class", "sub throttle-text").attr("x", 8).attr("y", 130);
    card.append("path").attr("class", "spark util").attr("transform", `translate(8,${GPU_H - 14})`);
    card.append("path").attr("class", "spark temp").attr("transform", `translate(${GPU_W / 2 + 4},${GPU_H - 14})`);
    card.append("title");
    const select = () => hooks.select({ kind: "gpu", node: node.inventory.name, index });
    card.on("click", select).on("keydown", onKeyActivate(select));
  }
}

/** Free memory of the fleet, as the cards count it. */
export function updateFleetLine() {
  let gpus = 0, total = 0, free = 0, down = 0, left = 0;
  for (const n of state.nodes.values()) {
    if (n.health.state === "left") left++;
    else if (!n.connected) down++;
    for (const g of n.gpus) {
      gpus++;
      const mem = memoryOf(n, g, state.instances);
      total += mem.total;
      free += mem.free;
    }
  }
  const fleet = $("fleet");
  fleet.dataset.free = free;
  fleet.dataset.total = total;
  fleet.textContent = `${plural(state.nodes.size, "node")}${down ? ` (${down} down)` : ""}${left ? ` (${left} left)` : ""} · ${plural(gpus, "GPU")} · ${gib(free)} of ${gib(total)} GiB free`;
  $("graph-note").textContent = state.nodes.size ? "" : "No node has joined yet: start `skein agent` on a GPU server.";
}

/** Redraws the changed GPUs at the next animation frame (once, however many asked). */
export function scheduleDraw() {
  if (state.frame) return;
  state.frame = requestAnimationFrame(() => {
    state.frame = 0;
    drawGpus();
  });
}

let fleetLineAt = 0;

/** Updates the GPUs whose data changed: bars, figures, sparklines, badges. */
function drawGpus() {
  if (!state.layout) return;
  const started = performance.now();
  const all = state.allDirty;
  const dirty = state.dirty;
  state.allDirty = false;
  state.dirty = new Set();
  for (const node of state.nodes.values()) {
    const name = node.inventory.name;
    const group = drawn.nodes.get(name);
    if (!group) continue;
    if (all) {
      group.select(".node-line").text(`${plural(node.gpus.length, "GPU")} · ${node.connected ? "connected" : "disconnected"} · ${node.health.state}${node.health.reasons.length ? ": " + node.health.reasons.join("; ") : ""}`);
      drawOffload(group, node);
    }
    if (isCollapsed(node)) {
      drawCollapsed(group, node);
      continue;
    }
    for (const gpu of node.gpus) {
      const key = gpuKey(name, gpu.facts.index);
      if (!all && !dirty.has(key)) continue;
      const card = drawn.gpus.get(key);
      if (card) drawGpu(card, node, gpu, key);
    }
  }
  if (all && drawn.splits) drawSplits(drawn.splits, drawn.boxes);
  if (all || performance.now() - fleetLineAt > 1000) {
    fleetLineAt = performance.now();
    updateFleetLine();
  }
  if (state.table) hooks.table(true);
  timing("draw", started);
}

/** Keeps the graph in view: panning and scrolling stop a margin past its edges
 *  (never into empty space), whatever the zoom. */
function boundPanning() {
  const bounds = viewport.node().getBBox();
  if (!bounds.width || !bounds.height) return;
  const margin = 40;
  zoom.translateExtent([
    [bounds.x - margin, bounds.y - margin],
    [bounds.x + bounds.width + margin, bounds.y + bounds.height + margin],
  ]);
  svg.call(zoom.transform, d3.zoomTransform(svg.node()));
}

/** Shows the whole graph if it fits at the smallest zoom; otherwise its top left at
 *  that zoom, in a narrow window its first node's (scroll or drag for the rest). */
export function fit() {
  const bounds = viewport.node().getBBox();
  const box = $("graph").getBoundingClientRect();
  if (!bounds.width || !bounds.height || !box.width || !box.height) return;
  const wanted = Math.min(2, 0.95 * Math.min(box.width / bounds.width, box.height / bounds.height));
  const k = Math.max(MIN_ZOOM, wanted);
  let tx = (box.width - bounds.width * k) / 2 - bounds.x * k;
  let ty = (box.height - bounds.height * k) / 2 - bounds.y * k;
  if (bounds.width * k > box.width) {
    // Too wide: start at the left; in a narrow window (a phone) at the node boxes,
    // past the network's column, so that the GPUs are what shows first.
    let left = bounds.x;
    if (box.width < 700 && drawn.boxes.size) left = Math.min(...[...drawn.boxes.values()].map((b) => b.x)) - 6;
    tx = 8 - left * k;
  }
  if (bounds.height * k > box.height) ty = 8 - bounds.y * k;
  svg.transition().duration(0).call(zoom.transform, d3.zoomIdentity.translate(tx, ty).scale(k));
}

/** Marks the selected GPU's card. */
export function markSelection() {
  const sel = state.selected;
  viewport.selectAll("g.gpu").classed("selected", function () {
    return !!sel && sel.kind === "gpu" && this.dataset.gpu === gpuKey(sel.node, sel.index);
  });
}
