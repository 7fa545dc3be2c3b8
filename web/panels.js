// The GPU table (instead of the graph) and the side panel's tabs: the details of the
// selected GPU (its facts, charts of its recent samples, the models and sessions on
// it) or model instance (its placement and why the planner chose it).

import { sessionList } from "./activity.js";
import { $, h, kids, onKeyActivate } from "./dom.js";
import {
  GONE, agentsOf, colourOf, fmtBytes, fmtTime, gib, gpuKey, healthOf, memoryOf, mergeHistory,
  nodesInOrder, shortName, sparkPath, splitOf, tempLevel, throttleOf, utilLevel,
} from "./fleet.js";
import { fit, markSelection, scheduleDraw } from "./graph.js";
import { api } from "./live.js";
import { hooks, state } from "./state.js";

// ---------------------------------------------------------------- the GPU table
const COLUMNS = [
  { key: "name", label: "GPU", value: (r) => r.name, text: (r) => r.name },
  { key: "node", label: "node", value: (r) => r.node, text: (r) => r.node },
  { key: "model", label: "model", value: (r) => r.model, text: (r) => r.model },
  { key: "free", label: "free GiB", num: true, value: (r) => r.free, text: (r) => gib(r.free) },
  { key: "busy", label: "busy %", num: true, value: (r) => r.busy ?? -1, text: (r) => (r.busy ?? "–"), level: (r) => utilLevel(r.busy) },
  { key: "temp", label: "°C", num: true, value: (r) => r.temp ?? -1, text: (r) => (r.temp ?? "–"), level: (r) => tempLevel(r.temp) },
  { key: "power", label: "W", num: true, value: (r) => r.power ?? -1, text: (r) => (r.power ?? "–") },
  { key: "health", label: "health", value: (r) => r.health, text: (r) => r.health },
];

function tableRows() {
  const rows = [];
  for (const node of nodesInOrder(state.nodes.values())) {
    for (const gpu of node.gpus) {
      const s = gpu.latest;
      rows.push({
        key: gpuKey(node.inventory.name, gpu.facts.index),
        name: `${node.inventory.name} · ${gpu.facts.index}`,
        node: node.inventory.name,
        index: gpu.facts.index,
        model: shortName(gpu.facts.name),
        free: memoryOf(node, gpu, state.instances).free,
        busy: s?.utilization_pct ?? null,
        temp: s?.temperature_c ?? null,
        power: s?.power_mw != null ? Math.round(s.power_mw / 1000) : null,
        health: healthOf(gpu),
      });
    }
  }
  const column = COLUMNS.find((c) => c.key === state.sort.key) || COLUMNS[0];
  const dir = state.sort.descending ? -1 : 1;
  rows.sort((a, b) => {
    const x = column.value(a), y = column.value(b);
    const order = typeof x === "number" ? x - y : String(x).localeCompare(String(y), undefined, { numeric: true });
    return order * dir || a.name.localeCompare(b.name, undefined, { numeric: true });
  });
  return rows;
}

let tableTimer = 0;
/** Draws the table of every GPU (`soon`: at most twice a second, for telemetry). */
export function renderTable(soon) {
  if (soon) {
    if (!tableTimer) tableTimer = setTimeout(() => { tableTimer = 0; renderTable(); }, 500);
    return;
  }
  const pane = $("table-pane");
  if (!state.table) return;
  const head = h("tr", {}, COLUMNS.map((c) => {
    const sorted = state.sort.key === c.key;
    return h("th", { class: c.num ? "num" : null, scope: "col", "aria-sort": sorted ? (state.sort.descending ? "descending" : "ascending") : "none" },
      h("button", {
        type: "button", class: "sort", "data-sort": c.key,
        onclick: () => {
          state.sort = { key: c.key, descending: state.sort.key === c.key ? !state.sort.descending : !!c.num };
          renderTable();
          document.querySelector(`#table-pane button[data-sort="${c.key}"]`)?.focus();
        },
      }, c.label, sorted ? (state.sort.descending ? " ▼" : " ▲") : ""));
  }));
  const body = tableRows().map((r) => h("tr", {
    "data-gpu": r.key, class: `health-${r.health}`, tabindex: 0,
    onclick: () => selectItem({ kind: "gpu", node: r.node, index: r.index }),
    onkeydown: onKeyActivate(() => selectItem({ kind: "gpu", node: r.node, index: r.index })),
  }, COLUMNS.map((c) => h("td", { class: [c.num ? "num" : "", c.level ? `level-${c.level(r)}` : ""].join(" ").trim() || null, "data-col": c.key }, c.text(r)))));
  pane.replaceChildren(h("div", { class: "table-wrap" }, h("table", { id: "gpu-table", "aria-label": "Every GPU" }, h("thead", {}, head), h("tbody", {}, body))));
}

