// Browser tests of Skein's web page, in Debian's headless Chromium driven by
// playwright-core. tests/web_ui.rs runs this against `skein up --fleet
// workflows/fleets/lab.yaml` (simulated GPUs, a mock hub), with:
//
//   SKEIN_API           the server's base URL
//   SKEIN_ADMIN_TOKEN   the admin's API token
//   SKEIN_LAB_WORKFLOW  the text of workflows/lab-research.yaml
//   SKEIN_TINY_REPO     the tiny test model's repository
//   SKEIN_ARTIFACTS     where screenshots go
//
// and answers two requests on stdin: it prints `@stop` (the test kills the server
// and answers `stopped`) and `@start` (the test starts it again and answers
// `started`). Every check prints a line; any failure exits non-zero with the reason.

import { chromium } from "playwright-core";
import { createInterface } from "node:readline";
import { mkdirSync } from "node:fs";
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

const pageErrors = [];
async function signedIn(token, name) {
  const context = await browser.newContext({ viewport: { width: 1600, height: 1000 }, deviceScaleFactor: 1 });
  const page = await context.newPage();
  page.on("pageerror", (error) => pageErrors.push(`${name}: ${error.message}`));
  await page.goto(API + "/");
  await page.locator("#token").fill(token);
  await page.locator("#sign-in").click();
  await page.waitForSelector('#connection[data-state="live"]', { timeout: 30000 });
  return page;
}

