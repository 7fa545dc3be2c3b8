// Skein's fleet page: the live hardware graph (nodes, GPUs, links, the model shards on
// each GPU), runs, sessions and reflex events, from one server-sent event stream
// (`GET /v1/live`). Layout by ELK, drawing by D3; no build step (docs/web.md).
"use strict";

(() => {
  const TOKEN_KEY = "skein.token";
  const HISTORY = 120; // samples kept per GPU for the sparklines (the server keeps as many)
  const GPU_W = 232;
  const GPU_H = 150;
  const GPU_COLS = 4; // GPUs per row inside a node box
  const GPU_GAP = 14; // between cards of a row
  const ROW_GAP = 46; // between rows: room for an NVLink band and the next PCIe branch
  const NODE_PAD = 14;
  const BUS_Y = 62; // the PCIe bus label, under the node's title lines
  const GPU_TOP = BUS_Y + 22 + 26; // the first row of GPUs
  const COLLAPSED_W = 300;
  const COLLAPSED_H = 96;
  const AUTO_COLLAPSE_GPUS = 256; // beyond this, nodes open collapsed
  const STALL_MS = 20000; // no byte for this long (keep-alives come every 15 s): reconnect
  const GONE = new Set(["stopped", "lost", "failed"]);

  const state = {
    token: localStorage.getItem(TOKEN_KEY) || sessionStorage.getItem(TOKEN_KEY) || "",
    user: "",
    admin: false,
    sampleIntervalMs: 1000,
    nodes: new Map(), // id -> node view (as /v1/graph gives it)
    history: new Map(), // "node:gpu" -> [{t, util, temp, used}]
    instances: [],
    runs: [],
    sessions: { data: [], more: false },
    reflexes: [],
    collapsed: new Set(),
    expanded: new Set(),
    selected: null, // {kind: "gpu", node, index} | {kind: "instance", name}
    openRun: null,
    migrating: null, // session id whose migrate form is open
    layout: null, // the last ELK result
    topology: "",
    gpuCount: 0, // GPUs in the graph
    dirty: new Set(), // GPU keys to redraw
    allDirty: false,
    frame: 0,
    connection: null, // AbortController of the live stream
    lastUpdate: 0, // when the last event arrived (ms)
    table: false, // the GPU table shown instead of the graph
    sort: { key: "name", descending: false }, // the GPU table's order
    samplesLoaded: false, // the server's recent samples merged since the last `graph`
    samplesWanted: false, // a whole graph arrived: read the recent samples once it is drawn
  };

  // ---------------------------------------------------------------- helpers
  const $ = (id) => document.getElementById(id);
  const GiB = 1024 ** 3;
  const gib = (b) => (b / GiB).toFixed(1);
  const fmtBytes = (b) => (b >= GiB ? `${gib(b)} GiB` : `${(b / 1024 ** 2).toFixed(0)} MiB`);
  const fmtTime = (t) => (t ? new Date(t).toLocaleTimeString() : "");
  const gpuKey = (nodeName, index) => `${nodeName}:${index}`;

  /** Children as the DOM takes them: arrays flattened, nothing for null or false. */
  const kids = (...children) => children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false);

  /** An element with attributes and children (strings become text: never HTML). */
  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "class") e.className = v;
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of kids(children)) {
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  /** A colour per model instance (a piece of a replica split across nodes takes its
   *  replica's), the same on every load (from a hash of its name),
   *  from a palette of blues, cyans, magentas and browns: never the health colours
   *  (green, yellow, red, purple) nor grey. */
  const PALETTE = ["#1f5fa8", "#0e7c86", "#b0307f", "#8a5a2b", "#3d52a0", "#0b8fb3", "#7a2f8f", "#2e6f8e", "#2a7ab0", "#a23b5f", "#5b6bbf", "#00707a"];
  const colours = new Map();
  function colourOf(name) {
    let colour = colours.get(name);
    if (!colour) {
      let hash = 2166136261;
      for (let i = 0; i < name.length; i++) hash = Math.imul(hash ^ name.charCodeAt(i), 16777619);
      colour = PALETTE[(hash >>> 0) % PALETTE.length];
      colours.set(name, colour);
    }
    return colour;
  }

  async function api(path, options = {}) {
    const response = await fetch(path, {
      ...options,
      headers: { Authorization: `Bearer ${state.token}`, "Content-Type": "application/json", ...(options.headers || {}) },
    });
    const text = await response.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch { body = null; }
    if (!response.ok) {
      if (response.status === 401) signIn("The token was refused: " + (body?.error?.message || "sign in again."));
      const message = body?.error?.message || `${response.status} ${response.statusText}`;
      throw new Error(message);
    }
    return body;
  }

  // ---------------------------------------------------------------- sign in
  function signIn(message) {
    if (state.connection) state.connection.abort();
    state.connection = null;
    setConnection("idle", "not connected");
    $("login-error").textContent = message || "";
    const dialog = $("login");
    if (!dialog.open) dialog.showModal();
    $("token").focus();
  }

  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.token = $("token").value.trim();
    if (!state.token) return;
    sessionStorage.setItem(TOKEN_KEY, state.token);
    if ($("remember").checked) localStorage.setItem(TOKEN_KEY, state.token);
    else localStorage.removeItem(TOKEN_KEY);
    $("token").value = "";
    $("login").close();
    connect();
  });
  $("login").addEventListener("cancel", (e) => e.preventDefault());
  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    localStorage.removeItem(TOKEN_KEY);
    state.token = "";
    $("who").textContent = "";
    $("sign-out").hidden = true;
    signIn("");
  });

  // ---------------------------------------------------------------- live stream
  /** Shows the connection's state; while it is lost the page's values are greyed
   *  (they are as of the last update, whose time is shown). */
  function setConnection(kind, text) {
    const e = $("connection");
    e.dataset.state = kind;
    const stale = kind === "lost" && state.lastUpdate > 0;
    document.body.classList.toggle("stale", stale);
    e.dataset.lastUpdate = state.lastUpdate || "";
    e.textContent = stale ? `${text} · values as of ${fmtTime(state.lastUpdate)}` : text;
  }

  /** Reads `/v1/live` (fetch, so the token travels in a header), and reconnects by
   *  itself after a loss, waiting longer each time (up to 10 s). */
  async function connect() {
    if (state.connection) state.connection.abort();
    const controller = new AbortController();
    state.connection = controller;
    let wait = 500;
    while (!controller.signal.aborted) {
      setConnection("connecting", "connecting…");
      let received = false;
      try {
        const response = await fetch("/v1/live", {
          headers: { Authorization: `Bearer ${state.token}`, Accept: "text/event-stream" },
          signal: controller.signal,
          cache: "no-store",
        });
        if (response.status === 401) {
          const body = await response.json().catch(() => null);
          signIn("The token was refused: " + (body?.error?.message || "sign in again."));
          return;
        }
        if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
        await readEvents(response.body, controller, () => {
          if (!received) {
            received = true;
            wait = 500;
            setConnection("live", "live");
          }
        });
        if (!controller.signal.aborted) throw new Error("the server closed the stream");
      } catch (error) {
        if (controller.signal.aborted) return;
        const seconds = Math.round(wait / 100) / 10;
        setConnection("lost", `connection lost (${error.message}); retrying in ${seconds} s`);
        await new Promise((resolve) => setTimeout(resolve, wait));
        wait = Math.min(wait * 2, 10000);
      }
    }
  }

  /** Parses a server-sent event stream and dispatches each event. */
  async function readEvents(body, controller, onData) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let timer = null;
    const stalled = () => {
      clearTimeout(timer);
      timer = setTimeout(() => reader.cancel(new Error("no data for 20 s")), STALL_MS);
    };
    stalled();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        stalled();
        onData();
        buffer += value;
        let end;
        while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + buffer.slice(end).match(/^\r?\n\r?\n/)[0].length);
          let name = "message";
          const data = [];
          for (const line of block.split(/\r?\n/)) {
            if (line.startsWith(":")) continue;
            const colon = line.indexOf(":");
            const field = colon < 0 ? line : line.slice(0, colon);
            const rest = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
            if (field === "event") name = rest;
            else if (field === "data") data.push(rest);
          }
          if (data.length) dispatch(name, JSON.parse(data.join("\n")));
        }
      }
    } finally {
      clearTimeout(timer);
      if (controller.signal.aborted) reader.cancel().catch(() => {});
    }
  }

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
        for (const node of data.nodes) recordSamples(node.inventory.name, node.gpus.map((g) => [g.facts.index, g.latest]));
        state.samplesWanted = true;
        graphChanged();
        break;
      case "node":
        state.nodes.set(data.id, data);
        recordSamples(data.inventory.name, data.gpus.map((g) => [g.facts.index, g.latest]));
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

  function recordSamples(nodeName, samples) {
    for (const [index, s] of samples) {
      if (!s) continue;
      const key = gpuKey(nodeName, index);
      let ring = state.history.get(key);
      if (!ring) state.history.set(key, (ring = []));
      const last = ring[ring.length - 1];
      if (last && last.t >= s.unix_ms) continue;
      ring.push({ t: s.unix_ms, util: s.utilization_pct, temp: s.temperature_c, used: s.memory_used, power: s.power_mw });
      if (ring.length > HISTORY) ring.splice(0, ring.length - HISTORY);
    }
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
          const live = (state.history.get(key) || []).filter((p) => !ring.length || p.t > ring[ring.length - 1].t);
          state.history.set(key, ring.concat(live).slice(-HISTORY));
        }
      }
      state.samplesLoaded = true;
      state.allDirty = true;
      scheduleDraw();
      if (state.selected?.kind === "gpu") renderDetails(true);
    } catch (error) {
      // The sparklines then start with the live samples.
    }
  }

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
    recordSamples(node.inventory.name, update.gpus.map((g) => [g.index, g.latest]));
    if (healthChanged || state.collapsed.has(node.id)) state.allDirty = true;
    scheduleDraw();
    const sel = state.selected;
    if (sel && sel.kind === "gpu" && sel.node === node.inventory.name) renderDetails(true);
  }

  // ---------------------------------------------------------------- the graph
  /** How long layouts and redraws took, milliseconds, the last 500 of each (read by
   *  the benchmark, web/tests/bench.mjs). */
  const timings = { layout: [], draw: [] };
  window.skeinTimings = timings;
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

  function nodesInOrder() {
    return [...state.nodes.values()].sort((a, b) => a.inventory.name.localeCompare(b.inventory.name));
  }

  function isCollapsed(node) {
    if (state.collapsed.has(node.id)) return true;
    if (state.expanded.has(node.id)) return false;
    return state.gpuCount > AUTO_COLLAPSE_GPUS;
  }

  /** NVLink islands of a node: sets of GPU indices joined by NVLink. */
  function nvlinkGroups(node) {
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

  function pcieLabel(node) {
    const first = node.gpus.find((g) => g.facts.pcie);
    if (!first) return "PCIe";
    const [gen, width] = first.facts.pcie;
    const bw = first.pcie_gbytes_per_s;
    return `PCIe ${gen}.0 ×${width}${bw ? ` · ${bw.toFixed(1)} GB/s` : ""}`;
  }

  function networkLabel(node) {
    const bps = node.inventory.host.network_bps;
    if (!bps) return "network: speed unknown";
    return bps >= 1e9 ? `${Math.round(bps / 1e9)} Gb/s` : `${Math.round(bps / 1e6)} Mb/s`;
  }

  const textWidth = (text, px = 11) => Math.ceil(text.length * px * 0.6) + 8;
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  /** Where a node's parts go inside its box: one PCIe bus (a label, a trunk down the
   *  left, a branch above each row, a drop to each GPU), GPUs in rows of at most
   *  `GPU_COLS`, and each NVLink island as a band under its members. */
  function nodeLayout(node) {
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

  function elkGraph() {
    const children = [{ id: "net", width: 130, height: 54 }];
    const edges = [];
    for (const node of nodesInOrder()) {
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

  function topologyKey() {
    return nodesInOrder()
      .map((n) => `${n.id}/${n.gpus.length}/${isCollapsed(n) ? "c" : "e"}/${n.links.map((l) => l.kind[0]).join("")}`)
      .join(";");
  }

  let layoutRunning = false;
  let layoutAgain = false;
  let firstFit = true;

  function graphChanged() {
    state.gpuCount = 0;
    for (const n of state.nodes.values()) state.gpuCount += n.gpus.length;
    updateFleetLine();
    const key = topologyKey();
    if (key !== state.topology) {
      state.topology = key;
      relayout();
    } else {
      state.allDirty = true;
      scheduleDraw();
      samplesAfterDraw();
    }
    renderDetails();
  }

  /** Reads every GPU's recent samples once the whole graph is drawn (so the first
   *  picture does not wait for them). */
  function samplesAfterDraw() {
    if (!state.samplesWanted) return;
    state.samplesWanted = false;
    setTimeout(loadAllHistory, 0);
  }

  async function relayout() {
    if (layoutRunning) {
      layoutAgain = true;
      return;
    }
    layoutRunning = true;
    try {
      const started = performance.now();
      state.layout = await elk.layout(elkGraph());
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

  function onKeyActivate(handler) {
    return function (event) {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        handler.call(this, event);
      }
    };
  }

  /** The drawn node boxes by node name and GPU cards by "node:gpu" (D3 selections),
   *  so that updates find them without querying the document; `boxes`: each node
   *  box's place, for the lines that join a replica split across nodes. */
  const drawn = { nodes: new Map(), gpus: new Map(), boxes: new Map(), splits: null };

  /** Draws what the layout decides: node boxes, the PCIe bus, NVLink islands, links,
   *  GPU cards (empty). */
  function drawStructure() {
    const layout = state.layout;
    const nodes = new Map(nodesInOrder().map((n) => [n.id, n]));
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
        const select = () => selectItem({ kind: "gpu", node: node.inventory.name, index });
        card.on("click", select).on("keydown", onKeyActivate(select));
      }
    }
    drawn.splits = viewport.append("g").attr("class", "splits");
    markSelection();
  }

  /** At most `n` characters: longer text ends in "…" (the card's label has it all). */
  const clip = (text, n) => (text.length > n ? text.slice(0, n - 1) + "…" : text);
  const TITLE_CHARS = 20; // what fits left of the health badge, at 12 px

  const shortName = (name) => name.replace(/^NVIDIA\s+/, "").replace(/^GeForce\s+/, "").replace(/^Tesla\s+/, "");

  /** Free memory of the fleet, as the cards count it. */
  function updateFleetLine() {
    let gpus = 0, total = 0, free = 0, down = 0, left = 0;
    for (const n of state.nodes.values()) {
      if (n.health.state === "left") left++;
      else if (!n.connected) down++;
      for (const g of n.gpus) {
        gpus++;
        const mem = memoryOf(n, g);
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

  /** Whom an instance serves: its agents; for a piece of a replica split across nodes
   *  (a Ray node, an RPC server), its role and the replica's agents. */
  function agentsOf(inst) {
    if (!inst.part_of) return inst.agents;
    const whole = state.instances.find((i) => i.name === inst.part_of);
    return [`${inst.engine} of ${whole ? whole.agents.join("+") : inst.part_of}`];
  }

  /** GPU indices as ranges: [0, 1, 2, 5] → "0–2,5". */
  function ranges(indices) {
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
  function splitOf(inst) {
    const whole = inst.part_of ? state.instances.find((i) => i.name === inst.part_of) || inst : inst;
    const p = whole.placement;
    const devices = (p?.devices || []).filter((d) => d.gpu != null);
    const byNode = new Map();
    for (const d of devices) {
      if (!byNode.has(d.node)) byNode.set(d.node, []);
      byNode.get(d.node).push(d.gpu);
    }
    if (!byNode.size) {
      byNode.set(whole.node_name, whole.gpus);
      for (const piece of state.instances.filter((i) => i.part_of === whole.name)) byNode.set(piece.node_name, piece.gpus);
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
   *  rebuilt when the instances change. */
  let planned = { of: null, map: new Map() };
  function plannedOn() {
    if (planned.of === state.instances) return planned.map;
    const map = new Map();
    for (const inst of state.instances) {
      if (GONE.has(inst.state) || inst.part_of || !inst.placement) continue;
      for (const d of inst.placement.devices || []) {
        if (d.gpu == null) continue;
        const key = gpuKey(d.node, d.gpu);
        if (!map.has(key)) map.set(key, []);
        map.get(key).push(inst);
      }
    }
    planned = { of: state.instances, map };
    return map;
  }

  /** The memory of a GPU as its card shows it: each instance's shard (measured once
   *  loaded, reserved before), what others use (the larger of what the agent measured
   *  as not Skein's and memory in use beyond Skein's instances), and what is free:
   *  total less the larger of memory in use and Skein's reservations plus others'. */
  function memoryOf(node, gpu) {
    const total = gpu.facts.memory_total;
    const used = gpu.latest ? gpu.latest.memory_used : 0;
    const shards = [];
    let measured = 0;
    let reserved = 0;
    for (const inst of state.instances) {
      if (inst.node_name !== node.inventory.name || GONE.has(inst.state)) continue;
      const m = inst.measured_gpu.find(([i]) => i === gpu.facts.index);
      const held = inst.held.find(([i]) => i === gpu.facts.index);
      if (!m && !held) continue;
      const bytes = m ? Math.max(m[1], held ? held[1] : 0) : held[1];
      if (m) measured += m[1];
      reserved += bytes;
      shards.push({ name: inst.name, inst, agents: agentsOf(inst), bytes, measured: !!m });
    }
    const foreign = gpu.latest?.foreign_memory;
    const other = Math.max(0, foreign ?? 0, used - measured);
    const free = Math.max(0, total - Math.max(used, reserved + other));
    return { total, used, reserved, shards, other, free };
  }

  function healthOf(gpu) {
    if (gpu.drained) return "drained";
    return gpu.health.state;
  }

  /** Busy and temperature levels, as nvtop colours them. */
  const utilLevel = (u) => (u == null ? "none" : u >= 90 ? "high" : u >= 60 ? "mid" : "low");
  const tempLevel = (t) => (t == null ? "none" : t >= 85 ? "high" : t >= 75 ? "mid" : "low");

  /** What throttles the GPU, from NVML's reason bits (skein_proto::throttle). */
  function throttleOf(bits) {
    if (!bits) return null;
    const why = [];
    if (bits & (0x8 | 0x20 | 0x40)) why.push("thermal");
    if (bits & (0x4 | 0x80)) why.push("power");
    if (!why.length && bits & ~0x1 & ~0x10 & ~0x2 & ~0x100) why.push("other");
    return why.length ? why.join(", ") : null;
  }

  function scheduleDraw() {
    if (state.frame) return;
    state.frame = requestAnimationFrame(() => {
      state.frame = 0;
      drawGpus();
    });
  }

  function sparkPath(points, field, lo, hi, width, height) {
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
    if (all) drawSplits();
    if (all || performance.now() - fleetLineAt > 1000) {
      fleetLineAt = performance.now();
      updateFleetLine();
    }
    if (state.table) renderTable(true);
    timing("draw", started);
  }

  let fleetLineAt = 0;

  /** Host RAM the node's instances hold (layers offloaded to the CPU). */
  function drawOffload(group, node) {
    const parts = [];
    let bytes = 0;
    for (const inst of state.instances) {
      if (GONE.has(inst.state) || !inst.placement) continue;
      for (const d of inst.placement.devices || []) {
        if (d.gpu != null || d.node !== node.inventory.name || !d.reserved) continue;
        bytes += d.reserved;
        parts.push(`${inst.agents.join("+")} ${fmtBytes(d.reserved)}${d.layers ? ` (layers ${d.layers.replace("..", "–")})` : ""}`);
      }
    }
    group.attr("data-offload", bytes || null);
    group.select(".node-offload").text(parts.length ? `host RAM offload: ${parts.join(", ")}` : "");
  }

  /** A bracket on the right of the node column joining the boxes of each replica
   *  split across nodes, in the replica's colour and named. */
  function drawSplits() {
    if (!drawn.splits) return;
    const layer = drawn.splits;
    layer.selectAll("*").remove();
    const seen = new Set();
    let right = 0;
    for (const box of drawn.boxes.values()) right = Math.max(right, box.x + box.width);
    let lane = 0;
    for (const inst of state.instances) {
      if (GONE.has(inst.state) || inst.part_of) continue;
      const split = splitOf(inst);
      if (!split || split.nodes.length < 2 || seen.has(split.replica)) continue;
      seen.add(split.replica);
      const boxes = split.nodes.map((n) => drawn.boxes.get(n)).filter(Boolean);
      if (boxes.length < 2) continue;
      const x = right + 16 + lane * 14;
      lane++;
      const ys = boxes.map((b) => b.y + b.height / 2);
      let d = "";
      for (const [i, b] of boxes.entries()) d += `M${b.x + b.width},${ys[i]}H${x}`;
      d += `M${x},${Math.min(...ys)}V${Math.max(...ys)}`;
      const g = layer.append("g").attr("class", "split-link").attr("data-instance", split.replica).attr("data-nodes", split.nodes.join(","));
      g.append("path").attr("d", d).attr("stroke", colourOf(split.replica));
      g.append("text").attr("class", "split-label").attr("x", x + 6).attr("y", Math.min(...ys) + 4)
        .attr("fill", colourOf(split.replica)).text(`${split.agents} split`);
      g.append("title").text(`${split.head} · ${split.where}`);
    }
  }

  function drawCollapsed(group, node) {
    let total = 0, free = 0, util = 0, temp = -Infinity;
    const states = { ok: 0, degraded: 0, down: 0, left: 0, drained: 0 };
    for (const g of node.gpus) {
      const mem = memoryOf(node, g);
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

  /** Sets an attribute only when it changed: a redraw touches what moved, nothing else. */
  function setAttr(el, name, value) {
    if (value === null || value === undefined) {
      if (el.hasAttribute(name)) el.removeAttribute(name);
      return;
    }
    const text = String(value);
    if (el.getAttribute(name) !== text) el.setAttribute(name, text);
  }
  function setText(el, text) {
    if (el.textContent !== text) el.textContent = text;
  }

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

  function drawGpu(card, node, gpu, key) {
    if (card.empty()) return;
    const el = card.node();
    const parts = partsOf(card);
    const s = gpu.latest;
    const mem = memoryOf(node, gpu);
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
      const split = splitOf(shard.inst);
      if (split) { splits.push(split.label(key)); replicas.add(split.replica); }
      names.push(`${shard.agents.join("+")} ${gib(shard.bytes)}`);
    }
    for (const inst of plannedOn().get(key) || []) {
      const split = splitOf(inst);
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
            .on("click", (e) => { e.stopPropagation(); selectItem({ kind: "instance", name: d.name }); })
            .on("keydown", onKeyActivate((e) => { e.stopPropagation(); selectItem({ kind: "instance", name: d.name }); }));
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
  function fit() {
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
    for (const node of nodesInOrder()) {
      for (const gpu of node.gpus) {
        const s = gpu.latest;
        rows.push({
          key: gpuKey(node.inventory.name, gpu.facts.index),
          name: `${node.inventory.name} · ${gpu.facts.index}`,
          node: node.inventory.name,
          index: gpu.facts.index,
          model: shortName(gpu.facts.name),
          free: memoryOf(node, gpu).free,
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
  function renderTable(soon) {
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

  function showTable(on) {
    state.table = on;
    $("view-toggle").setAttribute("aria-pressed", String(on));
    $("view-toggle").textContent = on ? "Graph" : "Table";
    $("graph-pane").hidden = on;
    $("table-pane").hidden = !on;
    if (on) renderTable();
    else if (state.layout) fit();
  }
  $("view-toggle").addEventListener("click", () => showTable(!state.table));

  // ---------------------------------------------------------------- side panel
  const TABS = ["details", "runs", "sessions", "events"];
  function showTab(name) {
    for (const t of TABS) {
      const on = t === name;
      $(`tab-${t}`).setAttribute("aria-selected", String(on));
      $(`tab-${t}`).tabIndex = on ? 0 : -1;
      $(`view-${t}`).hidden = !on;
    }
  }
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

  function selectItem(item) {
    state.selected = item;
    markSelection();
    showTab("details");
    renderDetails();
    if (item.kind === "gpu") loadHistory(item.node, item.index);
  }

  function markSelection() {
    const sel = state.selected;
    viewport.selectAll("g.gpu").classed("selected", function () {
      return !!sel && sel.kind === "gpu" && this.dataset.gpu === gpuKey(sel.node, sel.index);
    });
  }

  /** The GPU's history as the server keeps it (the sparkline holds what arrived since
   *  the page opened; the server has the minutes before). */
  async function loadHistory(nodeName, index) {
    try {
      const answer = await api(`/v1/graph/nodes/${encodeURIComponent(nodeName)}/gpus/${index}/samples`);
      const key = gpuKey(nodeName, index);
      const ring = answer.samples.map((s) => ({ t: s.unix_ms, util: s.utilization_pct, temp: s.temperature_c, used: s.memory_used, power: s.power_mw }));
      const live = (state.history.get(key) || []).filter((p) => !ring.length || p.t > ring[ring.length - 1].t);
      state.history.set(key, ring.concat(live).slice(-HISTORY));
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
  function renderDetails(soon) {
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
      const mem = memoryOf(node, gpu);
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
        h("dt", {}, "agents"), h("dd", {}, agentsOf(inst).join(", ")),
        inst.part_of ? [h("dt", {}, "part of"), h("dd", {}, inst.part_of)] : null,
        inst.pieces && inst.pieces.length ? [h("dt", {}, "pieces"), h("dd", {}, inst.pieces.join(", "))] : null,
        h("dt", {}, "run"), h("dd", {}, inst.run || "none (kept warm)"),
        h("dt", {}, "variant"), h("dd", {}, h("code", {}, inst.variant)),
        h("dt", {}, "engine"), h("dd", {}, inst.engine),
        h("dt", {}, "placed on"), h("dd", { class: "placed" }, `${inst.node_name}: GPU ${inst.gpus.join(", ")}`),
        h("dt", {}, "split"), h("dd", {}, split),
        splitOf(inst) ? [h("dt", {}, "across"), h("dd", { class: "split-where" }, splitOf(inst).where)] : null,
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

  // ---------------------------------------------------------------- runs
  async function renderRuns(changed) {
    const view = $("view-runs");
    const list = h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "run"), h("th", {}, "workflow"), h("th", {}, "state"), h("th", { class: "num" }, "steps"))),
      h("tbody", {}, state.runs.map((r) => h("tr", { "data-run": r.id },
        h("td", {}, h("button", { type: "button", onclick: () => openRun(r.id) }, r.id.slice(0, 10))),
        h("td", {}, r.workflow),
        h("td", {}, h("span", { class: `badge ${r.state}` }, r.state), r.reason ? h("div", { class: "hint reason" }, r.reason) : null),
        h("td", { class: "num" }, `${r.steps_done}/${r.steps}`)))));
    const parts = [h("h2", {}, "Runs"), state.runs.length ? h("div", { class: "table-wrap" }, list) : h("p", { class: "hint" }, "No runs yet: `skein submit workflow.yaml`.")];
    const detail = h("div", { id: "run-detail" });
    parts.push(detail);
    view.replaceChildren(...kids(...parts));
    if (state.openRun && changed) await openRun(state.openRun, true);
  }

  async function openRun(id, quiet) {
    state.openRun = id;
    try {
      const run = await api(`/v1/runs/${encodeURIComponent(id)}`);
      const detail = $("run-detail");
      if (!detail) return;
      detail.replaceChildren(...kids(
        h("h3", {}, `Run ${run.id}`),
        h("p", { class: "reason" }, `${run.workflow.name} · `, h("span", { class: `badge ${run.state}` }, run.state), run.reason ? ` · ${run.reason}` : ""),
        h("div", { class: "table-wrap" }, h("table", {},
          h("thead", {}, h("tr", {}, h("th", {}, "step"), h("th", {}, "agent"), h("th", {}, "state"), h("th", {}, "instance"))),
          h("tbody", {}, run.steps.map((s) => h("tr", { "data-step": s.id },
            h("td", {}, s.id), h("td", {}, s.agent),
            h("td", {}, h("span", { class: `badge ${s.state}` }, s.state), s.error ? h("div", { class: "error reason" }, s.error) : null),
            h("td", {}, s.instance || "")))))),
      ));
      if (!quiet) detail.querySelector("h3").scrollIntoView({ block: "nearest" });
    } catch (error) {
      const detail = $("run-detail");
      if (detail) detail.replaceChildren(...kids(h("p", { class: "error" }, error.message)));
    }
  }

  // ---------------------------------------------------------------- sessions
  function placeOf(binding) {
    return binding ? `${binding.node}:${binding.gpus.join(",")}` : "not bound";
  }

  function sessionList(sessions) {
    if (!sessions.length) return h("p", { class: "hint" }, "None.");
    return h("ul", { class: "plain" }, sessions.map((s) => h("li", {}, `${s.id} (${s.owner}, ${s.agent}, ${s.messages} messages)`)));
  }

  function migrateTargets() {
    const targets = [["auto", "anywhere it fits (auto)"]];
    for (const node of nodesInOrder()) {
      if (!node.connected) continue;
      targets.push([`${node.inventory.name}`, `${node.inventory.name} (any GPU)`]);
      for (const g of node.gpus) targets.push([`${node.inventory.name}:${g.facts.index}`, `${node.inventory.name} GPU ${g.facts.index} (${gib(memoryOf(node, g).free)} GiB free)`]);
    }
    return targets;
  }

  function renderSessions() {
    const view = $("view-sessions");
    const focused = document.activeElement && view.contains(document.activeElement) ? document.activeElement.id : null;
    const rows = state.sessions.data.map((s) => {
      const open = state.migrating === s.id;
      return [
        h("tr", { "data-session": s.id },
          h("td", {}, h("code", { title: s.id }, s.id.slice(0, 10))),
          h("td", {}, s.owner),
          h("td", {}, s.agent || s.definition?.model?.repo || ""),
          h("td", { class: "gpu-cell" }, placeOf(s.binding)),
          h("td", { class: "num" }, s.messages),
          h("td", { class: "action" }, h("button", { type: "button", class: "migrate", id: `migrate-${s.id}`, "aria-expanded": String(open), onclick: () => { state.migrating = open ? null : s.id; renderSessions(); } }, "Migrate…"))),
        open ? h("tr", { class: "migrate-row" }, h("td", { colspan: 6 }, migrateForm(s))) : null,
      ];
    });
    view.replaceChildren(...kids(
      h("h2", {}, "Sessions"),
      state.sessions.data.length
        ? h("div", { class: "table-wrap" }, h("table", { class: "sessions" },
          h("thead", {}, h("tr", {}, h("th", {}, "id"), h("th", {}, "owner"), h("th", {}, "agent"), h("th", {}, "GPU"), h("th", { class: "num" }, "msgs"), h("th", {}, h("span", { class: "sr-only" }, "move")))),
          h("tbody", {}, rows)))
        : h("p", { class: "hint" }, "No sessions yet: `skein session create --agent NAME --run RUN`."),
      state.sessions.more ? h("p", { class: "hint" }, "More sessions exist than are shown; `skein sessions` lists them all.") : null,
      h("p", { id: "migrate-result", role: "status", "aria-live": "polite" }, migrateResult),
    ));
    if (focused && $(focused)) $(focused).focus();
  }

  let migrateResult = "";
  function migrateForm(session) {
    const select = h("select", { id: `migrate-to-${session.id}`, "aria-label": `Where to move session ${session.id}` },
      migrateTargets().map(([value, label]) => h("option", { value }, label)));
    const go = async () => {
      const value = select.value;
      let to = "auto";
      if (value !== "auto") {
        const [node, gpu] = value.split(":");
        to = gpu === undefined ? { node } : { node, gpu: Number(gpu) };
      }
      button.disabled = true;
      migrateResult = `Moving ${session.id}…`;
      $("migrate-result").textContent = migrateResult;
      try {
        const moved = await api(`/v1/sessions/${encodeURIComponent(session.id)}/migrate`, { method: "POST", body: JSON.stringify({ to }) });
        migrateResult = `Moved ${session.id} to ${placeOf(moved.to)} (${Number(moved.downtime_ms).toFixed(1)} ms without an engine).`;
        state.migrating = null;
      } catch (error) {
        migrateResult = `Could not move ${session.id}: ${error.message}`;
      }
      renderSessions();
    };
    const button = h("button", { type: "button", id: `migrate-go-${session.id}`, onclick: go }, "Move");
    return h("div", { class: "migrate-form" }, h("label", { for: select.id }, "to"), select, button);
  }

  // ---------------------------------------------------------------- events
  /** An action as the workflow declared it: `notify`, `{"clone": 1}`, … */
  function actionName(action) {
    if (typeof action === "string") return action;
    if (action && typeof action === "object") {
      const [name, value] = Object.entries(action)[0] || ["?", null];
      return value == null || typeof value === "object" ? name : `${name} ${value}`;
    }
    return String(action);
  }

  function renderEvents() {
    const view = $("view-events");
    const items = state.reflexes.map((e) => h("div", { class: "event", "data-event": e.id, "data-reflex": e.reflex },
      h("div", { class: "when" }, `${fmtTime(Date.parse(e.at))} · run ${e.run}${e.dry_run ? " · dry run" : ""}`),
      h("div", {}, h("strong", {}, e.reflex), " ", h("span", { class: `badge ${e.kind === "error" ? "failed" : e.kind === "fire" ? "degraded" : "ok"}` }, e.kind)),
      e.values && Object.keys(e.values).length
        ? h("div", { class: "values" }, Object.entries(e.values).map(([k, v]) => `${k} = ${typeof v === "number" ? +v.toFixed(3) : JSON.stringify(v)}`).join(", "))
        : null,
      e.error ? h("div", { class: "error" }, e.error) : null,
      e.actions?.length ? h("ul", { class: "plain" }, e.actions.map((a) => h("li", {}, `${actionName(a.action)}: `, h("span", { class: `badge ${a.outcome}` }, a.outcome), a.detail ? ` ${a.detail}` : ""))) : null,
    ));
    view.replaceChildren(...kids(h("h2", {}, "Reflex events"), items.length ? items : h("p", { class: "hint" }, "No reflex has fired yet.")));
  }

  // ---------------------------------------------------------------- start
  renderRuns(false);
  renderSessions();
  renderEvents();
  if (state.token) connect();
  else signIn("");
})();
