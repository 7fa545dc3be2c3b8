// The Usage tab's model (web/usage.js) on a `GET /v1/usage?by=day,user` answer: the
// days of the window with and without usage, users stacked biggest first, the scale's
// round top, each user's totals, and a group's `used/limit` cells.

import { test } from "node:test";
import assert from "node:assert/strict";

import { compact, groupRow, niceCeiling, usageChart, userTotals } from "../usage.js";

const DAY = 86_400_000;
const today = Date.parse("2026-11-28T15:30:00Z");
const day = (n) => new Date(Date.parse("2026-11-28T00:00:00Z") - n * DAY).toISOString();

const report = {
  by: ["user", "day"],
  rows: [
    { day: day(0), user: "ada", requests: 3, tokens_in: 40, tokens_out: 300, gib_hours: 2, gpu_hours: 0.5, run_seconds: 60 },
    { day: day(0), user: "bo", requests: 1, tokens_in: 10, tokens_out: 100, gib_hours: 0, gpu_hours: 0, run_seconds: 0 },
    { day: day(2), user: "bo", requests: 9, tokens_in: 90, tokens_out: 900, gib_hours: 8, gpu_hours: 1, run_seconds: 600 },
    // Before the window: not drawn, but counted in the totals (the tab asks the window).
    { day: day(20), user: "cy", requests: 1, tokens_in: 1, tokens_out: 5, gib_hours: 0, gpu_hours: 0, run_seconds: 0 },
  ],
};

test("a bar a day of the window, users stacked biggest first, scaled to a round top", () => {
  const chart = usageChart(report, "tokens_out", today, 14, 280, 100);
  assert.equal(chart.bars.length, 14);
  assert.deepEqual(chart.users, ["bo", "ada"]);
  assert.equal(chart.top, 1000);
  assert.deepEqual(chart.ticks, [0, 500, 1000]);
  const last = chart.bars[13];
  assert.equal(last.day, Date.parse("2026-11-28T00:00:00Z"));
  assert.equal(last.total, 400);
  // Stacked from the bottom: bo (the biggest overall) first, then ada above.
  assert.deepEqual(last.segments.map((s) => [s.user, s.height, s.y, s.colour]), [["bo", 10, 90, 0], ["ada", 30, 60, 1]]);
  assert.equal(chart.bars[11].segments[0].height, 90);
  assert.ok(chart.bars.slice(0, 11).every((b) => b.segments.length === 0 && b.total === 0));
  // Bars sit inside their slot.
  assert.ok(chart.bars.every((b, i) => b.x >= i * 20 && b.x + b.width <= (i + 1) * 20));
});

test("nothing used: empty bars and a zero scale", () => {
  const chart = usageChart({ rows: [] }, "gpu_hours", today);
  assert.equal(chart.top, 0);
  assert.deepEqual(chart.ticks, [0]);
  assert.ok(chart.bars.every((b) => b.segments.length === 0));
});

test("round tops and short counts", () => {
  assert.deepEqual([0, 0.3, 1, 7, 12, 480, 1001].map(niceCeiling), [0, 0.5, 1, 10, 20, 500, 2000]);
  assert.deepEqual([950, 12_300, 4_500_000].map(compact), ["950", "12.3k", "4.5M"]);
});

test("each user's totals, the biggest first", () => {
  const totals = userTotals(report, "requests");
  assert.deepEqual(totals.map((t) => [t.user, t.requests, t.tokens_out]), [["bo", 10, 1000], ["ada", 3, 300], ["cy", 1, 5]]);
});

test("a group's row shows use against its limits", () => {
  const group = {
    name: "nlp", shares: 2, members: ["ada", "bo"],
    holding: {
      runs: 1, gpu_gib: 40.25, gpus: 2, factor: 0.71234, usage_gib_hours: 3, tokens_last_minute: 900, sessions: 3, gpu_hours: 12.34,
      limits: { runs: 4, gpu_gib: 160, sessions: 10, gpu_hours: 100, gpu_hours_period_hours: 36 },
    },
  };
  assert.deepEqual(groupRow(group), ["nlp", "2", "1/4", "40.3/160", "2", "900", "3/10", "12.3/100 in 36h", "0.712", "ada, bo"]);
  assert.deepEqual(groupRow({ name: "default", shares: 1 }).slice(2), ["0", "0.0", "0", "0", "0", "0.0", "1.000", "–"]);
  assert.equal(groupRow({ name: "a", shares: 1, holding: { limits: { gpu_hours: 5 } } })[7], "0.0/5 in 7d");
});
