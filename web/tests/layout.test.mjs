// The ELK graph builder and a node box's inside (web/layout.js) on a real graph:
// `GET /v1/graph` of a simulated fleet (fixtures/graph.json: lab.yaml's 14 GPUs on
// four nodes, a100-box's four NVLinked, plus dgx.yaml's 8-GPU dgx-1), then laid out
// by the vendored elkjs itself.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

import {
  AUTO_COLLAPSE_GPUS, COLLAPSED_H, COLLAPSED_W, GPU_COLS, GPU_GAP, GPU_H, GPU_TOP, GPU_W, NODE_PAD, ROW_GAP,
  collapsedBy, elkGraph, networkLabel, nodeLayout, nvlinkGroups, pcieLabel, topologyKey,
} from "../layout.js";

const GRAPH = JSON.parse(readFileSync(new URL("fixtures/graph.json", import.meta.url), "utf8"));
const byName = (name) => GRAPH.nodes.find((n) => n.inventory.name === name);
const ELK = createRequire(import.meta.url)("../vendor/elk.bundled.js");

test("the ELK graph: the network, then each node by name, joined by its bandwidth", () => {
  const graph = elkGraph(GRAPH.nodes);
  assert.equal(graph.id, "root");
  assert.equal(graph.layoutOptions["elk.algorithm"], "layered");
  assert.deepEqual(graph.children[0], { id: "net", width: 130, height: 54 });
  const names = graph.children.slice(1).map((c) => GRAPH.nodes.find((n) => n.id === c.id).inventory.name);
  assert.deepEqual(names, ["a100-box", "dgx-1", "old-1", "rtx-1", "rtx-2"]);
  assert.deepEqual(graph.edges.map((e) => [e.sources, e.targets[0], e.labels[0].text]), [
    [["net"], byName("a100-box").id, "100 Gb/s"],
    [["net"], byName("dgx-1").id, "400 Gb/s"],
    [["net"], byName("old-1").id, "10 Gb/s"],
    [["net"], byName("rtx-1").id, "100 Gb/s"],
    [["net"], byName("rtx-2").id, "100 Gb/s"],
  ]);
  // The order of /v1/graph's nodes does not matter.
  assert.deepEqual(elkGraph([...GRAPH.nodes].reverse()), graph);
});

test("node boxes: four GPUs in a row, two in a narrower one, eight in two rows of four", () => {
  const size = (name) => {
    const child = elkGraph(GRAPH.nodes).children.find((c) => c.id === byName(name).id);
    return [child.width, child.height];
  };
  const fourWide = NODE_PAD + 4 * GPU_W + 3 * GPU_GAP + NODE_PAD + 12;
  const island = 34;
  assert.deepEqual(size("a100-box"), [fourWide, GPU_TOP + GPU_H + island + NODE_PAD]);
  assert.deepEqual(size("rtx-1"), [fourWide, GPU_TOP + GPU_H + NODE_PAD]);
  assert.deepEqual(size("old-1"), [NODE_PAD + 2 * GPU_W + GPU_GAP + NODE_PAD + 12, GPU_TOP + GPU_H + NODE_PAD]);
  assert.deepEqual(size("dgx-1"), [fourWide, GPU_TOP + 2 * GPU_H + ROW_GAP + island + NODE_PAD]);

  const dgx = nodeLayout(byName("dgx-1"));
  assert.equal(GPU_COLS, 4);
  assert.deepEqual([dgx.cols, dgx.rows], [4, 2]);
  assert.deepEqual(dgx.cards.map((c) => c.row), [0, 0, 0, 0, 1, 1, 1, 1]);
  assert.deepEqual(dgx.cards.map((c) => c.index), [0, 1, 2, 3, 4, 5, 6, 7]);
  assert.deepEqual(dgx.cards.slice(0, 4).map((c) => c.x), dgx.cards.slice(4).map((c) => c.x));
  assert.equal(dgx.cards[4].y - dgx.cards[0].y, GPU_H + ROW_GAP);
});