const shot = async (page, name) => {
  const path = join(ARTIFACTS, name);
  await page.screenshot({ path });
  console.log(`screenshot: ${path}`);
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

  // ------------------------------------------------------------------ the fleet
  const page = await signedIn(ADMIN, "admin");
  await page.waitForFunction(() => {
    const gpus = [...document.querySelectorAll("g.gpu")];
    return gpus.length === 14 && gpus.every((g) => g.dataset.memTotal && g.dataset.sampledAt);
  }, null, { timeout: 60000 });
  const graph = await api(ADMIN, "GET", "/v1/graph");
  const shown = await page.$$eval("g.gpu", (gpus) => gpus.map((g) => ({
    key: g.dataset.gpu, total: Number(g.dataset.memTotal), text: g.querySelector(".mem-text").textContent,
  })));
  const byKey = new Map(shown.map((g) => [g.key, g]));
  let count = 0;
  for (const node of graph.nodes) {
    for (const gpu of node.gpus) {
      const key = `${node.inventory.name}:${gpu.facts.index}`;
      const g = byKey.get(key);
      if (!g) throw new Error(`GPU ${key} is not on the page`);
      if (g.total !== gpu.facts.memory_total) throw new Error(`GPU ${key} shows ${g.total} bytes, the graph says ${gpu.facts.memory_total}`);
      const gib = (gpu.facts.memory_total / GiB).toFixed(1);
      if (!g.text.endsWith(`/ ${gib} GiB used`)) throw new Error(`GPU ${key} reads "${g.text}", expected "… / ${gib} GiB used"`);
      count++;
    }
  }
  check(count === 14, "the 14 reference GPUs are on the page, each with its memory (A100 80 GiB, RTX 4090 24 GiB, V100 15.8 GiB)");
  const links = await page.$$eval("path.edge", (paths) => paths.map((p) => p.getAttribute("class")));
  const labels = await page.$$eval(".hub text, .edge-label", (t) => t.map((e) => e.textContent));
  check(links.filter((c) => c.includes("nvlink")).length === 4 && labels.some((l) => l.startsWith("NVLink · 600")),
    `the A100s' NVLink is drawn with its bandwidth (${labels.find((l) => l.startsWith("NVLink"))})`);
  check(labels.some((l) => l.startsWith("PCIe 4.0 ×16 · 31.5 GB/s")) && labels.includes("100 Gb/s") && labels.includes("10 Gb/s"),
    "PCIe and network links carry their kind and bandwidth");
  await shot(page, "fleet.png");

  // Keyboard: Tab reaches a GPU, Enter opens it.
  await page.focus('g.gpu[data-gpu="a100-box:0"]');
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelector("#view-details h2")?.textContent.startsWith("a100-box · GPU 0"));
  check(true, "a GPU focused with the keyboard opens with Enter");

  // ------------------------------------------------------------------ live telemetry
  // The fleet's own load: rtx-1 runs a batch job 15 s of every 30 s (90% busy), and
  // its GPU 2 overheats to 92 °C for 10 s a minute after the start.
  // Waits for `low` to hold, then for `high` (checked every frame: its result has the
  // lag from the sample's time to the moment the page showed it).
  const edge = async (what, low, high, arg) => {
    await page.waitForFunction(low, arg, { timeout: 60000, polling: 100 });
    const seen = await page.waitForFunction(high, arg, { timeout: 60000, polling: "raf" });
    const result = await seen.jsonValue();
    check(result.lag <= 2000, `${what} shows ${result.lag} ms after the sample was taken (≤ 2000 ms)`);
    return result;
  };
  await edge(
    "rtx-1's batch job (busy 90%)",
    (key) => Number(document.querySelector(`g.gpu[data-gpu="${key}"]`).dataset.util) < 50,
    (key) => {
      const g = document.querySelector(`g.gpu[data-gpu="${key}"]`);
      return Number(g.dataset.util) >= 80 && { lag: Date.now() - Number(g.dataset.sampledAt) };
    },
    "rtx-1:0",
  );
  const hot = await edge(
    "rtx-1 GPU 2 heating to 92 °C",
    () => true,
    (node) => {
      const temp = (i) => Number(document.querySelector(`g.gpu[data-gpu="${node}:${i}"]`).dataset.temp);
      const g = document.querySelector(`g.gpu[data-gpu="${node}:2"]`);
      if (temp(2) < 85) return false;
      return { lag: Date.now() - Number(g.dataset.sampledAt), others: [0, 1, 3].map(temp) };
    },
    "rtx-1",
  );
  check(hot.others.every((t) => t < 85), `only that GPU is hot (the others of rtx-1 read ${hot.others.join(", ")} °C)`);
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
  await shot(page, "lab-placed.png");
  const coder = placed.find((i) => i.agents.includes("coder"));
  await page.click(`rect.shard[data-instance="${coder.name}"]`);
  await page.waitForSelector(`#view-details .instance[data-instance="${coder.name}"]`);
  const details = await page.textContent("#view-details");
  check(details.includes(coder.variant) && details.includes("Why the planner chose it") && details.includes(`${coder.node_name}: GPU`),
    "an instance opens with its variant, where it is placed and the planner's explanation");
  await shot(page, "lab-instance.png");
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

  const adaPage = await signedIn(ada, "ada");
  await adaPage.click("#tab-sessions");
  await adaPage.waitForSelector(`tr[data-session="${adaSession.id}"]`);
  check(await adaPage.$(`tr[data-session="${bobSession.id}"]`) === null, "ada does not see bob's session");
  await adaPage.click("#tab-runs");
  await adaPage.waitForSelector(`tr[data-run="${adaRun.id}"]`);
  check(await adaPage.$(`tr[data-run="${bobRun.id}"]`) === null && await adaPage.$(`tr[data-run="${labRun.id}"]`) === null,
    "ada sees her run, not bob's nor the admin's");

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

  // ------------------------------------------------------------------ reconnecting
  await ask("@stop", "stopped");
  await page.waitForSelector('#connection[data-state="lost"]', { timeout: 30000 });
  const lost = await page.textContent("#connection");
  check(/connection lost/.test(lost), `a lost connection is shown ("${lost}")`);
  await shot(page, "connection-lost.png");
  await ask("@start", "started");
  await page.waitForSelector('#connection[data-state="live"]', { timeout: 60000 });
  await page.waitForFunction(() => document.querySelectorAll("g.gpu").length === 14, null, { timeout: 60000 });
  check(true, "the page reconnects by itself once the server is back");

  check(pageErrors.length === 0, `no script error on the page${pageErrors.length ? ": " + pageErrors.join("; ") : ""}`);
  await browser.close();
  process.exit(0);
} catch (error) {
  console.error(`FAILED: ${error.stack || error}`);
  for (const context of browser.contexts()) {
    for (const [i, p] of context.pages().entries()) {
      await p.screenshot({ path: join(ARTIFACTS, `failure-${i}.png`) }).catch(() => {});
    }
  }
  if (pageErrors.length) console.error(`script errors: ${pageErrors.join("; ")}`);
  await browser.close().catch(() => {});
  process.exit(1);
}
