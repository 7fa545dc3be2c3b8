// The Usage tab's model (pure; web/tests/usage.test.mjs): the stacked bar chart of one
// figure a day by user, each user's totals and a group's row, from `GET /v1/usage` and
// `GET /v1/groups` (docs/sharing.md). usageview.js draws them.

/** The figures the chart can show: the API's field, a label and how to write a value. */
export const METRICS = [
  { key: "tokens_out", label: "Tokens out", format: (v) => compact(v) },
  { key: "tokens_in", label: "Tokens in", format: (v) => compact(v) },
  { key: "requests", label: "Requests", format: (v) => compact(v) },
  { key: "gib_hours", label: "GPU memory (GiB-h)", format: (v) => v.toFixed(v < 10 ? 2 : 1) },
  { key: "gpu_hours", label: "GPU-hours", format: (v) => v.toFixed(v < 10 ? 2 : 1) },
  { key: "run_seconds", label: "Run time (h)", format: (v) => (v / 3600).toFixed(1) },
];

/** How many days the tab shows. */
export const DAYS = 14;

/** A count written short: 950, 12.3k, 4.5M. */
export function compact(value) {
  if (value >= 1e6) return `${(value / 1e6).toFixed(1)}M`;
  if (value >= 1e4) return `${(value / 1e3).toFixed(1)}k`;
  return String(Math.round(value * 100) / 100);
}

/** The chart of `report` (`GET /v1/usage?by=day,user`) for `metric` over the `days`
 *  days ending with `today` (ms, any time of that UTC day): a bar a day, a segment a
 *  user (stacked in the order of `users`, the biggest first), scaled so the tallest
 *  bar is `height`; `ticks` are round values up to the top. */
export function usageChart(report, metric, today, days = DAYS, width = 320, height = 140) {
  const dayMs = 86_400_000;
  const last = Math.floor(today / dayMs) * dayMs;
  const first = last - (days - 1) * dayMs;
  const byDay = new Map();
  const totals = new Map();
  for (const row of report.rows || []) {
    const day = Date.parse(row.day);
    const value = row[metric] || 0;
    if (!(day >= first && day <= last) || value <= 0) continue;
    const user = row.user ?? "";
    if (!byDay.has(day)) byDay.set(day, new Map());
    byDay.get(day).set(user, (byDay.get(day).get(user) || 0) + value);
    totals.set(user, (totals.get(user) || 0) + value);
  }
  const users = [...totals.entries()].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0])).map(([u]) => u);
  const sums = [...byDay.values()].map((m) => [...m.values()].reduce((a, b) => a + b, 0));
  const top = niceCeiling(Math.max(0, ...sums));
  const slot = width / days;
  const bars = [];
  for (let i = 0; i < days; i += 1) {
    const day = first + i * dayMs;
    const values = byDay.get(day) || new Map();
    let y = height;
    const segments = [];
    for (const user of users) {
      const value = values.get(user) || 0;
      if (!value) continue;
      const size = top ? (value / top) * height : 0;
      y -= size;
      segments.push({ user, value, y, height: size, colour: users.indexOf(user) });
    }
    bars.push({ day, x: i * slot + slot * 0.15, width: slot * 0.7, segments, total: [...values.values()].reduce((a, b) => a + b, 0) });
  }
  const ticks = top ? [0, top / 2, top] : [0];
  return { bars, users, top, ticks, width, height };
}

/** The smallest of 1, 2 or 5 × a power of ten at or above `value` (0 for 0). */
export function niceCeiling(value) {
  if (!(value > 0)) return 0;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) {
    if (step * power >= value * (1 - 1e-12)) return step * power;
  }
  return 10 * power;
}

/** Each user's totals in `report` (`by=day,user`), the biggest `metric` first. */
export function userTotals(report, metric) {
  const totals = new Map();
  for (const row of report.rows || []) {
    const user = row.user ?? "";
    const sum = totals.get(user) || { user, requests: 0, tokens_in: 0, tokens_out: 0, gib_hours: 0, gpu_hours: 0, run_seconds: 0 };
    for (const m of METRICS) sum[m.key] += row[m.key] || 0;
    totals.set(user, sum);
  }
  return [...totals.values()].sort((a, b) => b[metric] - a[metric] || a.user.localeCompare(b.user));
}

/** A period of hours, short: `7d`, `36h`. */
export function period(hours) {
  return hours % 24 === 0 ? `${hours / 24}d` : `${hours}h`;
}

/**
 * A group's row: name, shares; runs, GPU GiB, GPUs, tokens a minute, sessions and
 * GPU-hours (of the limit's period, the last week when none is set) as `used/limit`;
 * factor; members.
 */
export function groupRow(group) {
  const held = group.holding || {};
  const limits = held.limits || {};
  const of = (used, limit) => (limit === undefined || limit === null ? used : `${used}/${limit}`);
  const gpuHours = limits.gpu_hours ?? null;
  return [
    group.name,
    String(group.shares),
    of(String(held.runs ?? 0), limits.runs),
    of((held.gpu_gib ?? 0).toFixed(1), limits.gpu_gib),
    of(String(held.gpus ?? 0), limits.gpus),
    of(String(held.tokens_last_minute ?? 0), limits.tokens_per_minute),
    of(String(held.sessions ?? 0), limits.sessions),
    of((held.gpu_hours ?? 0).toFixed(1), gpuHours === null ? null : `${gpuHours} in ${period(limits.gpu_hours_period_hours ?? 168)}`),
    (held.factor ?? 1).toFixed(3),
    (group.members || []).join(", ") || "–",
  ];
}
