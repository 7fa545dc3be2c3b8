// What the page shows of a run's steps beyond their state, from `GET /v1/runs/ID`: a
// step's agent loop (an agent with tools) as rows, one per tool call; an approval step
// (its text, who may decide, its deadline, the decision), and an item's question on a
// tool call in flight under `in_flight: ask`, with the request that decides either; a
// `for_each` step's items with their progress. Pure: no DOM, no network, no clock
// (tests/runs.test.mjs tests it in node).

/** Text on one line, cut to `max` characters with an ellipsis. */
export function oneLine(text, max) {
  const one = String(text ?? "").split(/\s+/).filter(Boolean).join(" ");
  return one.length > max ? `${one.slice(0, max - 1)}…` : one;
}

/**
 * A step's agent loop, one row per tool call in order: the turn (from 1), the function
 * the model called, its arguments and result on one line (cut to `max`), whether the
 * result is an error, the call's state (`pending`, `sent`, `returned`), how many times
 * it was sent, and the milliseconds from its last send to its result (null until then).
 */
export function loopRows(step, max = 120) {
  const rows = [];
  (step.turns || []).forEach((turn, t) => {
    for (const call of turn.calls || []) {
      const sent = call.sent_at ? Date.parse(call.sent_at) : NaN;
      const back = call.returned_at ? Date.parse(call.returned_at) : NaN;
      rows.push({
        turn: t + 1,
        name: call.name,
        args: oneLine(call.arguments, max),
        result: call.result == null ? "" : oneLine(call.result, max),
        error: Boolean(call.is_error),
        state: call.state,
        sends: call.sends || 0,
        ms: Number.isFinite(sent) && Number.isFinite(back) ? back - sent : null,
      });
    }
  });
  return rows;
}

/** Milliseconds from one RFC 3339 time to another; null unless both are there. */
export function between(from, to) {
  const a = from ? Date.parse(from) : NaN;
  const b = to ? Date.parse(to) : NaN;
  return Number.isFinite(a) && Number.isFinite(b) ? b - a : null;
}

/**
 * What an approval of run `run` shows, whoever it is on (a step or an item, `of`: its
 * `id` or `index`, `state` and `prompt`): the text (the record's, or the prompt), the
 * status (`waiting for approval` while `of` waits, then `approved` or `rejected`, or
 * `of`'s state before it is asked), who may decide (the run's owner or an admin), when
 * it was asked and times out, and the decision (who, when, their comment) with its
 * verdict in words.
 */
function approvalFields(run, of, record) {
  const decision = record.decision
    ? { approved: Boolean(record.decision.approved), by: record.decision.by, comment: record.decision.comment || "", at: record.decision.at }
    : null;
  const waiting = of.state === "waiting";
  let status = of.state;
  if (waiting) status = "waiting for approval";
  else if (decision) status = decision.approved ? "approved" : "rejected";
  return {
    text: record.text || of.prompt || "",
    waiting,
    status,
    who: run.owner && run.owner !== "admin" ? `${run.owner} (the run's owner) or an admin` : "the run's owner or an admin",
    requested: record.requested_at || null,
    deadline: record.deadline || null,
    decision,
    verdict: decision
      ? `${decision.approved ? "approved" : "rejected"} by ${decision.by === "timeout" ? "its timeout (nobody answered in time)" : decision.by}`
      : "",
  };
}

/**
 * An approval step as the page shows it (or a step whose tool call, in flight under
 * `in_flight: ask`, waits for a person), or null for any other step: the text to
 * approve (the question on the call, for the latter), its status (`waiting for
 * approval`, `approved`, `rejected`, or the step's state before it is reached), who may
 * decide (the run's owner or an admin), when it times out and what a timeout counts
 * as, the decision (who, when, their comment) and the CLI commands that decide it.
 * `item` is null: the step itself is decided.
 */
export function approvalView(run, step) {
  const declared = run?.workflow?.steps?.find((s) => s.id === step?.id)?.approval;
  if (!step || (!step.approval && !declared)) return null;
  const record = step.approval || {};
  return {
    step: step.id,
    item: null,
    label: step.id,
    ...approvalFields(run, step, record),
    onTimeout: record.deadline || declared?.timeout ? declared?.on_timeout || "reject" : null,
    approve: `skein run approve ${run.id} ${step.id}`,
    reject: `skein run reject ${run.id} ${step.id}`,
  };
}

