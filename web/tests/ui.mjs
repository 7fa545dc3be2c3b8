// Browser tests of Skein's web page, in Debian's headless Chromium driven by
// playwright-core. tests/web_ui.rs runs this against `skein up --fleet
// workflows/fleets/lab.yaml` (simulated GPUs, a mock hub), with:
//
//   SKEIN_API           the server's base URL
//   SKEIN_ADMIN_TOKEN   the admin's API token
//   SKEIN_LAB_WORKFLOW  the text of workflows/lab-research.yaml
//   SKEIN_TINY_REPO     the tiny test model's repository
//   SKEIN_ARTIFACTS     where screenshots (and the inputs the unit tests copy) go
//
// and answers two requests on stdin: it prints `@stop` (the test kills the server
// and answers `stopped`) and `@start` (the test starts it again and answers
// `started`). Every check prints a line; any failure exits non-zero with the reason.

import { chromium } from "playwright-core";
import { createInterface } from "node:readline";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const API = process.env.SKEIN_API;
const ADMIN = process.env.SKEIN_ADMIN_TOKEN;
const LAB_WORKFLOW = process.env.SKEIN_LAB_WORKFLOW;
const TINY = process.env.SKEIN_TINY_REPO;
const ARTIFACTS = process.env.SKEIN_ARTIFACTS;
const GiB = 1024 ** 3;
mkdirSync(ARTIFACTS, { recursive: true });

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function ask(request, answer) {
  console.log(request);
  const { value, done } = await lines.next();
  if (done || value.trim() !== answer) throw new Error(`asked ${request}, got ${done ? "end of input" : value}`);
}

const check = (ok, message) => {
  if (!ok) throw new Error(message);
  console.log(`ok: ${message}`);
};

async function api(token, method, path, body) {
  const response = await fetch(API + path, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  const json = text ? JSON.parse(text) : null;
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return json;
}

/** Keeps what the page was given (`/v1/graph`, `/v1/instances`, the live stream) in
 *  the artifacts: the unit tests' fixtures (web/tests/fixtures/) are copies of these. */
const keep = (name, text) => writeFileSync(join(ARTIFACTS, name), text);

/** The first `ms` milliseconds of `GET /v1/live`, as the server sent them. */
async function liveBytes(ms) {
  const controller = new AbortController();
  const response = await fetch(API + "/v1/live", { headers: { Authorization: `Bearer ${ADMIN}`, Accept: "text/event-stream" }, signal: controller.signal });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  setTimeout(() => controller.abort(), ms);
  let text = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += value;
    }
  } catch {
    // aborted: the time is up
  }
  return text;
}

/** Polls `probe` (an async function) every 100 ms until it returns something truthy. */
async function until(what, probe, seconds = 120) {
  const deadline = Date.now() + seconds * 1000;
  let last;
  while (Date.now() < deadline) {
    last = await probe();
    if (last) return last;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out after ${seconds} s waiting for ${what} (last: ${JSON.stringify(last)})`);
}

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});

// Every console error, failed request and 4xx/5xx answer of a signed-in page fails the
// test, but for the live stream's while the server is stopped on purpose.
const pageErrors = [];
let outage = false;
let watching = true;
function watch(page, name) {
  const expected = (url, text) => outage && (/\/v1\/live/.test(url || "") || /ERR_CONNECTION_REFUSED|ERR_INCOMPLETE_CHUNKED|ERR_EMPTY_RESPONSE|network error|Failed to fetch/.test(text || ""));
  page.on("pageerror", (error) => pageErrors.push(`${name}: script error: ${error.message}`));
  page.on("console", (message) => {
    if (!watching || message.type() !== "error") return;
    const url = message.location()?.url;
    if (expected(url, message.text())) return;
    pageErrors.push(`${name}: console error: ${message.text()} (${url || "?"})`);
  });
  page.on("requestfailed", (request) => {
    if (!watching) return;
    const why = request.failure()?.errorText || "";
    if (expected(request.url(), why) || why === "net::ERR_ABORTED") return;
    pageErrors.push(`${name}: request failed: ${request.method()} ${request.url()} (${why})`);
  });
  page.on("response", (response) => {
    if (watching && response.status() >= 400) pageErrors.push(`${name}: ${response.status()} for ${response.request().method()} ${response.url()}`);
  });
}

async function signedIn(token, name, viewport = { width: 1600, height: 1000 }, remember = false) {
  const context = await browser.newContext({ viewport, deviceScaleFactor: 1 });
  const page = await context.newPage();
  watch(page, name);
  await page.goto(API + "/");
  await page.locator("#token").fill(token);
  if (remember) await page.locator("#remember").check();
  await page.locator("#sign-in").click();
  await page.waitForSelector('#connection[data-state="live"]', { timeout: 30000 });
  return page;
}

const shot = async (page, name) => {
  const path = join(ARTIFACTS, name);
  await page.screenshot({ path });
  console.log(`screenshot: ${path}`);
};

const gibText = (bytes) => (bytes / GiB).toFixed(1);

/** Free memory as the page must count it: total less the larger of memory in use and
 *  Skein's reservations (measured once loaded) plus others' memory. */
function expectedMemory(node, gpu, instances) {
  const index = gpu.facts.index;
  const used = gpu.latest ? gpu.latest.memory_used : 0;
  let reserved = 0, measured = 0;
  for (const inst of instances) {
    if (inst.node_name !== node.inventory.name || ["stopped", "lost", "failed"].includes(inst.state)) continue;
    const m = inst.measured_gpu.find(([i]) => i === index);
    const held = inst.held.find(([i]) => i === index);
    if (!m && !held) continue;
    if (m) measured += m[1];
    reserved += m ? Math.max(m[1], held ? held[1] : 0) : held[1];
  }
  const foreign = gpu.latest?.foreign_memory;
  const other = Math.max(0, foreign ?? 0, used - measured);
  return { total: gpu.facts.memory_total, used, reserved, other, free: Math.max(0, gpu.facts.memory_total - Math.max(used, reserved + other)) };
}

/** Checks every card's free, reserved and total against the API (memory in use may
 *  move by a sample between the two reads: 0.25 GiB of slack on free). */
async function checkMemory(page, what) {
  const [graph, instances] = await Promise.all([api(ADMIN, "GET", "/v1/graph"), api(ADMIN, "GET", "/v1/instances")]);
  const shown = new Map((await page.$$eval("g.gpu", (gpus) => gpus.map((g) => ({
    key: g.dataset.gpu, total: Number(g.dataset.memTotal), free: Number(g.dataset.memFree), reserved: Number(g.dataset.memReserved),
    text: g.querySelector(".mem-text").textContent, detail: g.querySelector(".mem-detail").textContent,
  })))).map((g) => [g.key, g]));
  let free = 0, count = 0;
  for (const node of graph.nodes) {
    for (const gpu of node.gpus) {
      const key = `${node.inventory.name}:${gpu.facts.index}`;
      const g = shown.get(key);
      if (!g) throw new Error(`GPU ${key} is not on the page`);
      const want = expectedMemory(node, gpu, instances);
      if (g.total !== want.total) throw new Error(`GPU ${key} shows ${g.total} bytes, the graph says ${want.total}`);
      if (g.reserved !== want.reserved) throw new Error(`GPU ${key} shows ${g.reserved} bytes reserved, the instances hold ${want.reserved}`);
      if (Math.abs(g.free - want.free) > GiB / 4) throw new Error(`GPU ${key} shows ${g.free} bytes free, the API gives ${want.free}`);
      if (g.text !== `${gibText(g.free)} of ${gibText(want.total)} GiB free`) throw new Error(`GPU ${key} reads "${g.text}"`);
      if (!g.detail.startsWith(`reserved ${gibText(want.reserved)} · used `)) throw new Error(`GPU ${key}'s detail reads "${g.detail}"`);
      free += g.free;
      count++;
    }
  }
  const header = await page.$eval("#fleet", (e) => ({ free: Number(e.dataset.free), text: e.textContent }));
  if (Math.abs(header.free - free) > GiB / 4) throw new Error(`the header's free ${header.free} is not the cards' ${free}`);
  if (!header.text.includes(`${gibText(header.free)} of `) || !header.text.includes("GiB free")) throw new Error(`the header reads "${header.text}"`);
  check(true, `${what}: each of the ${count} GPUs reads reserved · used · free / total as the API gives them; the header: "${header.text}"`);
  return shown;
}

