// The fleet's figures (web/fleet.js) on real inputs: `GET /v1/graph` and
// `GET /v1/instances` of the simulated lab fleet while a Llama 3 70B replica is split
// across rtx-1 and old-1 and the lab workflow runs (fixtures/split-*.json), and while
// the same model keeps layers in old-1's host RAM (fixtures/offload-instances.json);
// then missing and stale samples.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import {
  GONE, HISTORY, PALETTE, agentsOf, clip, colourOf, fmtBytes, gib, gpuKey, healthOf, memoryOf, mergeHistory,
  nodesInOrder, offloadOf, plannedOn, ranges, recordSamples, shortName, sparkPath, splitOf, tempLevel, throttleOf,
  utilLevel,
} from "../fleet.js";

const fixture = (name) => JSON.parse(readFileSync(new URL(`fixtures/${name}`, import.meta.url), "utf8"));
const GRAPH = fixture("split-graph.json");
const INSTANCES = fixture("split-instances.json");
const OFFLOAD = fixture("offload-instances.json");
const node = (name) => GRAPH.nodes.find((n) => n.inventory.name === name);
const live = INSTANCES.filter((i) => !GONE.has(i.state));
/** The split replica: the instance with pieces on another node. */
const HEAD = live.find((i) => !i.part_of && live.some((p) => p.part_of === i.name));
const PIECES = live.filter((i) => i.part_of === HEAD.name);

test("the fixture holds a replica split across rtx-1 and old-1", () => {
  assert.ok(HEAD, "a replica with pieces");
  assert.ok(PIECES.length >= 1);
  const nodes = new Set([HEAD, ...PIECES].map((i) => i.node_name));
  assert.deepEqual([...nodes].sort(), ["old-1", "rtx-1"]);
  assert.equal(HEAD.agents.join("+"), "big");
});

test("a GPU's memory: the shards it holds, others' memory, and what is free", () => {
  let shards = 0;
  for (const n of GRAPH.nodes) {
    for (const gpu of n.gpus) {
      const mem = memoryOf(n, gpu, INSTANCES);
      assert.equal(mem.total, gpu.facts.memory_total);
      assert.equal(mem.used, gpu.latest.memory_used);
      assert.equal(mem.reserved, mem.shards.reduce((a, s) => a + s.bytes, 0));
      assert.equal(mem.free, Math.max(0, mem.total - Math.max(mem.used, mem.reserved + mem.other)));
      for (const s of mem.shards) {
        const held = s.inst.held.find(([i]) => i === gpu.facts.index);
        assert.equal(s.inst.node_name, n.inventory.name);
        assert.ok(!GONE.has(s.inst.state));
        assert.ok(s.bytes >= (held ? held[1] : 0));
        shards++;
      }
    }
  }
  assert.ok(shards >= 6, `${shards} shards`);
  // rtx-1's batch job: 18 GiB of each 4090 that no instance holds is others'.
  const rtx = node("rtx-1");
  const idle = rtx.gpus.find((g) => !memoryOf(rtx, g, INSTANCES).shards.length);
  if (idle) assert.ok(memoryOf(rtx, idle, INSTANCES).other >= 18 * 1024 ** 3);
  // Each piece's GPUs show it, named after the replica it serves.
  for (const piece of PIECES) {
    const n = node(piece.node_name);
    for (const [index, bytes] of piece.held) {
      const shard = memoryOf(n, n.gpus[index], INSTANCES).shards.find((s) => s.name === piece.name);
      assert.ok(shard.bytes >= bytes);
      assert.deepEqual(shard.agents, [`${piece.engine} of big`]);
    }
  }
});

test("a split replica: every GPU names its layers there and both machines' GPUs", () => {
  const split = splitOf(HEAD, INSTANCES);
  assert.equal(split.replica, HEAD.name);
  assert.deepEqual([...split.nodes].sort(), ["old-1", "rtx-1"]);
  assert.match(split.where, /^(rtx-1 [\d–,]+ \+ old-1 [\d–,]+|old-1 [\d–,]+ \+ rtx-1 [\d–,]+)$/);
  const devices = HEAD.placement.devices.filter((d) => d.gpu != null);
  assert.ok(devices.length >= 3);
  for (const d of devices) {
    const [a, b] = d.layers.split("..").map(Number);
    assert.equal(split.label(gpuKey(d.node, d.gpu)), `big · layers ${a}–${b - 1} · ${split.where}`);
  }
  assert.match(split.head, /^big · \d+ stages$/);
  // A piece is the same replica, with the same labels.
  for (const piece of PIECES) {
    const same = splitOf(piece, INSTANCES);
    assert.equal(same.replica, HEAD.name);
    assert.equal(same.where, split.where);
  }
  // One colour for the replica and its pieces, from the palette, the same each time.
  assert.ok(PALETTE.includes(colourOf(HEAD.name)));
  assert.equal(colourOf(HEAD.name), colourOf(PIECES[0].part_of));
  // The lab workflow's writer: two A100s in tensor parallel.
  const writer = live.find((i) => i.agents.includes("writer") && i.placement?.layout?.tensor_parallel === 2);
  if (writer) assert.equal(splitOf(writer, INSTANCES).label(gpuKey(writer.node_name, writer.gpus[0])), "writer · TP2 · a100-box 0–1");
  // A model on one GPU is no split.
  const single = live.find((i) => !i.part_of && !i.pieces?.length && i.gpus.length === 1 && (i.placement?.devices || []).filter((d) => d.gpu != null).length <= 1);
  if (single) assert.equal(splitOf(single, INSTANCES), null);
});