/** Shows the table (`on`) or the graph. */
export function showTable(on) {
  state.table = on;
  $("view-toggle").setAttribute("aria-pressed", String(on));
  $("view-toggle").textContent = on ? "Graph" : "Table";
  $("graph-pane").hidden = on;
  $("table-pane").hidden = !on;
  if (on) renderTable();
  else if (state.layout) fit();
}

// ---------------------------------------------------------------- side panel
const TABS = ["details", "runs", "sessions", "events", "usage"];
function showTab(name) {
  for (const t of TABS) {
    const on = t === name;
    $(`tab-${t}`).setAttribute("aria-selected", String(on));
    $(`tab-${t}`).tabIndex = on ? 0 : -1;
    $(`view-${t}`).hidden = !on;
  }
  // The usage is read when its tab is shown (it changes by the hour, not live).
  if (name === "usage") hooks.usage();
}
/** The tabs: a click shows one; the arrow keys move between them. */
export function wireTabs() {
  TABS.forEach((t, i) => {
    const tab = $(`tab-${t}`);
    tab.addEventListener("click", () => showTab(t));
    tab.addEventListener("keydown", (e) => {
      const step = e.key === "ArrowRight" ? 1 : e.key === "ArrowLeft" ? -1 : 0;
      if (!step) return;
      const next = TABS[(i + step + TABS.length) % TABS.length];
      showTab(next);
      $(`tab-${next}`).focus();
    });
  });
}

/** Selects a GPU or an instance: marked in the graph, its details shown. */
export function selectItem(item) {
  state.selected = item;
  markSelection();
  showTab("details");
  renderDetails();
  if (item.kind === "gpu") loadHistory(item.node, item.index);
}

/** The GPU's history as the server keeps it (the sparkline holds what arrived since
 *  the page opened; the server has the minutes before). */
async function loadHistory(nodeName, index) {
  try {
    const answer = await api(`/v1/graph/nodes/${encodeURIComponent(nodeName)}/gpus/${index}/samples`);
    const key = gpuKey(nodeName, index);
    const ring = answer.samples.map((s) => ({ t: s.unix_ms, util: s.utilization_pct, temp: s.temperature_c, used: s.memory_used, power: s.power_mw }));
    mergeHistory(state.history, key, ring);
    state.dirty.add(key);
    scheduleDraw();
    renderDetails(true);
  } catch (error) {
    // The details say what the stream knows; the history is a bonus.
  }
}

function findGpu(nodeName, index) {
  for (const n of state.nodes.values()) if (n.inventory.name === nodeName) return [n, n.gpus[index]];
  return [null, null];
}

function chart(points, field, lo, hi, colour, label) {
  const ns = "http://www.w3.org/2000/svg";
  const s = document.createElementNS(ns, "svg");
  s.setAttribute("class", "chart");
  s.setAttribute("viewBox", "0 0 360 64");
  s.setAttribute("preserveAspectRatio", "none");
  s.setAttribute("role", "img");
  const last = [...points].reverse().find((p) => p[field] != null);
  s.setAttribute("aria-label", `${label}: ${points.length} samples, latest ${last ? last[field] : "unknown"}`);
  const p = document.createElementNS(ns, "path");
  p.setAttribute("d", sparkPath(points, field, lo, hi, 360, 60));
  p.setAttribute("stroke", colour);
  p.setAttribute("transform", "translate(0,2)");
  s.append(p);
  return s;
}

function sessionsOn(predicate) {
  return state.sessions.data.filter((s) => s.binding && predicate(s.binding));
}

let detailsTimer = 0;
/** Redraws the details of the selection (`soon`: at most twice a second, for
 *  telemetry). */