/** The smallest text of the graph as drawn on the screen, px. */
const smallestText = (page) => page.evaluate(() => {
  const k = Number(document.querySelector("#graph").dataset.scale || 1);
  let min = Infinity;
  for (const t of document.querySelectorAll("#graph text")) {
    if (!t.textContent) continue;
    min = Math.min(min, parseFloat(getComputedStyle(t).fontSize) * k);
  }
  return min;
});

/** A colour's hue (degrees) and saturation (0–1), from "#rrggbb" or "rgb(r, g, b)". */
function hueOf(colour) {
  let r, g, b;
  if (colour.startsWith("#")) [r, g, b] = [1, 3, 5].map((i) => parseInt(colour.slice(i, i + 2), 16) / 255);
  else [r, g, b] = colour.match(/\d+/g).slice(0, 3).map((x) => Number(x) / 255);
  const max = Math.max(r, g, b), min = Math.min(r, g, b), l = (max + min) / 2, d = max - min;
  if (!d) return { hue: 0, sat: 0 };
  const sat = d / (1 - Math.abs(2 * l - 1));
  let hue = max === r ? ((g - b) / d) % 6 : max === g ? (b - r) / d + 2 : (r - g) / d + 4;
  hue = (hue * 60 + 360) % 360;
  return { hue, sat };
}
/** Whether a colour could pass for a health colour: green, yellow, red, or grey. */
const looksLikeHealth = (colour) => {
  const { hue, sat } = hueOf(colour);
  return sat < 0.3 || hue < 18 || hue > 345 || (hue >= 40 && hue <= 160);
};

