// The side panel's lists: runs (a run opens with its steps, approvals waiting first with
// Approve and Reject, an approval step's or a `for_each` item's, each fan-out's items and
// each agent loop), sessions (each movable to another GPU from the page) and reflex
// events.

import { $, h, kids } from "./dom.js";
import { fmtTime, gib, memoryOf, nodesInOrder } from "./fleet.js";
import { api } from "./live.js";
import { approvalsOf, decisionRequest, itemProgress, itemRows, loopRows, waitsForApproval } from "./runs.js";
import { state } from "./state.js";

// ---------------------------------------------------------------- runs
export async function renderRuns(changed) {
  const view = $("view-runs");
  const focus = focusIn(view);
  const list = h("table", {},
    h("thead", {}, h("tr", {}, h("th", {}, "run"), h("th", {}, "workflow"), h("th", {}, "state"), h("th", { class: "num" }, "steps"))),
    h("tbody", {}, state.runs.map((r) => h("tr", { "data-run": r.id, class: waitsForApproval(r) ? "waits" : null },
      h("td", {}, h("button", { type: "button", onclick: () => openRun(r.id) }, r.id.slice(0, 10))),
      h("td", {}, r.workflow),
      h("td", {}, h("span", { class: `badge ${r.state}` }, r.state), waitsForApproval(r) ? [" ", h("span", { class: "badge waiting" }, "waiting for approval")] : null,
        r.reason ? h("div", { class: "hint reason" }, r.reason) : null),
      h("td", { class: "num" }, `${r.steps_done}/${r.steps}`)))));
  const parts = [h("h2", {}, "Runs"), state.runs.length ? h("div", { class: "table-wrap" }, list) : h("p", { class: "hint" }, "No runs yet: `skein submit workflow.yaml`.")];
  // The open run stays as it was until its new state comes.
  parts.push($("run-detail") || h("div", { id: "run-detail" }));
  view.replaceChildren(...kids(...parts));
  if (state.openRun && changed) await openRun(state.openRun, true);
  restoreFocus(focus);
}

/** The focused element inside `within` (by id) and its selection, to give back after a redraw. */
function focusIn(within) {
  const e = document.activeElement;
  if (!e || !e.id || !within.contains(e)) return null;
  return { id: e.id, start: e.selectionStart ?? null, end: e.selectionEnd ?? null };
}

function restoreFocus(focus) {
  const e = focus && $(focus.id);
  if (!e || document.activeElement === e) return;
  e.focus();
  if (focus.start !== null && typeof e.setSelectionRange === "function") e.setSelectionRange(focus.start, focus.end);
}

async function openRun(id, quiet) {
  state.openRun = id;
  try {
    showRun(await api(`/v1/runs/${encodeURIComponent(id)}`), quiet);
  } catch (error) {
    const detail = $("run-detail");
    if (detail) detail.replaceChildren(...kids(h("p", { class: "error" }, error.message)));
  }
}

/** A run's panel: its steps, approvals waiting first (an approval step's, or a
 *  `for_each` item's), the last decision's result, each fan-out's items and each agent
 *  loop. A redraw keeps a comment being typed and the focus. */
function showRun(run, quiet) {
  const detail = $("run-detail");
  if (!detail || state.openRun !== run.id) return;
  const focus = focusIn(detail);
  const approvals = approvalsOf(run);
  const asksStep = new Set(approvals.filter((a) => a.item === null).map((a) => a.step));
  const result = results.get(run.id);
  detail.replaceChildren(...kids(
    h("h3", {}, `Run ${run.id}`),
    h("p", { class: "reason" }, `${run.workflow.name} · `, h("span", { class: `badge ${run.state}` }, run.state), run.reason ? ` · ${run.reason}` : ""),
    h("p", { id: "decision-result", class: result?.error ? "error" : null, role: "status", "aria-live": "polite" }, result?.text || ""),
    approvals.filter((a) => a.waiting).map((a) => waitingApproval(run, a)),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "step"), h("th", {}, "agent"), h("th", {}, "state"), h("th", {}, "instance"))),
      h("tbody", {}, run.steps.map((s) => h("tr", { "data-step": s.id },
        h("td", {}, s.id), h("td", {}, s.agent || (asksStep.has(s.id) ? "a person" : "")),
        h("td", {}, h("span", { class: `badge ${s.state}` }, s.state === "waiting" ? "waiting for approval" : s.state),
          s.items?.length ? h("div", { class: "hint" }, itemProgress(s).text) : null,
          s.error ? h("div", { class: "error reason" }, s.error) : null),
        h("td", {}, s.instance || "")))))),
    approvals.filter((a) => a.decision).map(decidedApproval),
    run.steps.filter((s) => s.items && s.items.length).map(fanOut),
    run.steps.filter((s) => s.turns && s.turns.length).map((s) => agentLoop(s.id, loopRows(s))),
  ));
  restoreFocus(focus);
  if (!quiet) detail.querySelector("h3").scrollIntoView({ block: "nearest" });
}