export function renderDetails(soon) {
  if (soon) {
    if (!detailsTimer) detailsTimer = setTimeout(() => { detailsTimer = 0; renderDetails(); }, 500);
    return;
  }
  const view = $("view-details");
  const sel = state.selected;
  if (!sel) return;
  const parts = [];
  if (sel.kind === "gpu") {
    const [node, gpu] = findGpu(sel.node, sel.index);
    if (!gpu) {
      view.replaceChildren(...kids(h("p", { class: "hint" }, `GPU ${sel.node}:${sel.index} is no longer in the graph.`)));
      return;
    }
    const f = gpu.facts;
    const s = gpu.latest;
    const health = healthOf(gpu);
    const mem = memoryOf(node, gpu, state.instances);
    const ring = state.history.get(gpuKey(sel.node, sel.index)) || [];
    parts.push(
      h("h2", {}, `${sel.node} · GPU ${f.index}`, " ", h("span", { class: `badge ${health}` }, health)),
      gpu.health.reasons.length ? h("p", { class: "error" }, gpu.health.reasons.join("; ")) : null,
      gpu.drained ? h("p", {}, `Drained: ${gpu.drained}`) : null,
      h("dl", { class: "facts" },
        h("dt", {}, "model"), h("dd", {}, f.name + (f.simulated ? " (simulated)" : "")),
        h("dt", {}, "memory"), h("dd", { class: "mem-facts" }, `${gib(mem.free)} of ${gib(mem.total)} GiB free: ${gib(mem.reserved)} reserved by Skein, ${gib(mem.other)} used by others, ${gib(mem.used)} in use`),
        h("dt", {}, "busy"), h("dd", {}, s?.utilization_pct != null ? `${s.utilization_pct}%` : "unknown"),
        h("dt", {}, "temperature"), h("dd", {}, s?.temperature_c != null ? `${s.temperature_c} °C` : "unknown"),
        h("dt", {}, "power"), h("dd", {}, s?.power_mw != null ? `${(s.power_mw / 1000).toFixed(0)} W of ${f.power_limit_mw ? (f.power_limit_mw / 1000).toFixed(0) : "?"} W` : "unknown"),
        h("dt", {}, "throttle"), h("dd", {}, s ? (throttleOf(s.throttle_reasons) ? `throttled: ${throttleOf(s.throttle_reasons)}` : "not throttled") : "unknown"),
        h("dt", {}, "compute"), h("dd", {}, f.compute_capability ? f.compute_capability.join(".") : "unknown"),
        h("dt", {}, "PCIe"), h("dd", {}, f.pcie ? `gen ${f.pcie[0]} ×${f.pcie[1]}` : "unknown"),
        h("dt", {}, "NVLink to"), h("dd", {}, node.links.filter((l) => l.kind === "nvlink" && (l.a === f.index || l.b === f.index)).map((l) => `GPU ${l.a === f.index ? l.b : l.a}`).join(", ") || "none"),
        h("dt", {}, "ECC"), h("dd", {}, s?.ecc_corrected != null ? `${s.ecc_corrected} corrected, ${s.ecc_uncorrected ?? 0} uncorrected` : "not reported"),
        h("dt", {}, "UUID"), h("dd", {}, h("code", {}, f.uuid)),
        h("dt", {}, "sampled"), h("dd", {}, s ? fmtTime(s.unix_ms) : "never"),
      ),
      h("h3", {}, "Busy (%), last samples"), chart(ring, "util", 0, 100, "#0b57d0", "busy percentage"),
      h("h3", {}, "Temperature (°C)"), chart(ring, "temp", 20, 100, "#b42318", "temperature"),
      h("h3", {}, "Memory used (GiB)"), chart(ring, "used", 0, f.memory_total, "#2e8540", "memory used"),
      h("h3", {}, "Models on it"),
    );
    const here = state.instances.filter((i) => i.node_name === sel.node && i.gpus.includes(sel.index) && !GONE.has(i.state));
    if (!here.length) parts.push(h("p", { class: "hint" }, "None."));
    for (const inst of here) parts.push(instanceBlock(inst, true));
    parts.push(h("h3", {}, "Sessions on it"), sessionList(sessionsOn((b) => b.node === sel.node && b.gpus.includes(sel.index))));
  } else {
    const inst = state.instances.find((i) => i.name === sel.name);
    if (!inst) {
      view.replaceChildren(...kids(h("p", { class: "hint" }, `Instance ${sel.name} is gone.`)));
      return;
    }
    parts.push(instanceBlock(inst, false));
    parts.push(h("h3", {}, "Sessions on it"), sessionList(sessionsOn((b) => b.instance === inst.name)));
  }
  view.replaceChildren(...kids(...parts));
}

/** Download progress: "12.3 of 131.4 GiB (9%)". */
function downloadText(done, total) {
  const pct = total ? Math.floor((done / total) * 100) : 0;
  return `${gib(done)} of ${gib(total)} GiB (${pct}%)`;
}

