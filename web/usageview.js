// The Usage tab (docs/web.md): what each user used, day by day (a stacked bar chart of
// one figure), their totals, the groups with their shares, limits and what they hold,
// and the CSV download. usage.js computes; this draws.

import { $, h } from "./dom.js";
import { api } from "./live.js";
import { state } from "./state.js";
import { DAYS, METRICS, groupRow, usageChart, userTotals } from "./usage.js";

const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#3b82f6", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#06b6d4", "#84cc16", "#ec4899"];
const OTHERS = 7; // users beyond these share the last colour

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const c of children.flat()) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

const colourOf = (index) => PALETTE[Math.min(index, OTHERS)];

let metric = "tokens_out";
let loaded = null; // {report, groups, at}

/** Loads (at most every 30 s unless `force`) and draws the tab. */
export async function renderUsage(force = false) {
  const view = $("view-usage");
  if (!view || !state.token) return;
  if (force || !loaded || Date.now() - loaded.at > 30_000) {
    try {
      const [report, groups] = await Promise.all([
        api(`/v1/usage?by=day,user&since=${DAYS}d`),
        api("/v1/groups"),
      ]);
      loaded = { report, groups, at: Date.now() };
    } catch (error) {
      view.replaceChildren(h("p", { class: "error", role: "alert" }, `Usage could not be read: ${error.message}`));
      return;
    }
  }
  draw(view, loaded);
}

function draw(view, { report, groups }) {
  const chosen = METRICS.find((m) => m.key === metric) || METRICS[0];
  const chart = usageChart(report, chosen.key, Date.now());
  const pad = { left: 44, bottom: 18, top: 8 };
  const plot = svg("svg", {
    id: "usage-chart", role: "img", viewBox: `0 0 ${chart.width + pad.left} ${chart.height + pad.bottom + pad.top}`,
    "aria-label": `${chosen.label} a day for the last ${DAYS} days, by user`,
  });
  const g = svg("g", { transform: `translate(${pad.left},${pad.top})` });
  for (const tick of chart.ticks) {
    const y = chart.top ? chart.height - (tick / chart.top) * chart.height : chart.height;
    g.append(svg("line", { x1: 0, x2: chart.width, y1: y, y2: y, class: "usage-grid" }));
    g.append(svg("text", { x: -4, y: y + 3, "text-anchor": "end", class: "usage-axis" }, chosen.format(tick)));
  }
  chart.bars.forEach((bar, i) => {
    for (const s of bar.segments) {
      g.append(svg("rect", { x: bar.x, y: s.y, width: bar.width, height: Math.max(s.height, 0.5), fill: colourOf(s.colour), "data-user": s.user },
        svg("title", {}, `${s.user || "–"}, ${new Date(bar.day).toISOString().slice(0, 10)}: ${chosen.format(s.value)}`)));
    }
    if (i % 2 === 0) {
      g.append(svg("text", { x: bar.x + bar.width / 2, y: chart.height + 13, "text-anchor": "middle", class: "usage-axis" },
        new Date(bar.day).toISOString().slice(5, 10)));
    }
  });
  plot.append(g);

  const picker = h("select", { id: "usage-metric", "aria-label": "Figure shown", onchange: (e) => { metric = e.target.value; draw(view, loaded); } },
    METRICS.map((m) => h("option", { value: m.key, selected: m.key === chosen.key }, m.label)));
  const legend = h("ul", { class: "usage-legend" }, chart.users.map((u, i) =>
    h("li", {}, h("span", { class: "swatch", style: `background:${colourOf(i)}` }), u || "–")));
  const totals = userTotals(report, chosen.key);
  const usersTable = h("table", { id: "usage-users", "aria-label": "Each user's usage" },
    h("thead", {}, h("tr", {}, ["User", ...METRICS.map((m) => m.label)].map((t) => h("th", {}, t)))),
    h("tbody", {}, totals.map((t) => h("tr", {}, h("td", {}, t.user || "–"), METRICS.map((m) => h("td", { class: "num" }, m.format(t[m.key])))))));
  const groupsTable = h("table", { id: "usage-groups", "aria-label": "Groups" },
    h("thead", {}, h("tr", {}, ["Group", "Shares", "Runs", "GPU GiB", "GPUs", "Tokens/min", "Sessions", "GPU-hours", "Factor", "Members"].map((t) => h("th", {}, t)))),
    h("tbody", {}, (groups || []).map((group) => h("tr", {}, groupRow(group).map((c, i) => h("td", { class: i >= 1 && i <= 8 ? "num" : null }, c))))));
  view.replaceChildren(
    h("div", { class: "usage-head" },
      h("h3", {}, `Usage, last ${DAYS} days${state.admin ? "" : " (yours)"}`),
      picker,
      h("button", { type: "button", id: "usage-csv", onclick: downloadCsv }, "CSV")),
    plot,
    legend,
    h("div", { class: "table-wrap" }, usersTable),
    h("h3", {}, "Groups"),
    h("div", { class: "table-wrap" }, groupsTable),
    h("p", { class: "hint small" }, "Runs, GPU GiB, GPUs and sessions are what each group holds now, tokens/min its last minute's and GPU-hours its period's (the last week when no limit sets one), each of its limit; the factor is its fair share (1: used nothing of late, 0.5: used exactly its share)."),
  );
}

/** Downloads the last days' usage by day, user, model and agent as CSV. */
async function downloadCsv() {
  const response = await fetch(`/v1/usage?by=day,user,model,agent&since=${DAYS}d&format=csv`, {
    headers: { Authorization: `Bearer ${state.token}` },
  });
  if (!response.ok) return;
  const url = URL.createObjectURL(await response.blob());
  const link = h("a", { href: url, download: "skein-usage.csv" });
  document.body.append(link);
  link.click();
  link.remove();
  URL.revokeObjectURL(url);
}
