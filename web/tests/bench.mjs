// The page's cost on a fleet: how long the layout takes, how long each live update
// takes to redraw, and the frame rate meanwhile, with every node expanded. Run by
// benches/web_page.rs (SKEIN_API, SKEIN_ADMIN_TOKEN, SKEIN_GPUS: how many GPUs the
// fleet has, SKEIN_SECONDS: how long to watch); prints one JSON line.
import { chromium } from "playwright-core";

const API = process.env.SKEIN_API;
const GPUS = Number(process.env.SKEIN_GPUS);
const SECONDS = Number(process.env.SKEIN_SECONDS || 30);

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await (await browser.newContext({ viewport: { width: 1600, height: 1000 } })).newPage();
  const opened = Date.now();
  await page.goto(API + "/");
  await page.locator("#token").fill(process.env.SKEIN_ADMIN_TOKEN);
  await page.locator("#sign-in").click();
  await page.waitForSelector('#connection[data-state="live"]', { timeout: 60000 });
  await page.waitForSelector("g.node", { timeout: 120000 });
  await page.click("#expand-all");
  await page.waitForFunction((n) => document.querySelectorAll("g.gpu").length === n, GPUS, { timeout: 300000, polling: 200 });
  const shown = Date.now() - opened;
  const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length ? s[Math.floor(s.length / 2)] : null; };
  const p99 = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length ? s[Math.min(s.length - 1, Math.floor(s.length * 0.99))] : null; };
  const result = await page.evaluate(async (seconds) => {
    const t = window.skeinTimings;
    const layout = t.layout[t.layout.length - 1];
    t.draw.length = 0;
    const frames = [];
    let last = performance.now();
    const end = last + seconds * 1000;
    await new Promise((resolve) => {
      const tick = (now) => {
        frames.push(now - last);
        last = now;
        if (now < end) requestAnimationFrame(tick); else resolve();
      };
      requestAnimationFrame(tick);
    });
    return { layout, draws: [...t.draw], frames };
  }, SECONDS);
  console.log(JSON.stringify({
    gpus: GPUS,
    shown_ms: shown,
    layout_ms: Math.round(result.layout),
    draws: result.draws.length,
    draw_median_ms: median(result.draws),
    draw_p99_ms: p99(result.draws),
    frame_median_ms: median(result.frames),
    frame_p99_ms: p99(result.frames),
  }));
  await browser.close();
} catch (error) {
  console.error(`FAILED: ${error.stack || error}`);
  await browser.close().catch(() => {});
  process.exit(1);
}
