// Deciding from the page what waits for a person, in Debian's headless Chromium driven
// by playwright-core. tests/web_ui.rs runs this against a real `skein server` whose run
// RUN has a `for_each` step `work` with two items, each waiting because its tool call
// was in flight under `in_flight: ask` when the server was killed, and after it an
// approval step `publish`. With:
//
//   SKEIN_API           the server's base URL
//   SKEIN_ADMIN_TOKEN   the admin's API token
//   SKEIN_RUN           the run's id
//   SKEIN_ARTIFACTS     where screenshots go
//
// It checks that each waiting item shows its index and its question as text (arguments
// that look like HTML stay text), that Approve posts `{"comment", "item"}` and the page
// follows the answer, that a refusal (409: the item was decided meanwhile through the
// API) is said and stays said while the live view drops the item, and that the
// approval step after it is decided from the page as before. Every check prints a
// line; any failure exits non-zero with the reason. Any console error, failed request
// or 4xx/5xx answer fails it, but for the one refusal it provokes.

import { chromium } from "playwright-core";
import { join } from "node:path";

const API = process.env.SKEIN_API;
const ADMIN = process.env.SKEIN_ADMIN_TOKEN;
const RUN = process.env.SKEIN_RUN;
const ARTIFACTS = process.env.SKEIN_ARTIFACTS;
const PATIENCE_MS = 120000;

const check = (ok, message) => {
  if (!ok) throw new Error(message);
  console.log(`ok: ${message}`);
};