/** An instance's detail with byte counts written as GiB and percent. */
const readableDetail = (detail) => detail.replace(/\((\d+) of (\d+) bytes\)/g, (_, done, total) => `(${downloadText(Number(done), Number(total)).replace(" (", ", ").replace(/\)$/, "")})`);

function instanceBlock(inst, link) {
  const p = inst.placement;
  const split = p
    ? `${p.layout.tensor_parallel} GPU${p.layout.tensor_parallel > 1 ? "s" : ""} per stage × ${p.layout.pipeline_stages} stage${p.layout.pipeline_stages > 1 ? "s" : ""} (${p.family})`
    : `GPUs ${inst.gpus.join(", ")}`;
  const title = link
    ? h("button", { type: "button", class: "link", onclick: () => selectItem({ kind: "instance", name: inst.name }) }, inst.name)
    : h("span", {}, inst.name);
  return h("div", { class: "instance", "data-instance": inst.name },
    h("h3", {}, h("span", { class: "swatch", style: `background:${colourOf(inst.part_of || inst.name)}` }), " ", title, " ", h("span", { class: `badge ${inst.state}` }, inst.state)),
    h("dl", { class: "facts" },
      h("dt", {}, "agents"), h("dd", {}, agentsOf(inst, state.instances).join(", ")),
      inst.part_of ? [h("dt", {}, "part of"), h("dd", {}, inst.part_of)] : null,
      inst.pieces && inst.pieces.length ? [h("dt", {}, "pieces"), h("dd", {}, inst.pieces.join(", "))] : null,
      h("dt", {}, "run"), h("dd", {}, inst.run || "none (kept warm)"),
      h("dt", {}, "variant"), h("dd", {}, h("code", {}, inst.variant)),
      h("dt", {}, "engine"), h("dd", {}, inst.engine),
      p && p.task?.kind === "embed" ? [h("dt", {}, "serves"), h("dd", { class: "task" }, `embeddings (POST /v1/embeddings), pooling ${p.task.pooling || "as the model states"}`)] : null,
      h("dt", {}, "placed on"), h("dd", { class: "placed" }, `${inst.node_name}: GPU ${inst.gpus.join(", ")}`),
      h("dt", {}, "split"), h("dd", {}, split),
      splitOf(inst, state.instances) ? [h("dt", {}, "across"), h("dd", { class: "split-where" }, splitOf(inst, state.instances).where)] : null,
      p ? [h("dt", {}, "precision"), h("dd", {}, `${p.precision} (${p.quantization})`)] : null,
      p ? [h("dt", {}, "speed"), h("dd", {}, `${p.tokens_per_s.toFixed(0)} tokens/s per sequence (modelled)`)] : null,
      h("dt", {}, "memory"), h("dd", {}, inst.held.map(([g, b]) => `GPU ${g}: ${fmtBytes(b)} reserved`).concat(inst.measured_gpu.map(([g, b]) => `GPU ${g}: ${fmtBytes(b)} measured`)).join("; ") || "none"),
      inst.clone_of ? [h("dt", {}, "added by"), h("dd", {}, `reflex ${inst.clone_of}`)] : null,
      h("dt", {}, "share"), h("dd", {}, `${Math.round(inst.share * 100)}% of new sessions`),
      inst.download_total ? [h("dt", {}, "download"), h("dd", { class: "download" },
        h("progress", { max: inst.download_total, value: Math.min(inst.downloaded || 0, inst.download_total), "aria-label": `download of ${inst.name}` }), " ",
        downloadText(inst.downloaded || 0, inst.download_total))] : null,
      inst.detail ? [h("dt", {}, "detail"), h("dd", { class: "detail" }, readableDetail(inst.detail))] : null,
    ),
    p && p.devices?.length ? h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "device"), h("th", {}, "stage"), h("th", { class: "num" }, "layers"), h("th", { class: "num" }, "reserved"))),
      h("tbody", {}, p.devices.map((d) => h("tr", {},
        h("td", {}, d.gpu != null ? `${d.node}:${d.gpu}` : `${d.node} (host)`),
        h("td", {}, d.stage ?? ""),
        h("td", { class: "num" }, d.layers ?? ""),
        h("td", { class: "num" }, fmtBytes(d.reserved))))),
    )) : null,
    p && p.why?.length ? [h("h3", {}, "Why the planner chose it"), h("ul", { class: "plain" }, p.why.map((w) => h("li", {}, w)))] : null,
    p && p.rejected?.length ? [h("h3", {}, "Turned down"), h("ul", { class: "plain" }, p.rejected.map((r) => h("li", {}, `${r.option}: ${r.why}`)))] : null,
  );
}
