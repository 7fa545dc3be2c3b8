// What the page shows of the fleet, computed from what the API gives (the nodes of
// `/v1/graph`, the instances of `/v1/instances`): each GPU's memory and the shards on
// it, how a replica is split, health and load levels, and the text formats. Pure: no
// DOM, no network (tests/fleet.test.mjs tests it in node).

/** Instance states that hold nothing any more. */
export const GONE = new Set(["stopped", "lost", "failed"]);

export const GiB = 1024 ** 3;
export const gib = (b) => (b / GiB).toFixed(1);
export const fmtBytes = (b) => (b >= GiB ? `${gib(b)} GiB` : `${(b / 1024 ** 2).toFixed(0)} MiB`);
export const fmtTime = (t) => (t ? new Date(t).toLocaleTimeString() : "");
export const gpuKey = (nodeName, index) => `${nodeName}:${index}`;
export const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

/** At most `n` characters: longer text ends in "…" (the card's label has it all). */
export const clip = (text, n) => (text.length > n ? text.slice(0, n - 1) + "…" : text);

export const shortName = (name) => name.replace(/^NVIDIA\s+/, "").replace(/^GeForce\s+/, "").replace(/^Tesla\s+/, "");

/** Samples kept per GPU for the sparklines (the server keeps as many). */
export const HISTORY = 120;

/** Adds the newest samples (`[index, sample]` of a node's GPUs; null: none yet) to
 *  their rings in `history` ("node:gpu" → [{t, util, temp, used, power}], oldest
 *  first): a sample no newer than the ring's last is skipped, and a ring keeps the
 *  newest `HISTORY`. */
export function recordSamples(history, nodeName, samples) {
  for (const [index, s] of samples) {
    if (!s) continue;
    const key = gpuKey(nodeName, index);
    let ring = history.get(key);
    if (!ring) history.set(key, (ring = []));
    const last = ring[ring.length - 1];
    if (last && last.t >= s.unix_ms) continue;
    ring.push({ t: s.unix_ms, util: s.utilization_pct, temp: s.temperature_c, used: s.memory_used, power: s.power_mw });
    if (ring.length > HISTORY) ring.splice(0, ring.length - HISTORY);
  }
}

/** A GPU's ring in `history`: the server's samples (`ring`, oldest first) then those
 *  the stream brought after them, the newest `HISTORY`. */
export function mergeHistory(history, key, ring) {
  const live = (history.get(key) || []).filter((p) => !ring.length || p.t > ring[ring.length - 1].t);
  history.set(key, ring.concat(live).slice(-HISTORY));
}

/** The nodes (any iterable of `/v1/graph` nodes) by name. */
export function nodesInOrder(nodes) {
  return [...nodes].sort((a, b) => a.inventory.name.localeCompare(b.inventory.name));
}

/** A colour per model instance (a piece of a replica split across nodes takes its
 *  replica's), the same on every load (from a hash of its name),
 *  from a palette of blues, cyans, magentas and browns: never the health colours
 *  (green, yellow, red, purple) nor grey. */
export const PALETTE = ["#1f5fa8", "#0e7c86", "#b0307f", "#8a5a2b", "#3d52a0", "#0b8fb3", "#7a2f8f", "#2e6f8e", "#2a7ab0", "#a23b5f", "#5b6bbf", "#00707a"];
const colours = new Map();
export function colourOf(name) {
  let colour = colours.get(name);
  if (!colour) {
    let hash = 2166136261;
    for (let i = 0; i < name.length; i++) hash = Math.imul(hash ^ name.charCodeAt(i), 16777619);
    colour = PALETTE[(hash >>> 0) % PALETTE.length];
    colours.set(name, colour);
  }
  return colour;
}

/** Whom an instance serves: its agents; for a piece of a replica split across nodes
 *  (a Ray node, an RPC server), its role and the replica's agents. */
export function agentsOf(inst, instances) {
  if (!inst.part_of) return inst.agents;
  const whole = instances.find((i) => i.name === inst.part_of);
  return [`${inst.engine} of ${whole ? whole.agents.join("+") : inst.part_of}`];
}

/** GPU indices as ranges: [0, 1, 2, 5] → "0–2,5". */
export function ranges(indices) {
  const sorted = [...new Set(indices)].sort((a, b) => a - b);
  const out = [];
  for (let i = 0; i < sorted.length; i++) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j++;
    out.push(j > i ? `${sorted[i]}–${sorted[j]}` : `${sorted[i]}`);
    i = j;
  }
  return out.join(",");
}

/** How a replica is split, for its GPUs' cards: `{kind, where, layers}` per
 *  `node:gpu` ("writer · TP2 · a100-box 0–1", "writer · layers 0–39 · rtx-1 0–3 +
 *  old-1 0–1"), or null for a model on one GPU. The replica is the instance itself or,
 *  for a piece of one split across nodes, the instance it is part of. */
