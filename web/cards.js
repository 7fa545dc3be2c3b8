// What changes with every sample, drawn into the structure graph.js laid out: a GPU
// card's figures, memory bar, shards, sparklines and label; a collapsed node's summary;
// a node's host-RAM offload; the brackets joining a replica split across nodes.

import { onKeyActivate, setAttr, setText } from "./dom.js";
import {
  colourOf, fmtBytes, gib, gpuKey, healthOf, memoryOf, offloadOf, plannedOn, shortName,
  sparkPath, splitOf, tempLevel, throttleOf, utilLevel, GONE,
} from "./fleet.js";
import { GPU_W } from "./layout.js";
import { hooks, state } from "./state.js";

/** A card's elements, found once per layout. */
function partsOf(card) {
  const el = card.node();
  if (!el.skeinParts) {
    const q = (selector) => el.querySelector(selector);
    el.skeinParts = {
      badgeBg: q(".badge-bg"), badgeText: q(".badge-text"), memText: q(".mem-text"), memDetail: q(".mem-detail"),
      shard1: q(".shard-text"), shard2: q(".shard-text2"), util: q(".util-text"), temp: q(".temp-text"),
      power: q(".power-text"), throttle: q(".throttle-text"), sparkUtil: q(".spark.util"), sparkTemp: q(".spark.temp"),
      title: q(":scope > title"), barSig: "",
    };
  }
  return el.skeinParts;
}

