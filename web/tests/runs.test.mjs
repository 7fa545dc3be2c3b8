// A step's agent loop as the run panel shows it (web/runs.js), on a step as
// `GET /v1/runs/ID` gives it: a call returned, one resent after a restart and
// returned with an error, one still in flight.

import { test } from "node:test";
import assert from "node:assert/strict";

import { loopRows, oneLine } from "../runs.js";

const step = {
  id: "work",
  state: "running",
  turns: [
    {
      at: "2026-11-27T10:00:00.000Z",
      content: "Let me count.",
      calls: [
        { id: "call_0", name: "counter__count", arguments: "{}", state: "returned", sends: 1,
          sent_at: "2026-11-27T10:00:00.100Z", returned_at: "2026-11-27T10:00:00.142Z", result: "1", is_error: false },
        { id: "call_1", name: "web__fetch", arguments: '{"url":\n  "https://example.org"}', state: "returned", sends: 2,
          sent_at: "2026-11-27T10:00:01.000Z", returned_at: "2026-11-27T10:00:03.500Z", result: "error: timed out", is_error: true },
      ],
    },
    {
      at: "2026-11-27T10:00:04.000Z",
      calls: [{ id: "call_2", name: "counter__sleep", arguments: '{"ms": 1500}', state: "sent", sends: 1, sent_at: "2026-11-27T10:00:04.010Z" }],
    },
  ],
};

test("each call is a row in order, with its turn, state, sends and duration", () => {
  const rows = loopRows(step);
  assert.deepEqual(rows.map((r) => [r.turn, r.name, r.state, r.sends, r.ms, r.error]), [
    [1, "counter__count", "returned", 1, 42, false],
    [1, "web__fetch", "returned", 2, 2500, true],
    [2, "counter__sleep", "sent", 1, null, false],
  ]);
  assert.equal(rows[1].args, '{"url": "https://example.org"}');
  assert.equal(rows[2].result, "");
});

test("long text is cut to one line", () => {
  assert.equal(oneLine("a\n b  c", 10), "a b c");
  assert.equal(oneLine("x".repeat(20), 10), `${"x".repeat(9)}…`);
  assert.equal(loopRows({ turns: [{ calls: [{ name: "f", arguments: "y".repeat(300), state: "pending" }] }] }, 50)[0].args.length, 50);
});

test("a step without a loop has no rows", () => {
  assert.deepEqual(loopRows({ id: "plain" }), []);
});