test("the GPUs a plan gives a replica, before its pieces start", () => {
  const planned = plannedOn(INSTANCES);
  for (const d of HEAD.placement.devices.filter((x) => x.gpu != null)) {
    assert.ok(planned.get(gpuKey(d.node, d.gpu)).includes(HEAD));
  }
  for (const list of planned.values()) for (const inst of list) assert.ok(!inst.part_of && !GONE.has(inst.state));
  assert.equal(plannedOn(INSTANCES), planned, "the same instances: the same map");
  assert.notEqual(plannedOn([...INSTANCES]), planned, "new instances: a new map");
});

test("whom an instance serves: its agents, or a piece's role and its replica's agents", () => {
  assert.deepEqual(agentsOf(HEAD, INSTANCES), HEAD.agents);
  for (const piece of PIECES) assert.deepEqual(agentsOf(piece, INSTANCES), [`${piece.engine} of big`]);
  assert.deepEqual(agentsOf(PIECES[0], []), [`${PIECES[0].engine} of ${HEAD.name}`]);
});

test("layers in a node's host RAM", () => {
  const inst = OFFLOAD.find((i) => !GONE.has(i.state) && i.placement?.devices?.some((d) => d.gpu == null));
  assert.ok(inst, "an instance with host devices");
  const host = inst.placement.devices.filter((d) => d.gpu == null && d.node === "old-1");
  const off = offloadOf(node("old-1"), OFFLOAD);
  assert.equal(off.bytes, host.reduce((a, d) => a + d.reserved, 0));
  assert.ok(off.bytes > 0);
  assert.deepEqual(off.parts, host.map((d) => `big ${fmtBytes(d.reserved)} (layers ${d.layers.replace("..", "–")})`));
  assert.deepEqual(offloadOf(node("a100-box"), OFFLOAD), { bytes: 0, parts: [] });
});

test("a GPU without a sample yet: nothing used, what Skein holds taken from its total", () => {
  const n = structuredClone(node("rtx-1"));
  for (const g of n.gpus) g.latest = null;
  for (const g of n.gpus) {
    const mem = memoryOf(n, g, INSTANCES);
    assert.equal(mem.used, 0);
    assert.equal(mem.other, 0);
    assert.equal(mem.free, Math.max(0, mem.total - mem.reserved));
  }
  const history = new Map();
  recordSamples(history, "rtx-1", n.gpus.map((g) => [g.facts.index, g.latest]));
  assert.equal(history.size, 0);
});

test("samples: stale ones skipped, each ring the newest 120, the server's merged before the stream's", () => {
  const gpu = node("a100-box").gpus[0];
  const sample = (t) => ({ ...gpu.latest, unix_ms: t });
  const history = new Map();
  const key = gpuKey("a100-box", 0);
  recordSamples(history, "a100-box", [[0, sample(1000)]]);
  recordSamples(history, "a100-box", [[0, sample(1000)], [1, null]]);
  recordSamples(history, "a100-box", [[0, sample(900)]]);
  assert.deepEqual(history.get(key).map((p) => p.t), [1000]);
  assert.deepEqual(history.get(key)[0], { t: 1000, util: gpu.latest.utilization_pct, temp: gpu.latest.temperature_c, used: gpu.latest.memory_used, power: gpu.latest.power_mw });
  for (let t = 1001; t < 1200; t++) recordSamples(history, "a100-box", [[0, sample(t)]]);
  assert.equal(history.get(key).length, HISTORY);
  assert.equal(history.get(key).at(-1).t, 1199);
  // The server's samples up to 1150 come first, then the stream's after them.
  const server = Array.from({ length: 10 }, (_, i) => ({ t: 1141 + i, util: 1, temp: 30, used: 0, power: 0 }));
  mergeHistory(history, key, server);
  const ring = history.get(key);
  assert.deepEqual(ring.map((p) => p.t), Array.from({ length: 59 }, (_, i) => 1141 + i));
  assert.equal(ring[0].util, 1);
  mergeHistory(history, "x:0", []);
  assert.deepEqual(history.get("x:0"), []);
});

test("levels, throttle reasons, health and text", () => {
  assert.deepEqual([null, 10, 60, 90].map(utilLevel), ["none", "low", "mid", "high"]);
  assert.deepEqual([undefined, 50, 75, 92].map(tempLevel), ["none", "low", "mid", "high"]);
  assert.equal(throttleOf(0), null);
  assert.equal(throttleOf(0x1), null, "idle is no throttle");
  assert.equal(throttleOf(0x20), "thermal");
  assert.equal(throttleOf(0x4 | 0x40), "thermal, power");
  assert.equal(throttleOf(0x200), "other");
  assert.equal(healthOf({ health: { state: "degraded" }, drained: null }), "degraded");
  assert.equal(healthOf({ health: { state: "ok" }, drained: "maintenance" }), "drained");
  assert.equal(ranges([5, 0, 2, 1, 1]), "0–2,5");
  assert.equal(ranges([3]), "3");
  assert.equal(gib(24 * 1024 ** 3), "24.0");
  assert.equal(fmtBytes(512 * 1024 ** 2), "512 MiB");
  assert.equal(shortName(node("rtx-1").gpus[0].facts.name), "RTX 4090");
  assert.equal(shortName(node("old-1").gpus[0].facts.name), "V100-PCIE-16GB");
  assert.equal(clip("GPU 0 · A100-SXM4-80GB", 20), "GPU 0 · A100-SXM4-8…");
  assert.deepEqual(nodesInOrder(GRAPH.nodes).map((n) => n.inventory.name), ["a100-box", "old-1", "rtx-1", "rtx-2"]);
  assert.equal(sparkPath([{ t: 0, util: 0 }, { t: 10, util: null }, { t: 20, util: 100 }], "util", 0, 100, 100, 10), "M0.0,10.0L100.0,0.0");
  assert.equal(sparkPath([{ t: 0, util: 5 }], "util", 0, 100, 100, 10), "");
});