export function splitOf(inst, instances) {
  const whole = inst.part_of ? instances.find((i) => i.name === inst.part_of) || inst : inst;
  const p = whole.placement;
  const devices = (p?.devices || []).filter((d) => d.gpu != null);
  const byNode = new Map();
  for (const d of devices) {
    if (!byNode.has(d.node)) byNode.set(d.node, []);
    byNode.get(d.node).push(d.gpu);
  }
  if (!byNode.size) {
    byNode.set(whole.node_name, whole.gpus);
    for (const piece of instances.filter((i) => i.part_of === whole.name)) byNode.set(piece.node_name, piece.gpus);
  }
  const count = [...byNode.values()].reduce((a, g) => a + g.length, 0);
  if (count < 2) return null;
  const tp = p?.layout?.tensor_parallel ?? 1;
  const stages = p?.layout?.pipeline_stages ?? 1;
  const where = [...byNode.entries()].map(([node, gpus]) => `${node} ${ranges(gpus)}`).join(" + ");
  const agents = whole.agents.join("+");
  const layersOn = new Map();
  for (const d of devices) {
    const [a, b] = String(d.layers).split("..").map(Number);
    layersOn.set(`${d.node}:${d.gpu}`, Number.isFinite(a) && Number.isFinite(b) && b > a ? `layers ${a}–${b - 1}` : null);
  }
  const kind = tp > 1 ? `TP${tp}` : null;
  const label = (key) => {
    const layers = stages > 1 ? layersOn.get(key) : null;
    return [agents, kind, layers, where].filter(Boolean).join(" · ");
  };
  return { replica: whole.name, agents, where, nodes: [...byNode.keys()], label, head: [agents, kind, stages > 1 ? `${stages} stages` : null].filter(Boolean).join(" · ") };
}

/** The live replicas whose plan gives them each GPU ("node:gpu" → instances),
 *  rebuilt when the instances change (a new array). */
let planned = { of: null, map: new Map() };
export function plannedOn(instances) {
  if (planned.of === instances) return planned.map;
  const map = new Map();
  for (const inst of instances) {
    if (GONE.has(inst.state) || inst.part_of || !inst.placement) continue;
    for (const d of inst.placement.devices || []) {
      if (d.gpu == null) continue;
      const key = gpuKey(d.node, d.gpu);
      if (!map.has(key)) map.set(key, []);
      map.get(key).push(inst);
    }
  }
  planned = { of: instances, map };
  return map;
}

/** The memory of a GPU as its card shows it: each instance's shard (measured once
 *  loaded, reserved before), what others use (the larger of what the agent measured
 *  as not Skein's and memory in use beyond Skein's instances), and what is free:
 *  total less the larger of memory in use and Skein's reservations plus others'. */
export function memoryOf(node, gpu, instances) {
  const total = gpu.facts.memory_total;
  const used = gpu.latest ? gpu.latest.memory_used : 0;
  const shards = [];
  let measured = 0;
  let reserved = 0;
  for (const inst of instances) {
    if (inst.node_name !== node.inventory.name || GONE.has(inst.state)) continue;
    const m = inst.measured_gpu.find(([i]) => i === gpu.facts.index);
    const held = inst.held.find(([i]) => i === gpu.facts.index);
    if (!m && !held) continue;
    const bytes = m ? Math.max(m[1], held ? held[1] : 0) : held[1];
    if (m) measured += m[1];
    reserved += bytes;
    shards.push({ name: inst.name, inst, agents: agentsOf(inst, instances), bytes, measured: !!m });
  }
  const foreign = gpu.latest?.foreign_memory;
  const other = Math.max(0, foreign ?? 0, used - measured);
  const free = Math.max(0, total - Math.max(used, reserved + other));
  return { total, used, reserved, shards, other, free };
}

/** Host RAM the node's instances hold (layers offloaded to the CPU): the bytes and a
 *  line per device ("big 12.0 GiB (layers 60–80)"). */
export function offloadOf(node, instances) {
  const parts = [];
  let bytes = 0;
  for (const inst of instances) {
    if (GONE.has(inst.state) || !inst.placement) continue;
    for (const d of inst.placement.devices || []) {
      if (d.gpu != null || d.node !== node.inventory.name || !d.reserved) continue;
      bytes += d.reserved;
      parts.push(`${inst.agents.join("+")} ${fmtBytes(d.reserved)}${d.layers ? ` (layers ${d.layers.replace("..", "–")})` : ""}`);
    }
  }
  return { bytes, parts };
}

export function healthOf(gpu) {
  if (gpu.drained) return "drained";
  return gpu.health.state;
}

/** Busy and temperature levels, as nvtop colours them. */
export const utilLevel = (u) => (u == null ? "none" : u >= 90 ? "high" : u >= 60 ? "mid" : "low");
export const tempLevel = (t) => (t == null ? "none" : t >= 85 ? "high" : t >= 75 ? "mid" : "low");

/** What throttles the GPU, from NVML's reason bits (skein_proto::throttle). */
export function throttleOf(bits) {
  if (!bits) return null;
  const why = [];
  if (bits & (0x8 | 0x20 | 0x40)) why.push("thermal");
  if (bits & (0x4 | 0x80)) why.push("power");
  if (!why.length && bits & ~0x1 & ~0x10 & ~0x2 & ~0x100) why.push("other");
  return why.length ? why.join(", ") : null;
}

/** A sparkline's SVG path: `points` ({t, util, temp, used}) over `width`, the values
 *  of `field` between `lo` and `hi` over `height`. */
export function sparkPath(points, field, lo, hi, width, height) {
  if (points.length < 2) return "";
  const t0 = points[0].t, t1 = points[points.length - 1].t || t0 + 1;
  const x = (t) => ((t - t0) / Math.max(1, t1 - t0)) * width;
  const y = (v) => height - (Math.min(hi, Math.max(lo, v)) - lo) / (hi - lo) * height;
  let d = "";
  for (const p of points) {
    if (p[field] == null) continue;
    d += (d ? "L" : "M") + x(p.t).toFixed(1) + "," + y(p[field]).toFixed(1);
  }
  return d;
}