/** Updates one GPU's card (a D3 selection) to what the state says. */
export function drawGpu(card, node, gpu, key) {
  if (card.empty()) return;
  const el = card.node();
  const parts = partsOf(card);
  const s = gpu.latest;
  const mem = memoryOf(node, gpu, state.instances);
  const health = healthOf(gpu);
  const util = s?.utilization_pct;
  const temp = s?.temperature_c;
  const watts = s?.power_mw != null ? Math.round(s.power_mw / 1000) : null;
  const throttle = s ? throttleOf(s.throttle_reasons) : null;
  const ring = state.history.get(key) || [];
  const selected = state.selected?.kind === "gpu" && gpuKey(state.selected.node, state.selected.index) === key;
  setAttr(el, "class", `gpu health-${health}${selected ? " selected" : ""}`);
  setAttr(el, "data-util", util ?? "");
  setAttr(el, "data-temp", temp ?? "");
  setAttr(el, "data-mem-used", mem.used);
  setAttr(el, "data-mem-total", mem.total);
  setAttr(el, "data-mem-free", mem.free);
  setAttr(el, "data-mem-reserved", mem.reserved);
  setAttr(el, "data-mem-other", mem.other);
  setAttr(el, "data-health", health);
  setAttr(el, "data-sampled-at", s ? s.unix_ms : "");
  setAttr(el, "data-util-level", utilLevel(util));
  setAttr(el, "data-temp-level", tempLevel(temp));
  setAttr(el, "data-power", watts ?? "");
  setAttr(el, "data-throttle", throttle ?? "");
  setAttr(el, "data-history", ring.length);
  setAttr(parts.badgeBg, "class", `badge-bg ${health}`);
  setText(parts.badgeText, health);
  setText(parts.memText, `${gib(mem.free)} of ${gib(mem.total)} GiB free`);
  setText(parts.memDetail, `reserved ${gib(mem.reserved)} · used ${gib(mem.used)}${mem.other ? ` · others ${gib(mem.other)}` : ""}`);
  // The bar: redrawn only when a segment changed.
  const barSig = mem.shards.map((x) => `${x.name}=${x.bytes}${x.measured ? "m" : ""}`).join(",") + `|${mem.other}|${mem.free}`;
  if (barSig !== parts.barSig) {
    parts.barSig = barSig;
    drawBar(card, mem);
  }
  // What runs here: a split names its kind, its layers here and all its GPUs, also
  // on the GPUs its plan gave it whose piece has not started yet.
  const splits = [];
  const names = [];
  const replicas = new Set();
  for (const shard of mem.shards) {
    const split = splitOf(shard.inst, state.instances);
    if (split) { splits.push(split.label(key)); replicas.add(split.replica); }
    names.push(`${shard.agents.join("+")} ${gib(shard.bytes)}`);
  }
  for (const inst of plannedOn(state.instances).get(key) || []) {
    const split = splitOf(inst, state.instances);
    if (!split || replicas.has(split.replica)) continue;
    replicas.add(split.replica);
    splits.push(split.label(key));
    names.push(`${split.agents} (starting)`);
  }
  setAttr(el, "data-split", splits.length ? splits.join(" | ") : null);
  let line1 = names.length ? names.join(" · ") : "no model placed";
  let line2 = "";
  if (splits.length === 1 && mem.shards.length === 1) {
    const label = splits[0];
    const cut = label.lastIndexOf(" · ");
    line1 = label.slice(0, cut);
    line2 = label.slice(cut + 3);
  } else if (splits.length) line2 = splits.map((l) => l.slice(l.lastIndexOf(" · ") + 3)).join("; ");
  setText(parts.shard1, line1);
  setText(parts.shard2, line2);
  setAttr(parts.util, "class", `util-text level-${utilLevel(util)}`);
  setText(parts.util, `busy ${util ?? "–"}%`);
  setAttr(parts.temp, "class", `temp-text level-${tempLevel(temp)}`);
  setText(parts.temp, `${temp ?? "–"} °C`);
  setText(parts.power, watts != null ? `${watts} W${gpu.facts.power_limit_mw ? ` / ${Math.round(gpu.facts.power_limit_mw / 1000)}` : ""}` : "– W");
  setAttr(parts.throttle, "class", `sub throttle-text${throttle ? " throttled" : ""}`);
  setText(parts.throttle, throttle ? `throttled: ${throttle}` : s ? "not throttled" : "");
  setAttr(parts.sparkUtil, "d", sparkPath(ring, "util", 0, 100, GPU_W / 2 - 12, 12));
  setAttr(parts.sparkTemp, "d", sparkPath(ring, "temp", 20, 100, GPU_W / 2 - 12, 12));
  const label = `${node.inventory.name} GPU ${gpu.facts.index}, ${shortName(gpu.facts.name)}: ${gib(mem.free)} of ${gib(mem.total)} GiB free (${gib(mem.reserved)} reserved, ${gib(mem.used)} used), busy ${util ?? "unknown"}%, ${temp ?? "unknown"} °C, ${watts ?? "unknown"} W${throttle ? `, throttled (${throttle})` : ""}, ${health}${mem.shards.length ? ", models: " + (splits.length ? splits.join(", ") : names.join(", ")) : ""}`;
  setAttr(el, "aria-label", label);
  setText(parts.title, label);
}

/** A card's memory bar: each instance's shard, others' memory, free space. */
function drawBar(card, mem) {
  const width = GPU_W - 16;
  const scale = width / Math.max(mem.total, mem.shards.reduce((a, x) => a + x.bytes, 0) + mem.other);
  const segments = [
    ...mem.shards.map((x) => ({ kind: "shard", ...x })),
    { kind: "other", bytes: mem.other, name: "other" },
    { kind: "free", bytes: mem.free, name: "free" },
  ];
  let x = 0;
  const bar = card.select(".bar");
  const rects = bar.selectAll("rect").data(segments, (d) => d.kind + d.name);
  rects.exit().remove();
  rects.enter().append("rect").attr("height", 14)
    .each(function (d) {
      const r = d3.select(this);
      if (d.kind === "shard") {
        r.attr("tabindex", 0).attr("role", "button")
          .on("click", (e) => { e.stopPropagation(); hooks.select({ kind: "instance", name: d.name }); })
          .on("keydown", onKeyActivate((e) => { e.stopPropagation(); hooks.select({ kind: "instance", name: d.name }); }));
        r.append("title");
      }
    })
    .merge(rects)
    .attr("class", (d) => d.kind)
    .attr("data-instance", (d) => (d.kind === "shard" ? d.name : null))
    .attr("data-bytes", (d) => d.bytes)
    .attr("fill", (d) => (d.kind === "shard" ? colourOf(d.inst.part_of || d.name) : null))
    .attr("aria-label", (d) => (d.kind === "shard" ? `instance ${d.name}: ${fmtBytes(d.bytes)} ${d.measured ? "measured" : "reserved"}` : null))
    .attr("x", (d) => { const at = x; x += d.bytes * scale; return at; })
    .attr("width", (d) => Math.max(0, d.bytes * scale))
    .each(function (d) {
      if (d.kind === "shard") d3.select(this).select("title").text(`${d.name} (${d.agents.join(", ")}): ${fmtBytes(d.bytes)} ${d.measured ? "measured" : "reserved"}`);
    });
}