/**
 * The items of a `for_each` step that were asked about (their tool call was in flight
 * under `in_flight: ask` when their attempt was interrupted), in order, as
 * `approvalView` gives a step: the same fields, with `item` the item's index, `label`
 * `STEP item N`, the question as the text, no timeout (such a question waits until
 * someone answers), and the CLI commands with `--item N`. Waiting while the item's
 * state is `waiting`; a decided question keeps its decision.
 */
export function itemApprovals(run, step) {
  return (step?.items || []).filter((item) => item.approval).map((item) => ({
    step: step.id,
    item: item.index,
    label: `${step.id} item ${item.index}`,
    ...approvalFields(run, item, item.approval),
    onTimeout: null,
    approve: `skein run approve ${run.id} ${step.id} --item ${item.index}`,
    reject: `skein run reject ${run.id} ${step.id} --item ${item.index}`,
  }));
}

/** Every approval of a run as `approvalView` and `itemApprovals` give them, in the
 *  workflow's order: a step's own, then its items'. */
export function approvalsOf(run) {
  return (run?.steps || []).flatMap((s) => [approvalView(run, s), ...itemApprovals(run, s)].filter(Boolean));
}

/**
 * The request that decides `view` (from `approvalView` or `itemApprovals`) of run
 * `runId`: `POST /v1/runs/ID/steps/STEP/approve` (or `reject`) with a body holding the
 * comment, trimmed, when there is one, and the item's index for an item
 * (`{"comment": "…", "item": N}`).
 */
export function decisionRequest(runId, view, approve, comment) {
  const body = {};
  const text = String(comment ?? "").trim();
  if (text) body.comment = text;
  if (view.item !== null && view.item !== undefined) body.item = view.item;
  return {
    path: `/v1/runs/${encodeURIComponent(runId)}/steps/${encodeURIComponent(view.step)}/${approve ? "approve" : "reject"}`,
    body,
  };
}

/**
 * A `for_each` step's items, one row each in order: its index, state, attempts, prompt
 * and answer on one line (cut to `max`), its error, instance, the milliseconds from its
 * last start to its end (null until it ends), when it retries, and its agent loop as
 * `loopRows` gives it.
 */
export function itemRows(step, max = 120) {
  return (step.items || []).map((item) => ({
    index: item.index,
    state: item.state,
    attempts: item.attempts || 0,
    prompt: oneLine(item.prompt, max),
    answer: item.output == null ? "" : oneLine(item.output, max),
    error: item.error == null ? "" : oneLine(item.error, max),
    instance: item.instance || "",
    ms: between(item.started_at, item.finished_at),
    retryAt: item.retry_at || null,
    loop: loopRows(item, max),
  }));
}

/**
 * How far a `for_each` step's items are: counts by state and one line such as
 * `3/10 done, 2 running, 1 retrying, 1 failed, 1 waiting for approval` (states with no
 * item are left out).
 */
export function itemProgress(step) {
  const items = step.items || [];
  const count = (state) => items.filter((i) => i.state === state).length;
  const progress = {
    total: items.length,
    done: count("done"),
    running: count("running"),
    retrying: count("retrying"),
    failed: count("failed"),
    pending: count("pending"),
    waiting: count("waiting"),
  };
  const parts = [`${progress.done}/${progress.total} done`];
  for (const state of ["running", "retrying", "failed"]) if (progress[state]) parts.push(`${progress[state]} ${state}`);
  if (progress.waiting) parts.push(`${progress.waiting} waiting for approval`);
  progress.text = parts.join(", ");
  return progress;
}

/** Whether a run (a `GET /v1/runs` row or the record) waits for a person to approve a
 *  step or an item: its reason says so (`waiting for approval of step \`ID\``, with
 *  ` item N` for an item). */
export function waitsForApproval(run) {
  return run?.state === "running" && /^waiting for approval\b/.test(run?.reason || "");
}