async function api(method, path, body) {
  const response = await fetch(API + path, {
    method,
    headers: { Authorization: `Bearer ${ADMIN}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});

// The refusal this test provokes: item 1's reject, answered 409.
const REFUSED = `/v1/runs/${RUN}/steps/work/reject`;
const problems = [];
const dialogs = [];

try {
  const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
  const page = await context.newPage();
  page.on("pageerror", (error) => problems.push(`script error: ${error.message}`));
  page.on("dialog", (dialog) => { dialogs.push(dialog.message()); dialog.dismiss().catch(() => {}); });
  page.on("console", (message) => {
    if (message.type() !== "error") return;
    const url = message.location()?.url || "";
    if (url.endsWith(REFUSED) && /409/.test(message.text())) return;
    problems.push(`console error: ${message.text()} (${url || "?"})`);
  });
  page.on("requestfailed", (request) => {
    const why = request.failure()?.errorText || "";
    if (why !== "net::ERR_ABORTED") problems.push(`request failed: ${request.method()} ${request.url()} (${why})`);
  });
  page.on("response", (response) => {
    if (response.status() < 400) return;
    if (response.status() === 409 && response.url().endsWith(REFUSED)) return;
    problems.push(`${response.status()} for ${response.request().method()} ${response.url()}`);
  });

  await page.goto(API + "/");
  await page.locator("#token").fill(ADMIN);
  await page.locator("#sign-in").click();
  await page.waitForSelector('#connection[data-state="live"]', { timeout: 30000 });
  await page.locator("#tab-runs").click();
  await page.locator(`tr[data-run="${RUN}"] button`).click();

  // ------------------------------------------------------------ each item's question
  const before = await api("GET", `/v1/runs/${RUN}`);
  const items = before.steps.find((s) => s.id === "work").items;
  const item = (n) => `#run-detail section.approval[data-approval="work"][data-item="${n}"]`;
  for (const n of [0, 1]) {
    await page.waitForSelector(item(n), { timeout: PATIENCE_MS });
    const shown = await page.$eval(item(n), (section) => ({
      title: section.querySelector("h4").textContent,
      text: section.querySelector("blockquote").textContent,
      elements: section.querySelector("blockquote").children.length,
      hint: section.querySelector("p.hint:last-child").textContent,
    }));
    const question = items[n].approval.text;
    check(shown.title === `work item ${n}: waiting for approval`, `item ${n} waits, by its index: "${shown.title}"`);
    check(shown.text === question && shown.elements === 0,
      `item ${n}'s question is shown as the API gives it, as text: "${shown.text.slice(0, 80)}…"`);
    check(shown.hint.includes(`skein run approve ${RUN} work --item ${n}`) && shown.hint.includes(`skein run reject ${RUN} work --item ${n}`),
      `item ${n} names the CLI's commands with --item ${n}`);
  }
  check(items[0].approval.text.includes("<img src=x onerror=alert(1)>"), "the question quotes the call's arguments, which look like HTML");
  check(await page.locator("#run-detail img").count() === 0 && dialogs.length === 0, "no element and no script came of the quoted HTML");
  const progress = await page.locator('#run-detail tr[data-step="work"] .hint').textContent();
  check(progress === "0/2 done, 2 waiting for approval", `the steps table counts the items waiting: "${progress}"`);
  await page.screenshot({ path: join(ARTIFACTS, "web-item-approvals.png") });

  // ------------------------------------------------------------ Approve posts the item
  await page.locator("#approval-work-item-0-comment").fill("  it may have run; twice is fine  ");
  const [posted] = await Promise.all([
    page.waitForRequest((r) => r.method() === "POST" && r.url().endsWith(`/v1/runs/${RUN}/steps/work/approve`)),
    page.locator("#approval-work-item-0-approve").click(),
  ]);
  check(JSON.stringify(posted.postDataJSON()) === JSON.stringify({ comment: "it may have run; twice is fine", item: 0 }),
    `Approve posts ${posted.postData()} to POST /v1/runs/RUN/steps/work/approve`);
  await page.waitForSelector(item(0), { state: "detached", timeout: PATIENCE_MS });
  const said = await page.locator("#decision-result").textContent();
  check(said === "Approved work item 0.", `the page says "${said}", and item 0 no longer waits`);
  check(await page.locator(item(1)).count() === 1, "item 1 still waits");

  // ------------------------------------------------------------ a refusal is said
  // Someone decides item 1 through the API just before the page's Reject reaches the
  // server: the server answers 409.
  let decidedMeanwhile = null;
  await page.route(`**${REFUSED}`, async (route) => {
    decidedMeanwhile = await api("POST", `/v1/runs/${RUN}/steps/work/approve`, { item: 1, comment: "decided through the API" });
    await route.continue();
  });
  const [refused] = await Promise.all([
    page.waitForResponse((r) => r.url().endsWith(REFUSED)),
    page.locator("#approval-work-item-1-reject").click(),
  ]);
  check(refused.status() === 409 && decidedMeanwhile !== null, `the page's Reject of item 1, decided meanwhile, is answered ${refused.status()}`);
  const error = await page.waitForSelector("#decision-result.error", { timeout: PATIENCE_MS });
  const message = await error.textContent();
  check(/^Could not reject work item 1: step `work` item 1 is \w+, not waiting for approval$/.test(message),
    `the refusal is said, with the server's reason: "${message}"`);
  // The page's own request failed, so only the live stream can tell it that item 1
  // no longer waits.
  await page.waitForSelector(item(1), { state: "detached", timeout: PATIENCE_MS });
  check(await page.locator("#decision-result.error").textContent() === message,
    "the live view drops item 1 once it no longer waits, and the refusal stays said");
  await page.unroute(`**${REFUSED}`);

  // ------------------------------------------------------------ the approval step
  const publish = '#run-detail section.approval[data-approval="publish"]';
  await page.waitForSelector(publish, { timeout: PATIENCE_MS });
  const step = await page.$eval(publish, (section) => ({
    item: section.dataset.item ?? null,
    text: section.querySelector("blockquote").textContent,
    elements: section.querySelector("blockquote").children.length,
  }));
  check(step.item === null && step.text === "Publish <b>both</b> posts?" && step.elements === 0,
    `the approval step after the items waits, its text as text: "${step.text}"`);
  const [stepPost] = await Promise.all([
    page.waitForRequest((r) => r.method() === "POST" && r.url().endsWith(`/v1/runs/${RUN}/steps/publish/approve`)),
    page.locator("#approval-publish-approve").click(),
  ]);
  check(stepPost.postData() === "{}", `the approval step's Approve posts ${stepPost.postData()} (no item)`);
  await page.waitForSelector(`#run-detail .reason .badge.succeeded`, { timeout: PATIENCE_MS });
  const decided = await page.$$eval("#run-detail .approval.decided", (all) => all.map((d) => d.querySelector("h4").textContent));
  check(JSON.stringify(decided) === JSON.stringify(["work item 0: approved", "work item 1: approved", "publish: approved"]),
    `the run succeeded, and its decided approvals read ${JSON.stringify(decided)}`);

  const after = await api("GET", `/v1/runs/${RUN}`);
  const decisions = after.steps.find((s) => s.id === "work").items.map((i) => i.approval.decision);
  check(decisions[0].comment === "it may have run; twice is fine" && decisions[1].comment === "decided through the API"
    && decisions.every((d) => d.approved && d.by === "admin"),
  "the server recorded the page's decision on item 0 and the API's on item 1, each on its own item");
  await page.screenshot({ path: join(ARTIFACTS, "web-item-approvals-decided.png") });

  check(problems.length === 0, `no console error, failed request or unexpected 4xx/5xx${problems.length ? `:\n${problems.join("\n")}` : ""}`);
  await context.close();
} catch (error) {
  console.error(`FAILED: ${error.message}`);
  if (problems.length) console.error(problems.join("\n"));
  await browser.close();
  process.exit(1);
}
await browser.close();