/** Comments being typed, by `run/step` (`run/step/item` for an item), kept across
 *  redraws; and by run, the last decision's result (what was decided, or why it was
 *  refused), which stays when the approval it was about no longer waits. */
const comments = new Map();
const results = new Map();
/** The approvals (keys as `comments`') whose decision is on its way: their buttons stay
 *  disabled through a redraw. */
const deciding = new Set();

/** Says `text` about run `runId`'s last decision (an error in red), in its panel. */
function sayResult(runId, text, error) {
  results.set(runId, { text, error });
  const line = $("decision-result");
  if (!line || state.openRun !== runId) return;
  line.textContent = text;
  line.className = error ? "error" : "";
}

/** An approval waiting (an approval step's, or a `for_each` item's question on a tool
 *  call that was in flight): its text, who may decide and until when, a comment,
 *  Approve and Reject (the page's token: the run's owner or an admin), and the CLI's
 *  commands. */
function waitingApproval(run, view) {
  const key = view.item === null ? `${run.id}/${view.step}` : `${run.id}/${view.step}/${view.item}`;
  const id = view.item === null ? `approval-${view.step}` : `approval-${view.step}-item-${view.item}`;
  const comment = h("textarea", { id: `${id}-comment`, rows: 2, maxlength: 4096, placeholder: "why (optional)",
    oninput: (e) => comments.set(key, e.target.value) });
  comment.value = comments.get(key) || "";
  const decide = async (approve) => {
    const verb = approve ? "approve" : "reject";
    deciding.add(key);
    for (const b of buttons) b.disabled = true;
    sayResult(run.id, `${approve ? "Approving" : "Rejecting"} ${view.label}…`, false);
    const request = decisionRequest(run.id, view, approve, comment.value);
    try {
      const after = await api(request.path, { method: "POST", body: JSON.stringify(request.body) });
      comments.delete(key);
      deciding.delete(key);
      sayResult(run.id, `${approve ? "Approved" : "Rejected"} ${view.label}.`, false);
      showRun(after, true);
    } catch (error) {
      // Said until the next decision, even once the live view shows that it no longer
      // waits (a 409: someone decided it meanwhile).
      deciding.delete(key);
      sayResult(run.id, `Could not ${verb} ${view.label}: ${error.message}`, true);
      for (const b of [$(`${id}-approve`), $(`${id}-reject`)]) if (b) b.disabled = false;
    }
  };
  const busy = deciding.has(key);
  const buttons = [
    h("button", { type: "button", class: "approve", id: `${id}-approve`, disabled: busy, onclick: () => decide(true) }, "Approve"),
    h("button", { type: "button", class: "reject", id: `${id}-reject`, disabled: busy, onclick: () => decide(false) }, "Reject"),
  ];
  const deadline = view.deadline
    ? `Times out at ${fmtTime(Date.parse(view.deadline))}${view.onTimeout ? `, then counts as ${view.onTimeout === "approve" ? "approved" : "rejected"}` : ""}.`
    : "No timeout: it waits until someone decides.";
  return h("section", { class: "approval waiting", id, "data-approval": view.step, "data-item": view.item ?? null,
    "aria-label": `Step ${view.label} waits for approval` },
    h("h4", {}, `${view.label}: `, h("span", { class: "badge waiting" }, view.status)),
    h("blockquote", { class: "approval-text" }, view.text || "(no text)"),
    h("p", { class: "hint" }, `${view.who} may decide. ${deadline}`),
    h("label", { for: comment.id }, "Comment"), comment,
    h("div", { class: "approval-actions" }, buttons),
    h("p", { class: "hint" }, "Or: ", h("code", {}, view.approve), " / ", h("code", {}, view.reject), " [--comment TEXT]"));
}