test("NVLink islands: one joining all four A100s and all eight H100s, none on PCIe boxes", () => {
  const [a100] = nvlinkGroups(byName("a100-box"));
  assert.deepEqual([...a100.members].sort(), [0, 1, 2, 3]);
  assert.equal(a100.gbps, 600);
  const dgx = nvlinkGroups(byName("dgx-1"));
  assert.equal(dgx.length, 1);
  assert.deepEqual([...dgx[0].members].sort(), [0, 1, 2, 3, 4, 5, 6, 7]);
  assert.equal(dgx[0].gbps, 900);
  assert.deepEqual(nvlinkGroups(byName("rtx-1")), []);
  assert.deepEqual(nvlinkGroups(byName("old-1")), []);
  // Two islands on one board, the slowest link naming each.
  const split = structuredClone(byName("a100-box"));
  split.links = [{ a: 0, b: 1, kind: "nvlink", gbytes_per_s: 600 }, { a: 2, b: 3, kind: "nvlink", gbytes_per_s: 300 }, { a: 3, b: 2, kind: "nvlink", gbytes_per_s: 600 }];
  assert.deepEqual(nvlinkGroups(split).map((g) => [[...g.members].sort(), g.gbps]), [[[0, 1], 600], [[2, 3], 300]]);
});

test("labels: the PCIe bus and the network link", () => {
  assert.equal(pcieLabel(byName("dgx-1")), "PCIe 5.0 ×16 · 63.0 GB/s");
  assert.equal(pcieLabel(byName("old-1")), "PCIe 3.0 ×16 · 15.8 GB/s");
  const noPcie = structuredClone(byName("old-1"));
  for (const g of noPcie.gpus) g.facts.pcie = null;
  assert.equal(pcieLabel(noPcie), "PCIe");
  assert.equal(networkLabel(byName("old-1")), "10 Gb/s");
  const slow = structuredClone(byName("old-1"));
  slow.inventory.host.network_bps = 1e8;
  assert.equal(networkLabel(slow), "100 Mb/s");
  slow.inventory.host.network_bps = null;
  assert.equal(networkLabel(slow), "network: speed unknown");
});

test("collapsed nodes: the user's choice, else collapsed beyond 256 GPUs; the topology key follows", () => {
  const view = { collapsed: new Set(), expanded: new Set(), gpuCount: 22 };
  const isCollapsed = collapsedBy(view);
  const rtx = byName("rtx-1");
  assert.equal(isCollapsed(rtx), false);
  const open = topologyKey(GRAPH.nodes, isCollapsed);
  view.collapsed.add(rtx.id);
  assert.equal(isCollapsed(rtx), true);
  const child = elkGraph(GRAPH.nodes, isCollapsed).children.find((c) => c.id === rtx.id);
  assert.deepEqual([child.width, child.height], [COLLAPSED_W, COLLAPSED_H]);
  assert.notEqual(topologyKey(GRAPH.nodes, isCollapsed), open);
  view.collapsed.clear();
  view.gpuCount = AUTO_COLLAPSE_GPUS + 1;
  assert.equal(isCollapsed(rtx), true);
  view.expanded.add(rtx.id);
  assert.equal(isCollapsed(rtx), false);
  assert.equal(topologyKey(GRAPH.nodes), open.replace(/\/c\//g, "/e/"));
  assert.match(open, new RegExp(`${byName("a100-box").id}/4/e/nnnnnn`));
});

test("ELK lays the graph out: the network left of every node box, the boxes as sized", async () => {
  const graph = elkGraph(GRAPH.nodes);
  const layout = await new ELK().layout(structuredClone(graph));
  const net = layout.children.find((c) => c.id === "net");
  for (const want of graph.children.slice(1)) {
    const box = layout.children.find((c) => c.id === want.id);
    assert.deepEqual([box.width, box.height], [want.width, want.height]);
    assert.ok(box.x > net.x + net.width, `${want.id} right of the network`);
  }
  const xs = new Set(layout.children.slice(1).map((c) => c.x));
  assert.equal(xs.size, 1, "the nodes in one column");
  for (const edge of layout.edges) assert.ok(edge.sections?.[0]?.startPoint, `${edge.id} routed`);
});
