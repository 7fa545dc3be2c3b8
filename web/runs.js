// What the page shows of a run's steps beyond their state: a step's agent loop (an
// agent with tools) as rows, one per tool call, from `GET /v1/runs/ID`. Pure: no DOM,
// no network (tests/runs.test.mjs tests it in node).

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
