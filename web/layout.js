// Where things go: the ELK graph of the fleet (the network and a box per node, sized
// by what it holds) and the places inside a node's box (GPU cards in rows of four, the
// PCIe bus, NVLink islands). Input: the nodes of `/v1/graph`. Pure: no DOM, no ELK
// itself (graph.js runs the layout; tests/layout.test.mjs tests this in node).

import { nodesInOrder } from "./fleet.js";

export const GPU_W = 232;
export const GPU_H = 150;
export const GPU_COLS = 4; // GPUs per row inside a node box
export const GPU_GAP = 14; // between cards of a row
export const ROW_GAP = 46; // between rows: room for an NVLink band and the next PCIe branch
export const NODE_PAD = 14;
export const BUS_Y = 62; // the PCIe bus label, under the node's title lines
export const GPU_TOP = BUS_Y + 22 + 26; // the first row of GPUs
export const COLLAPSED_W = 300;
export const COLLAPSED_H = 96;
export const AUTO_COLLAPSE_GPUS = 256; // beyond this, nodes open collapsed

/** Whether a node is drawn collapsed, as `view` says (`collapsed` and `expanded`: sets
 *  of node ids the user closed or opened, `gpuCount`: the fleet's GPUs; read at each
 *  call): as the user chose, else collapsed on a fleet of more than 256 GPUs. */
export function collapsedBy(view) {
  return (node) => {
    if (view.collapsed.has(node.id)) return true;
    if (view.expanded.has(node.id)) return false;
    return view.gpuCount > AUTO_COLLAPSE_GPUS;
  };
}

/** NVLink islands of a node: sets of GPU indices joined by NVLink. */
export function nvlinkGroups(node) {
  const parent = new Map(node.gpus.map((g) => [g.facts.index, g.facts.index]));
  const find = (x) => (parent.get(x) === x ? x : find(parent.get(x)));
  for (const l of node.links) if (l.kind === "nvlink") parent.set(find(l.a), find(l.b));
  const groups = new Map();
  for (const l of node.links) {
    if (l.kind !== "nvlink") continue;
    const root = find(l.a);
    if (!groups.has(root)) groups.set(root, { members: new Set(), gbps: l.gbytes_per_s });
    const g = groups.get(root);
    g.members.add(l.a);
    g.members.add(l.b);
    if (l.gbytes_per_s != null) g.gbps = Math.min(g.gbps ?? Infinity, l.gbytes_per_s);
  }
  return [...groups.values()];
}

export function pcieLabel(node) {
  const first = node.gpus.find((g) => g.facts.pcie);
  if (!first) return "PCIe";
  const [gen, width] = first.facts.pcie;
  const bw = first.pcie_gbytes_per_s;
  return `PCIe ${gen}.0 ×${width}${bw ? ` · ${bw.toFixed(1)} GB/s` : ""}`;
}

export function networkLabel(node) {
  const bps = node.inventory.host.network_bps;
  if (!bps) return "network: speed unknown";
  return bps >= 1e9 ? `${Math.round(bps / 1e9)} Gb/s` : `${Math.round(bps / 1e6)} Mb/s`;
}

/** About how wide `text` is at `px` pixels, with a margin. */
export const textWidth = (text, px = 11) => Math.ceil(text.length * px * 0.6) + 8;

/** Where a node's parts go inside its box: one PCIe bus (a label, a trunk down the
 *  left, a branch above each row, a drop to each GPU), GPUs in rows of at most
 *  `GPU_COLS`, and each NVLink island as a band under its members. */
export function nodeLayout(node) {
  const n = node.gpus.length;
  const cols = Math.max(1, Math.min(GPU_COLS, n));
  const rows = Math.max(1, Math.ceil(n / cols));
  const cards = node.gpus.map((g, i) => ({
    index: g.facts.index,
    x: NODE_PAD + (i % cols) * (GPU_W + GPU_GAP),
    y: GPU_TOP + Math.floor(i / cols) * (GPU_H + ROW_GAP),
    row: Math.floor(i / cols),
  }));
  const islands = nvlinkGroups(node);
  const width = Math.max(320, NODE_PAD + cols * GPU_W + (cols - 1) * GPU_GAP + NODE_PAD + 12);
  const height = GPU_TOP + rows * GPU_H + (rows - 1) * ROW_GAP + (islands.length ? 34 : 0) + NODE_PAD;
  return { cols, rows, cards, islands, width, height };
}

/** The ELK graph of the fleet: the network, then a box per node (by name; collapsed
 *  when `isCollapsed(node)`), each joined to the network by an edge labelled with its
 *  bandwidth. `nodes`: `/v1/graph`'s nodes, in any order. */
export function elkGraph(nodes, isCollapsed = () => false) {
  const children = [{ id: "net", width: 130, height: 54 }];
  const edges = [];
  for (const node of nodesInOrder(nodes)) {
    const label = networkLabel(node);
    edges.push({ id: `net>${node.id}`, sources: ["net"], targets: [node.id], labels: [{ text: label, width: textWidth(label), height: 16 }] });
    if (isCollapsed(node)) children.push({ id: node.id, width: COLLAPSED_W, height: COLLAPSED_H });
    else {
      const inside = nodeLayout(node);
      children.push({ id: node.id, width: inside.width, height: inside.height });
    }
  }
  return {
    id: "root",
    layoutOptions: {
      "elk.algorithm": "layered",
      "elk.direction": "RIGHT",
      "elk.spacing.nodeNode": "30",
      "elk.layered.spacing.nodeNodeBetweenLayers": "80",
      "elk.edgeRouting": "ORTHOGONAL",
      "elk.layered.considerModelOrder.strategy": "NODES_AND_EDGES",
      "elk.edgeLabels.placement": "CENTER",
      "elk.padding": "[top=40,left=20,bottom=60,right=50]",
    },
    children,
    edges,
  };
}

/** What the layout depends on, as a string: a new one means a new layout. */
export function topologyKey(nodes, isCollapsed = () => false) {
  return nodesInOrder(nodes)
    .map((n) => `${n.id}/${n.gpus.length}/${isCollapsed(n) ? "c" : "e"}/${n.links.map((l) => l.kind[0]).join("")}`)
    .join(";");
}