/** A collapsed node's summary: its free memory, busiest and hottest GPU, health. */
export function drawCollapsed(group, node) {
  let total = 0, free = 0, util = 0, temp = -Infinity;
  const states = { ok: 0, degraded: 0, down: 0, left: 0, drained: 0 };
  for (const g of node.gpus) {
    const mem = memoryOf(node, g, state.instances);
    total += mem.total;
    free += mem.free;
    if (g.latest) {
      util = Math.max(util, g.latest.utilization_pct ?? 0);
      if (g.latest.temperature_c != null) temp = Math.max(temp, g.latest.temperature_c);
    }
    states[healthOf(g)]++;
  }
  const health = Object.entries(states).filter(([, n]) => n).map(([s, n]) => `${n} ${s}`).join(", ");
  group.select(".node-summary").text(`${gib(free)} of ${gib(total)} GiB free · busiest ${util}% · hottest ${temp === -Infinity ? "–" : temp + " °C"}`);
  group.select(".node-summary2").text(`GPUs: ${health}`);
}

/** Host RAM the node's instances hold (layers offloaded to the CPU). */
export function drawOffload(group, node) {
  const { bytes, parts } = offloadOf(node, state.instances);
  group.attr("data-offload", bytes || null);
  group.select(".node-offload").text(parts.length ? `host RAM offload: ${parts.join(", ")}` : "");
}

/** A bracket on the right of the node column joining the boxes of each replica
 *  split across nodes, in the replica's colour and named. `layer`: the D3 group to
 *  draw in; `boxes`: each node box's place, by node name. */
export function drawSplits(layer, boxes) {
  layer.selectAll("*").remove();
  const seen = new Set();
  let right = 0;
  for (const box of boxes.values()) right = Math.max(right, box.x + box.width);
  let lane = 0;
  for (const inst of state.instances) {
    if (GONE.has(inst.state) || inst.part_of) continue;
    const split = splitOf(inst, state.instances);
    if (!split || split.nodes.length < 2 || seen.has(split.replica)) continue;
    seen.add(split.replica);
    const joined = split.nodes.map((n) => boxes.get(n)).filter(Boolean);
    if (joined.length < 2) continue;
    const x = right + 16 + lane * 14;
    lane++;
    const ys = joined.map((b) => b.y + b.height / 2);
    let d = "";
    for (const [i, b] of joined.entries()) d += `M${b.x + b.width},${ys[i]}H${x}`;
    d += `M${x},${Math.min(...ys)}V${Math.max(...ys)}`;
    const g = layer.append("g").attr("class", "split-link").attr("data-instance", split.replica).attr("data-nodes", split.nodes.join(","));
    g.append("path").attr("d", d).attr("stroke", colourOf(split.replica));
    g.append("text").attr("class", "split-label").attr("x", x + 6).attr("y", Math.min(...ys) + 4)
      .attr("fill", colourOf(split.replica)).text(`${split.agents} split`);
    g.append("title").text(`${split.head} · ${split.where}`);
  }
}