/** An approval decided: who, when, their comment. */
function decidedApproval(view) {
  const d = view.decision;
  return h("div", { class: `approval decided ${d.approved ? "approved" : "rejected"}`, "data-approval": view.step, "data-item": view.item ?? null },
    h("h4", {}, `${view.label}: `, h("span", { class: `badge ${d.approved ? "done" : "failed"}` }, view.status)),
    h("blockquote", { class: "approval-text" }, view.text),
    h("p", {}, `${view.verdict} at ${fmtTime(Date.parse(d.at))}`, d.comment ? ": " : ".", d.comment ? h("q", {}, d.comment) : null));
}

/** A `for_each` step's items with its progress, then each item's agent loop. */
function fanOut(step) {
  const rows = itemRows(step);
  return h("div", { class: "items", "data-items": step.id },
    h("h4", {}, `${step.id}: ${itemProgress(step).text}`),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, h("th", { class: "num" }, "item"), h("th", {}, "state"), h("th", {}, "prompt → answer"), h("th", { class: "num" }, "ms"))),
      h("tbody", {}, rows.map((r) => h("tr", { "data-item": r.index },
        h("td", { class: "num" }, String(r.index)),
        h("td", {}, h("span", { class: `badge ${r.state}` }, r.state === "waiting" ? "waiting for approval" : r.state), r.attempts > 1 ? ` ×${r.attempts}` : "",
          r.retryAt ? h("div", { class: "hint" }, `again at ${fmtTime(Date.parse(r.retryAt))}`) : null),
        h("td", {}, r.prompt, r.answer ? h("div", {}, "→ ", r.answer) : null, r.error ? h("div", { class: "error" }, r.error) : null),
        h("td", { class: "num" }, r.ms == null ? "" : String(r.ms))))))),
    rows.filter((r) => r.loop.length).map((r) => agentLoop(`${step.id}[${r.index}]`, r.loop)));
}

/** An agent loop (a step's or an item's): each tool call, live while it runs. */
function agentLoop(name, rows) {
  return h("div", { class: "agent-loop", "data-loop": name },
    h("h4", {}, `${name}: agent loop (${rows.length} tool calls)`),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, h("th", { class: "num" }, "turn"), h("th", {}, "call"), h("th", {}, "result"), h("th", {}, "state"), h("th", { class: "num" }, "ms"))),
      h("tbody", {}, rows.map((r) => h("tr", {},
        h("td", { class: "num" }, String(r.turn)),
        h("td", {}, `${r.name}(${r.args})`),
        h("td", { class: r.error ? "error" : "" }, r.result),
        h("td", {}, h("span", { class: `badge ${r.state}` }, r.state), r.sends > 1 ? ` ×${r.sends}` : ""),
        h("td", { class: "num" }, r.ms == null ? "" : String(r.ms))))))));
}

// ---------------------------------------------------------------- sessions
function placeOf(binding) {
  return binding ? `${binding.node}:${binding.gpus.join(",")}` : "not bound";
}

/** Sessions as a list: id, owner, agent, messages. */
export function sessionList(sessions) {
  if (!sessions.length) return h("p", { class: "hint" }, "None.");
  return h("ul", { class: "plain" }, sessions.map((s) => h("li", {}, `${s.id} (${s.owner}, ${s.agent}, ${s.messages} messages)`)));
}

function migrateTargets() {
  const targets = [["auto", "anywhere it fits (auto)"]];
  for (const node of nodesInOrder(state.nodes.values())) {
    if (!node.connected) continue;
    targets.push([`${node.inventory.name}`, `${node.inventory.name} (any GPU)`]);
    for (const g of node.gpus) targets.push([`${node.inventory.name}:${g.facts.index}`, `${node.inventory.name} GPU ${g.facts.index} (${gib(memoryOf(node, g, state.instances).free)} GiB free)`]);
  }
  return targets;
}

export function renderSessions() {
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

export function renderEvents() {
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