try {
  // ------------------------------------------------------------------ a wrong token
  {
    const context = await browser.newContext();
    const page = await context.newPage();
    await page.goto(API + "/");
    await page.locator("#token").fill("not-a-token");
    await page.locator("#sign-in").click();
    await page.waitForSelector("#login[open]");
    const said = await page.locator("#login-error").textContent();
    check(/refused/.test(said), `a wrong token is refused with a message ("${said.trim()}")`);
    await context.close();
  }

  // ------------------------------------------------------------------ the favicon (9)
  {
    const icon = await fetch(API + "/favicon.ico");
    check(icon.status === 200 && icon.headers.get("content-type") === "image/svg+xml", `GET /favicon.ico answers the icon (${icon.status} ${icon.headers.get("content-type")})`);
  }

  // ------------------------------------------------------------------ the fleet
  // The server keeps recent samples; the page must start with them (7).
  const kept = await until("a few samples of a100-box GPU 0 on the server", async () => {
    const answer = await api(ADMIN, "GET", "/v1/graph/nodes/a100-box/gpus/0/samples");
    return answer.samples.length >= 5 ? answer.samples.length : null;
  }, 60);
  const bulk = await api(ADMIN, "GET", "/v1/graph/samples?last=3");
  check(bulk.columns.join(",") === "unix_ms,utilization_pct,temperature_c,memory_used,power_mw"
    && bulk.nodes.length === 4 && bulk.nodes.every((n) => n.gpus.every((g) => g.samples.length === 3)),
  "GET /v1/graph/samples?last=3 gives every GPU's 3 newest samples in one answer");

  const page = await signedIn(ADMIN, "admin");
  await page.waitForFunction(() => {
    const gpus = [...document.querySelectorAll("g.gpu")];
    return gpus.length === 14 && gpus.every((g) => g.dataset.memTotal && g.dataset.sampledAt);
  }, null, { timeout: 60000 });
  const history = await page.waitForFunction((n) => {
    const h = Number(document.querySelector('g.gpu[data-gpu="a100-box:0"]').dataset.history);
    return h >= n && h;
  }, kept, { timeout: 5000 });
  check(true, `the sparklines start with the server's samples: a100-box GPU 0 has ${await history.jsonValue()} at once (the server had ${kept} before the page opened)`);
  const sparkLength = await page.$eval('g.gpu[data-gpu="a100-box:0"] path.spark.util', (p) => (p.getAttribute("d") || "").split("L").length);
  check(sparkLength >= kept, `its sparkline is drawn from them (${sparkLength} points)`);

  await checkMemory(page, "the idle fleet");
  const rtx2 = await page.$eval('g.gpu[data-gpu="rtx-1:0"]', (g) => ({ free: Number(g.dataset.memFree), other: Number(g.dataset.memOther) }));
  check(rtx2.other >= 17 * GiB && rtx2.free <= 7 * GiB, `rtx-1 GPU 0 counts the 18 GiB batch job as others': ${gibText(rtx2.free)} GiB free`);
  const links = await page.$$eval("path.edge", (paths) => paths.map((p) => ({ cls: p.getAttribute("class"), members: p.dataset.members })));
  const labels = await page.$$eval(".hub text, .edge-label", (t) => t.map((e) => e.textContent));
  check(links.filter((l) => l.cls.includes("nvlink")).length === 1 && links.find((l) => l.cls.includes("nvlink")).members === "0,1,2,3"
    && labels.some((l) => l.startsWith("NVLink · 600")),
  `the A100s' NVLink island is drawn once, joining GPUs 0–3, with its bandwidth (${labels.find((l) => l.startsWith("NVLink"))})`);
  check(links.filter((l) => l.cls.includes("pcie")).length === 4,
    "one PCIe bus per node (4 paths for 4 nodes, not one line per GPU)");
  check(labels.some((l) => l.startsWith("PCIe 4.0 ×16 · 31.5 GB/s")) && labels.includes("100 Gb/s") && labels.includes("10 Gb/s"),
    "PCIe and network links carry their kind and bandwidth");
  const netText = await page.textContent(".net");
  check(/4 nodes/.test(netText) && !/\b1 (nodes|GPUs)\b/.test(await page.textContent("#graph") + await page.textContent("#fleet")), `counts are written in words that agree ("${netText.trim()}")`);
  let smallest = await smallestText(page);
  check(smallest >= 9, `at 1600×1000 the smallest text of the graph is ${smallest.toFixed(1)} px (≥ 9)`);
  await shot(page, "fleet.png");

  // Power and throttle state on every card (2).
  const powers = await page.$$eval("g.gpu", (gpus) => gpus.map((g) => ({ key: g.dataset.gpu, power: g.dataset.power, text: g.querySelector(".power-text").textContent, throttle: g.querySelector(".throttle-text").textContent })));
  check(powers.every((p) => p.power !== "" && p.text.startsWith(`${p.power} W`) && /throttled/.test(p.throttle)), `each card shows its power and throttle state (${powers[0].key}: "${powers[0].text}", "${powers[0].throttle}")`);

  // Keyboard: Tab reaches a GPU, Enter opens it.
  await page.focus('g.gpu[data-gpu="a100-box:0"]');
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelector("#view-details h2")?.textContent.startsWith("a100-box · GPU 0"));
  check(true, "a GPU focused with the keyboard opens with Enter");

  // ------------------------------------------------------------------ live telemetry
  // The fleet's own load: rtx-1 runs a batch job 15 s of every 30 s (90% busy), and
  // its GPU 2 overheats to 92 °C for 10 s a minute after the start.
  const edge = async (what, low, high, arg) => {
    await page.waitForFunction(low, arg, { timeout: 60000, polling: 100 });
    const seen = await page.waitForFunction(high, arg, { timeout: 60000, polling: "raf" });
    const result = await seen.jsonValue();
    // How soon is a speed figure, for a bench: here it is only reported.
    console.log(`${what} showed ${result.lag} ms after the sample was taken`);
    return result;
  };
  const busy = await edge(
    "rtx-1's batch job (busy 90%)",
    (key) => Number(document.querySelector(`g.gpu[data-gpu="${key}"]`).dataset.util) < 50,
    (key) => {
      const g = document.querySelector(`g.gpu[data-gpu="${key}"]`);
      const text = g.querySelector(".util-text");
      return Number(g.dataset.util) >= 80 && { lag: Date.now() - Number(g.dataset.sampledAt), level: g.dataset.utilLevel, colour: getComputedStyle(text).fill };
    },
    "rtx-1:0",
  );
  check(busy.level === "high" && busy.colour === "rgb(180, 35, 24)", `busy 90% is coloured as high, red (${busy.colour})`);
  const idle = await page.$eval('g.gpu[data-gpu="a100-box:1"]', (g) => ({ level: g.dataset.utilLevel, colour: getComputedStyle(g.querySelector(".util-text")).fill }));
  check(idle.level === "low" && idle.colour === "rgb(26, 127, 55)", `an idle GPU's busy % is green (${idle.colour})`);
  const hot = await edge(
    "rtx-1 GPU 2 heating to 92 °C",
    () => true,
    (node) => {
      const temp = (i) => Number(document.querySelector(`g.gpu[data-gpu="${node}:${i}"]`).dataset.temp);
      const g = document.querySelector(`g.gpu[data-gpu="${node}:2"]`);
      if (temp(2) < 85) return false;
      return { lag: Date.now() - Number(g.dataset.sampledAt), others: [0, 1, 3].map(temp), level: g.dataset.tempLevel, colour: getComputedStyle(g.querySelector(".temp-text")).fill };
    },
    "rtx-1",
  );
  check(hot.others.every((t) => t < 85), `only that GPU is hot (the others of rtx-1 read ${hot.others.join(", ")} °C)`);
  check(hot.level === "high" && hot.colour === "rgb(180, 35, 24)", `92 °C is coloured red (${hot.colour})`);
  // The throttle the API reports shows on the card, and a degraded card is tinted.
  await until("rtx-1 GPU 2 to report thermal throttling", async () => {
    const graph = await api(ADMIN, "GET", "/v1/graph");
    const g = graph.nodes.find((n) => n.inventory.name === "rtx-1").gpus[2];
    return (g.latest.throttle_reasons & (0x8 | 0x20 | 0x40)) !== 0;
  }, 30);
  const throttled = await page.waitForFunction(() => {
    const g = document.querySelector('g.gpu[data-gpu="rtx-1:2"]');
    return /thermal/.test(g.dataset.throttle) && g.dataset.health === "degraded" && {
      text: g.querySelector(".throttle-text").textContent, fill: getComputedStyle(g.querySelector(".card")).fill, cls: g.getAttribute("class"),
    };
  }, null, { timeout: 10000 });
  const t = await throttled.jsonValue();
  check(t.fill === "rgb(255, 246, 220)" && /health-degraded/.test(t.cls), `the throttled GPU says "${t.text}" and its card is tinted as degraded (${t.fill})`);
  const okFill = await page.$eval('g.gpu[data-gpu="a100-box:0"] .card', (r) => getComputedStyle(r).fill);
  check(okFill === "rgb(255, 255, 255)", "a healthy card stays white");
  await shot(page, "spike.png");

  // ------------------------------------------------------------------ placing the lab workflow
  const labRun = await api(ADMIN, "POST", "/v1/runs", {
    workflow: LAB_WORKFLOW, name: "lab-research.yaml", inputs: { figure: "a plot of GPU memory over a week" },
  });
  const placed = await until("the lab workflow's instances to hold their GPUs", async () => {
    const all = await api(ADMIN, "GET", "/v1/instances");
    const mine = all.filter((i) => i.run === labRun.id);
    return mine.length >= 2 && mine.every((i) => i.held.length) ? mine : null;
  });
  for (const instance of placed) {
    for (const [gpu, bytes] of instance.held) {
      const selector = `g.gpu[data-gpu="${instance.node_name}:${gpu}"] rect.shard[data-instance="${instance.name}"]`;
      await page.waitForSelector(selector, { timeout: 10000, state: "attached" });
      const drawn = Number(await page.getAttribute(selector, "data-bytes"));
      if (drawn !== bytes) throw new Error(`${selector} shows ${drawn} bytes, the instance holds ${bytes}`);
    }
    const everywhere = await page.$$eval(`rect.shard[data-instance="${instance.name}"]`, (r) => r.length);
    check(everywhere === instance.held.length,
      `${instance.name} (${instance.agents.join("+")}, ${instance.variant}) shows on exactly its GPUs: ${instance.node_name} ${instance.held.map(([g]) => g).join(", ")}`);
  }
  await checkMemory(page, "with the lab workflow placed");
  // The 70B writer is split over two A100s: both cards name the split (5).
  const writer = placed.find((i) => i.agents.includes("writer"));
  const tp = writer.placement.layout.tensor_parallel;
  const want = `writer · TP${tp} · a100-box ${writer.gpus[0]}–${writer.gpus[writer.gpus.length - 1]}`;
  for (const gpu of writer.gpus) {
    const split = await page.getAttribute(`g.gpu[data-gpu="a100-box:${gpu}"]`, "data-split");
    if (split !== want) throw new Error(`a100-box GPU ${gpu} marks the split as "${split}", expected "${want}"`);
  }
  check(tp === 2 && writer.gpus.length === 2, `the writer's cards both read "${want}"`);
  const fills = await page.$$eval("rect.shard", (r) => r.map((e) => ({ name: e.dataset.instance, fill: e.getAttribute("fill") })));
  const bad = fills.filter((f) => looksLikeHealth(f.fill));
  check(!bad.length, `no instance colour looks like a health colour (${[...new Set(fills.map((f) => f.fill))].join(", ")})${bad.length ? ": " + JSON.stringify(bad) : ""}`);
  await shot(page, "lab-placed.png");
  const coder = placed.find((i) => i.agents.includes("coder"));
  await page.click(`rect.shard[data-instance="${coder.name}"]`);
  await page.waitForSelector(`#view-details .instance[data-instance="${coder.name}"]`);
  const details = await page.textContent("#view-details");
  check(details.includes(coder.variant) && details.includes("Why the planner chose it") && details.includes(`${coder.node_name}: GPU`),
    "an instance opens with its variant, where it is placed and the planner's explanation");
  // Download progress in GiB and percent (9): the hub holds the weights, so it is downloading.
  const loading = await until("an instance with download progress", async () => {
    const all = await api(ADMIN, "GET", "/v1/instances");
    return all.find((i) => i.run === labRun.id && i.download_total > 0 && i.downloaded > 0) || null;
  }, 60);
  await page.click(`rect.shard[data-instance="${loading.name}"]`);
  const progress = await page.waitForFunction((name) => {
    const block = document.querySelector(`#view-details .instance[data-instance="${name}"]`);
    const dd = block?.querySelector("dd.download");
    return dd && { text: dd.textContent, all: block.textContent, max: Number(dd.querySelector("progress").max) };
  }, loading.name, { timeout: 10000 });
  const p = await progress.jsonValue();
  check(new RegExp(`^ ?\\d+\\.\\d of ${gibText(loading.download_total)} GiB \\(\\d+%\\)$`).test(p.text.trim()) && p.max === loading.download_total && !/\d+ of \d+ bytes/.test(p.all),
    `download progress reads "${p.text.trim()}" (of ${loading.download_total} bytes), no raw byte counts`);
  await shot(page, "lab-instance.png");

  // ------------------------------------------------------------------ a model split across machines (10)
  // Llama 3 70B in 4 bits (about 40 GiB) on rtx-1 (four 4090s, 18 GiB of each taken by
  // the batch job) and old-1 (two 16 GB V100s): neither node holds it alone.
  const splitWorkflow = `name: split
agents:
  big:
    model:
      repo: meta-llama/Meta-Llama-3-70B-Instruct
      context: 4096
      min_precision: int4
      gpu: { nodes: [rtx-1, old-1] }
steps:
  - { id: one, agent: big, prompt: "Hello." }
`;
  const plan = await api(ADMIN, "POST", "/v1/plans", { workflow: splitWorkflow, name: "split.yaml" });
  const planned = plan.instances[0];
  const planNodes = [...new Set(planned.devices.filter((d) => d.gpu != null).map((d) => d.node))].sort();
  check(plan.admitted && planNodes.join(",") === "old-1,rtx-1",
    `the plan splits big over ${planNodes.join(" + ")} (${planned.variant}, ${planned.layout.pipeline_stages} stages)`);
  const splitRun = await api(ADMIN, "POST", "/v1/runs", { workflow: splitWorkflow, name: "split.yaml" });
  const splitState = async () => JSON.stringify({
    run: await api(ADMIN, "GET", `/v1/runs/${splitRun.id}`).then((r) => ({ state: r.state, reason: r.reason, steps: r.steps.map((s) => [s.state, s.error]) })),
    instances: (await api(ADMIN, "GET", "/v1/instances")).filter((i) => i.run === splitRun.id || i.part_of).map((i) => ({ name: i.name, node: i.node_name, state: i.state, held: i.held, part_of: i.part_of, pieces: i.pieces, detail: i.detail, devices: i.placement?.devices?.map((d) => [d.node, d.gpu, d.layers]), layout: i.placement?.layout })),
  });
  setTimeout(async () => console.log(`split after 20 s: ${await splitState().catch((e) => e.message)}`), 20000);
  // The pieces (llama.cpp RPC servers) start on the other node and hold its GPUs while
  // the head downloads the weights (which the hub holds).
  const replica = await until("the split replica's pieces on both nodes", async () => {
    const all = await api(ADMIN, "GET", "/v1/instances");
    const head = all.find((i) => i.run === splitRun.id && !i.part_of && i.placement);
    if (!head) return null;
    const pieces = all.filter((i) => i.part_of === head.name);
    const nodes = new Set([head, ...pieces].filter((i) => i.held.length).map((i) => i.node_name));
    return nodes.size >= 2 ? { head, pieces } : null;
  }, 60);
  const devices = replica.head.placement.devices.filter((d) => d.gpu != null);
  for (const d of devices) {
    const key = `${d.node}:${d.gpu}`;
    const [a, b] = d.layers.split("..").map(Number);
    const mark = await page.waitForFunction((k) => document.querySelector(`g.gpu[data-gpu="${k}"]`)?.dataset.split, key, { timeout: 10000 });
    const text = await mark.jsonValue();
    if (!text.startsWith(`big · layers ${a}–${b - 1} · `) || !/ · (rtx-1 [\d–,]+ \+ old-1|old-1 [\d–,]+ \+ rtx-1) [\d–,]+$/.test(text)) {
      throw new Error(`${key} marks the split as "${text}", expected big · layers ${a}–${b - 1} · NODE GPUS + NODE GPUS over rtx-1 and old-1`);
    }
  }
  const sample = await page.getAttribute(`g.gpu[data-gpu="${devices[0].node}:${devices[0].gpu}"]`, "data-split");
  const link = await page.$eval(`g.split-link[data-instance="${replica.head.name}"]`, (g) => g.dataset.nodes);
  check(link.split(",").sort().join(",") === "old-1,rtx-1",
    `the page marks the split across both machines' ${devices.length} GPUs ("${sample}") and joins the two node boxes`);
  const colours = new Set(await page.$$eval("rect.shard", (r, names) => r.filter((e) => names.includes(e.dataset.instance)).map((e) => e.getAttribute("fill")), [replica.head.name, ...replica.pieces.map((p) => p.name)]));
  await page.mouse.move(600, 500);
  await page.mouse.wheel(0, 350);
  await page.waitForTimeout(200);
  await shot(page, "split.png");
  keep("split-graph.json", JSON.stringify(await api(ADMIN, "GET", "/v1/graph"), null, 1));
  keep("split-instances.json", JSON.stringify(await api(ADMIN, "GET", "/v1/instances"), null, 1));
  await page.click("#fit");
  check(colours.size === 1, `the replica and its pieces share one colour (${[...colours].join(", ")})`);

  // ------------------------------------------------------------------ host RAM offload (5)
  // The same model allowed only on old-1 (two 16 GB V100s): the GPUs take what they
  // hold and the rest of the layers go to old-1's host RAM, which its node box shows.
  await api(ADMIN, "POST", `/v1/runs/${splitRun.id}/cancel`);
  await until("the split replica to stop", async () => {
    const all = await api(ADMIN, "GET", "/v1/instances");
    return !all.some((i) => (i.run === splitRun.id || i.part_of === replica.head.name) && !["stopped", "lost", "failed"].includes(i.state));
  }, 60);
  const offloadRun = await api(ADMIN, "POST", "/v1/runs", { workflow: splitWorkflow.replace("nodes: [rtx-1, old-1]", "nodes: [old-1]").replace("name: split", "name: offload"), name: "offload.yaml" });
  const offloaded = await until("an instance with layers in old-1's host RAM", async () => {
    const all = await api(ADMIN, "GET", "/v1/instances");
    const inst = all.find((i) => i.run === offloadRun.id && i.placement);
    if (!inst) return null;
    const host = inst.placement.devices.filter((d) => d.gpu == null && d.node === "old-1");
    return host.length ? { inst, bytes: host.reduce((a, d) => a + d.reserved, 0), layers: host[0].layers } : null;
  }, 60);
  const box = await page.waitForFunction((bytes) => {
    const g = document.querySelector('g.node[data-node="old-1"]');
    return Number(g.dataset.offload) === bytes && g.querySelector(".node-offload").textContent;
  }, offloaded.bytes, { timeout: 10000 });
  const offloadText = await box.jsonValue();
  check(offloadText.startsWith("host RAM offload: big ") && offloadText.includes(`layers ${offloaded.layers.replace("..", "–")}`),
    `old-1's box shows the host offload ("${offloadText}", ${offloaded.bytes} bytes as the plan reserves)`);
  keep("offload-instances.json", JSON.stringify(await api(ADMIN, "GET", "/v1/instances"), null, 1));
  await api(ADMIN, "POST", `/v1/runs/${offloadRun.id}/cancel`);

  // ------------------------------------------------------------------ the GPU table (3)
  await page.click("#view-toggle");
  await page.waitForSelector("#gpu-table tbody tr");
  const rows = await page.$$eval("#gpu-table tbody tr", (trs) => trs.map((tr) => Object.fromEntries([...tr.cells].map((c) => [c.dataset.col, c.textContent]).concat([["key", tr.dataset.gpu]]))));
  const graphNow = await api(ADMIN, "GET", "/v1/graph");
  check(rows.length === 14 && rows.every((r) => {
    const [node, index] = r.key.split(":");
    const g = graphNow.nodes.find((n) => n.inventory.name === node).gpus[Number(index)];
    return r.node === node && g.facts.name.endsWith(r.model) && ["ok", "degraded", "down", "drained"].includes(r.health);
  }), "the table lists the 14 GPUs with their node, model and health");
  const sortBy = async (key) => {
    await page.click(`#gpu-table button[data-sort="${key}"]`);
    return page.$$eval("#gpu-table tbody tr", (trs, k) => trs.map((tr) => tr.querySelector(`td[data-col="${k}"]`).textContent), key);
  };
  const free1 = (await sortBy("free")).map(Number);
  check(free1.every((v, i) => i === 0 || free1[i - 1] >= v), `sorting by free puts the most free first (${free1.slice(0, 3).join(", ")} …)`);
  const free2 = (await sortBy("free")).map(Number);
  check(free2.every((v, i) => i === 0 || free2[i - 1] <= v), "a second click reverses it");
  const sortedTemp = (await sortBy("temp")).map(Number);
  check(sortedTemp.every((v, i) => i === 0 || sortedTemp[i - 1] >= v) && await page.getAttribute('#gpu-table th:has(button[data-sort="temp"])', "aria-sort") === "descending",
    "sorting by temperature puts the hottest first, and says so (aria-sort)");
  await shot(page, "table.png");
  await page.click('#gpu-table tbody tr[data-gpu="old-1:1"]');
  await page.waitForFunction(() => document.querySelector("#view-details h2")?.textContent.startsWith("old-1 · GPU 1"));
  check(true, "a row opens its GPU");
  await page.click("#view-toggle");
  await page.waitForSelector("#graph-pane:not([hidden])");

  // ------------------------------------------------------------------ a laptop window (1280×800)
  const laptop = await signedIn(ADMIN, "admin-1280", { width: 1280, height: 800 });
  await laptop.waitForFunction(() => document.querySelectorAll("g.gpu").length === 14, null, { timeout: 60000 });
  smallest = await smallestText(laptop);
  const scale = Number(await laptop.getAttribute("#graph", "data-scale"));
  check(smallest >= 9, `at 1280×800 the graph stays readable: smallest text ${smallest.toFixed(1)} px at zoom ${scale} (scroll for the rest)`);
  await laptop.mouse.move(500, 400);
  await laptop.mouse.wheel(0, 400);
  await laptop.waitForTimeout(100);
  check(Number(await laptop.getAttribute("#graph", "data-scale")) === scale, "the mouse wheel scrolls the graph instead of shrinking it");
  await shot(laptop, "laptop.png");
  await laptop.context().close();

  await api(ADMIN, "POST", `/v1/runs/${labRun.id}/cancel`);

  // ------------------------------------------------------------------ users and migration
  const ada = (await api(ADMIN, "POST", "/v1/tokens", { user: "ada" })).token;
  const bob = (await api(ADMIN, "POST", "/v1/tokens", { user: "bob" })).token;
  // A serving run of the tiny model, with a reflex that notes rtx-1's batch job.
  const chat = `name: chat
agents:
  chat:
    model: { repo: ${TINY}, context: 512 }
reflexes:
  - name: rtx-1-busy
    when: 'gpu.util > 0.8'
    scope: { node: rtx-1 }
    do: [ { notify: "rtx-1 is busy" } ]
    cooldown: 1m
`;
  const session = async (token) => {
    const run = await api(token, "POST", "/v1/runs", { workflow: chat, name: "chat.yaml" });
    const created = await api(token, "POST", "/v1/sessions", { agent: "chat", run: run.id });
    await api(token, "POST", `/v1/sessions/${created.id}/messages`, { content: "Say hello." });
    return [run, await api(token, "GET", `/v1/sessions/${created.id}`)];
  };
  const [adaRun, adaSession] = await session(ada);
  const [bobRun, bobSession] = await session(bob);
  check(!!adaSession.binding, `ada's session ${adaSession.id} is on ${adaSession.binding.node}:${adaSession.binding.gpus}`);

  // ada at 1280×800, remembering her token in this browser (9).
  const adaPage = await signedIn(ada, "ada", { width: 1280, height: 800 }, true);
  check(await adaPage.evaluate(() => localStorage.getItem("skein.token")) === ada, "with the box ticked, the token is kept in this browser (localStorage)");
  const again = await adaPage.context().newPage();
  watch(again, "ada-2");
  await again.goto(API + "/");
  await again.waitForSelector('#connection[data-state="live"]', { timeout: 30000 });
  check(!(await again.$("#login[open]")), "a new tab of the same browser is signed in without asking");
  await again.close();
  await adaPage.click("#tab-sessions");
  await adaPage.waitForSelector(`tr[data-session="${adaSession.id}"]`);
  check(await adaPage.$(`tr[data-session="${bobSession.id}"]`) === null, "ada does not see bob's session");
  // The Migrate button is in view, and no table overflows the panel (8, 9).
  const visible = await adaPage.$eval(`#migrate-${adaSession.id}`, (b) => {
    const r = b.getBoundingClientRect();
    const panel = document.querySelector("#panel").getBoundingClientRect();
    const at = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
    return { inside: r.left >= panel.left && r.right <= panel.right && r.width > 0, hit: at === b || b.contains(at) };
  });
  check(visible.inside && visible.hit, "at 1280×800 the Migrate button is visible inside the panel");
  await adaPage.click("#tab-runs");
  await adaPage.waitForSelector(`tr[data-run="${adaRun.id}"]`);
  check(await adaPage.$(`tr[data-run="${bobRun.id}"]`) === null && await adaPage.$(`tr[data-run="${labRun.id}"]`) === null,
    "ada sees her run, not bob's nor the admin's");
  const overflow = await adaPage.evaluate(() => [...document.querySelectorAll(".view:not([hidden])")].map((v) => v.scrollWidth - v.clientWidth));
  check(overflow.every((o) => o <= 1), `no table overflows the panel (${overflow.join(", ")} px)`);

  await adaPage.click("#tab-sessions");
  const from = `${adaSession.binding.node}:${adaSession.binding.gpus.join(",")}`;
  const target = adaSession.binding.node === "rtx-2" ? "rtx-1:1" : "rtx-2:1";
  await adaPage.click(`#migrate-${adaSession.id}`);
  await adaPage.selectOption(`#migrate-to-${adaSession.id}`, target);
  await adaPage.click(`#migrate-go-${adaSession.id}`);
  await adaPage.waitForFunction(() => /^(Moved|Could not)/.test(document.querySelector("#migrate-result").textContent), null, { timeout: 180000 });
  const result = await adaPage.textContent("#migrate-result");
  check(result.startsWith("Moved"), `the page moved the session: "${result}"`);
  const moved = await api(ada, "GET", `/v1/sessions/${adaSession.id}`);
  const now = `${moved.binding.node}:${moved.binding.gpus.join(",")}`;
  check(now === target && now !== from, `the session is now on ${now} (was ${from})`);
  await adaPage.waitForFunction(([id, place]) => document.querySelector(`tr[data-session="${id}"] .gpu-cell`)?.textContent === place,
    [adaSession.id, target], { timeout: 10000 });
  await api(ada, "POST", `/v1/sessions/${adaSession.id}/messages`, { content: "Still there?" });
  await adaPage.waitForFunction((id) => document.querySelector(`tr[data-session="${id}"] td.num`)?.textContent === "4", adaSession.id, { timeout: 10000 });
  check(true, "the row follows the session live: its new GPU, then its 4 messages after another turn");
  await shot(adaPage, "migrated.png");

  // The reflex timeline: ada's reflex fires with rtx-1's next batch job (every 30 s).
  await adaPage.click("#tab-events");
  await adaPage.waitForSelector('.event[data-reflex="rtx-1-busy"]', { timeout: 60000 });
  const fired = await adaPage.textContent('.event[data-reflex="rtx-1-busy"]');
  check(/gpu\.util = 0\.9/.test(fired) && /notify/.test(fired) && /done/.test(fired),
    `ada's reflex shows in her timeline with the value that fired it and its action ("${fired.replace(/\s+/g, " ").trim()}")`);
  await shot(adaPage, "events.png");
  // Long reasons wrap inside the panel (9).
  const wraps = await adaPage.evaluate(() => {
    const probe = document.querySelector("#view-events").appendChild(Object.assign(document.createElement("div"), { className: "error reason", textContent: "x".repeat(400) }));
    const fits = probe.scrollWidth <= probe.parentElement.clientWidth && getComputedStyle(probe).overflowWrap === "anywhere";
    probe.remove();
    return fits;
  });
  check(wraps, "a long failure reason wraps inside the panel");

  // Usage: ada's session turns are counted for her; she sees her own usage only.
  await adaPage.click("#tab-usage");
  await adaPage.waitForSelector("#usage-chart", { timeout: 30000 });
  await adaPage.selectOption("#usage-metric", "requests");
  await adaPage.waitForSelector('#usage-chart rect[data-user="ada"]', { timeout: 10000 });
  const usage = await adaPage.evaluate(() => ({
    users: [...document.querySelectorAll("#usage-users tbody tr")].map((r) => [r.cells[0].textContent, Number(r.cells[3].textContent)]),
    groups: [...document.querySelectorAll("#usage-groups tbody tr")].map((r) => r.cells[0].textContent),
    overflow: document.querySelector("#view-usage").scrollWidth - document.querySelector("#view-usage").clientWidth,
  }));
  check(usage.users.length === 1 && usage.users[0][0] === "ada" && usage.users[0][1] >= 2,
    `the Usage tab shows ada's requests alone (${JSON.stringify(usage.users)})`);
  check(usage.groups.includes("default") && usage.overflow <= 1, `the groups are listed (${usage.groups.join(", ")}) and nothing overflows the panel`);
  await shot(adaPage, "usage.png");
  await adaPage.context().close();

  // ------------------------------------------------------------------ a phone (390×844) (8)
  const phone = await signedIn(ADMIN, "phone", { width: 390, height: 844 });
  await phone.waitForFunction(() => document.querySelectorAll("g.gpu").length === 14, null, { timeout: 60000 });
  const sizes = await phone.evaluate(() => {
    const g = document.querySelector("#graph-pane").getBoundingClientRect();
    const p = document.querySelector("#panel").getBoundingClientRect();
    return { gw: g.width, gh: g.height, gb: g.bottom, pt: p.top, pw: p.width, doc: document.documentElement.scrollWidth };
  });
  check(sizes.gw >= 380 && sizes.gh >= 300 && sizes.pt >= sizes.gb - 1 && sizes.pw >= 380 && sizes.doc <= 390,
    `at 390×844 the graph is ${sizes.gw}×${sizes.gh} px with the panel under it (${sizes.pw} px wide), nothing wider than the screen`);
  smallest = await smallestText(phone);
  check(smallest >= 9, `on the phone the smallest text is ${smallest.toFixed(1)} px`);
  await shot(phone, "phone.png");
  // Tap the first GPU card wholly on the screen.
  const tap = await phone.evaluate(() => {
    const pane = document.querySelector("#graph-pane").getBoundingClientRect();
    for (const g of document.querySelectorAll("g.gpu")) {
      const r = g.querySelector(".card").getBoundingClientRect();
      if (r.left >= pane.left && r.right <= pane.right && r.top >= pane.top && r.bottom <= pane.bottom - 60) {
        return { key: g.dataset.gpu, x: r.left + r.width / 2, y: r.top + 12 };
      }
    }
    return null;
  });
  check(!!tap, `a GPU card fits the phone's screen whole (${tap?.key})`);
  await phone.mouse.click(tap.x, tap.y);
  const [tapNode, tapIndex] = tap.key.split(":");
  await phone.waitForFunction((title) => document.querySelector("#view-details h2")?.textContent.startsWith(title), `${tapNode} · GPU ${tapIndex}`);
  const detailsWidth = await phone.evaluate(() => { const v = document.querySelector("#view-details"); return v.scrollWidth - v.clientWidth; });
  check(detailsWidth <= 1, "a GPU opens with a tap, its details fit the screen");
  await phone.evaluate(() => document.querySelector("#panel").scrollIntoView());
  await shot(phone, "phone-details.png");
  await phone.context().close();

  // ------------------------------------------------------------------ reconnecting, stale values (6)
  // Before the server stops: the page may see its stream break before `stopped` is read.
  outage = true;
  await ask("@stop", "stopped");
  await page.waitForSelector('#connection[data-state="lost"]', { timeout: 30000 });
  const lost = await page.evaluate(() => ({
    text: document.querySelector("#connection").textContent,
    last: Number(document.querySelector("#connection").dataset.lastUpdate),
    stale: document.body.classList.contains("stale"),
    fill: getComputedStyle(document.querySelector('g.gpu[data-gpu="a100-box:0"] .util-text')).fill,
  }));
  const lastText = await page.evaluate((t) => new Date(t).toLocaleTimeString(), lost.last);
  check(/connection lost/.test(lost.text) && lost.stale && lost.last > 0 && lost.text.includes(`values as of ${lastText}`) && lost.fill === "rgb(138, 147, 159)",
    `a lost connection greys the values and says when they are from ("${lost.text}")`);
  await shot(page, "connection-lost.png");
  await ask("@start", "started");
  await page.waitForSelector('#connection[data-state="live"]', { timeout: 60000 });
  outage = false;
  await page.waitForFunction(() => document.querySelectorAll("g.gpu").length === 14, null, { timeout: 60000 });
  check(!(await page.evaluate(() => document.body.classList.contains("stale"))), "the page reconnects by itself once the server is back, live values again");

  // ------------------------------------------------------------------ an 8-GPU node wraps (3)
  await ask("@dgx", "dgx");
  await page.waitForFunction(() => document.querySelectorAll('g.node[data-node="dgx-1"] g.gpu').length === 8, null, { timeout: 60000 });
  const rowsOf = await page.$$eval('g.node[data-node="dgx-1"] g.gpu', (gs) => [...new Set(gs.map((g) => g.getAttribute("transform").match(/,([\d.]+)\)/)[1]))].length);
  const nvlink = await page.$$eval('g.node[data-node="dgx-1"] path.edge.nvlink', (p) => p.map((e) => e.dataset.members));
  const pcie = await page.$$eval('g.node[data-node="dgx-1"] path.edge.pcie', (p) => p.length);
  check(rowsOf === 2 && pcie === 1 && nvlink.length === 1 && nvlink[0] === "0,1,2,3,4,5,6,7",
    "dgx-1's 8 GPUs wrap into 2 rows of 4, on one PCIe bus, with one NVLink island joining all 8");
  await page.click("#fit");
  smallest = await smallestText(page);
  check(smallest >= 9, `with 5 nodes and 22 GPUs Fit keeps the text at ${smallest.toFixed(1)} px`);
  // Scroll (the wheel pans) until dgx-1's box is at the top of the graph.
  const graphTop = await page.$eval("#graph", (svg) => svg.getBoundingClientRect().top);
  const dgxTop = await page.$eval('g.node[data-node="dgx-1"]', (g) => g.getBoundingClientRect().top);
  await page.mouse.move(600, 500);
  await page.mouse.wheel(0, dgxTop - graphTop - 20);
  await page.waitForTimeout(200);
  const dgxBox = await page.$eval('g.node[data-node="dgx-1"]', (g) => { const r = g.getBoundingClientRect(); return { top: r.top, bottom: r.bottom }; });
  check(dgxBox.top >= graphTop && dgxBox.top < graphTop + 200, `the wheel scrolls dgx-1 into view (its box at ${Math.round(dgxBox.top - graphTop)} px from the top)`);
  // Scrolling far past the end stops with the graph's last node still in view.
  await page.mouse.wheel(0, 20000);
  await page.waitForTimeout(200);
  const lastBottom = await page.$$eval("g.node", (gs) => Math.max(...gs.map((g) => g.getBoundingClientRect().bottom)));
  check(lastBottom > graphTop + 100, `scrolling past the end stops at the graph's edge (its last node ends ${Math.round(lastBottom - graphTop)} px below the top)`);
  await page.mouse.wheel(0, -20000);
  await page.mouse.wheel(0, dgxTop - graphTop - 20);
  await page.waitForTimeout(200);
  await shot(page, "dgx.png");
  keep("dgx-graph.json", JSON.stringify(await api(ADMIN, "GET", "/v1/graph"), null, 1));
  keep("live.txt", await liveBytes(2500));

  watching = false;
  check(pageErrors.length === 0, `no console error, failed request or error answer on the page${pageErrors.length ? ": " + pageErrors.join("; ") : ""}`);
  await browser.close();
  process.exit(0);
} catch (error) {
  watching = false;
  console.error(`FAILED: ${error.stack || error}`);
  for (const context of browser.contexts()) {
    for (const [i, p] of context.pages().entries()) {
      await p.screenshot({ path: join(ARTIFACTS, `failure-${i}.png`) }).catch(() => {});
    }
  }
  if (pageErrors.length) console.error(`page errors: ${pageErrors.join("; ")}`);
  await browser.close().catch(() => {});
  process.exit(1);
}
