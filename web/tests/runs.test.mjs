// What the run panel shows of a step (web/runs.js), on steps as `GET /v1/runs/ID`
// gives them: an agent loop (a call returned, one resent after a restart and returned
// with an error, one still in flight), approval steps (waiting, decided by a person,
// timed out, not reached), a `for_each` step's items, and an item whose tool call was in
// flight under `in_flight: ask` (its question, the request that decides it).

import { test } from "node:test";
import assert from "node:assert/strict";

import {
  approvalView, approvalsOf, between, decisionRequest, itemApprovals, itemProgress, itemRows, loopRows, oneLine, waitsForApproval,
} from "../runs.js";

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

// ---------------------------------------------------------------- approvals
const run = {
  id: "01JRUN",
  owner: "ada",
  state: "running",
  reason: "waiting for approval of step `publish`",
  workflow: {
    name: "release",
    steps: [
      { id: "draft", agent: "writer", prompt: "Write." },
      { id: "publish", prompt: "Publish {{ steps.draft.output }}?", approval: { timeout: "1h", on_timeout: "approve" } },
      { id: "later", prompt: "Really?", approval: { on_timeout: "reject" } },
    ],
  },
  steps: [],
};

test("a waiting approval: its text, who may decide, its deadline and the commands", () => {
  const step = {
    id: "publish", state: "waiting", iteration: 0, attempts: 1, prompt: "Publish\nthe draft?",
    approval: { requested_at: "2026-11-27T10:00:00.000Z", deadline: "2026-11-27T11:00:00.000Z" },
  };
  const view = approvalView(run, step);
  assert.equal(view.waiting, true);
  assert.equal(view.status, "waiting for approval");
  assert.equal(view.text, "Publish\nthe draft?");
  assert.equal(view.who, "ada (the run's owner) or an admin");
  assert.equal(approvalView({ ...run, owner: "admin" }, step).who, "the run's owner or an admin");
  assert.equal(view.deadline, "2026-11-27T11:00:00.000Z");
  assert.equal(view.onTimeout, "approve");
  assert.equal(view.decision, null);
  assert.equal(view.approve, "skein run approve 01JRUN publish");
  assert.equal(view.reject, "skein run reject 01JRUN publish");
});

test("a step whose tool call was in flight under ask shows the question, not its prompt", () => {
  const view = approvalView(run, {
    id: "work", state: "waiting", prompt: "Count to three.",
    approval: { requested_at: "2026-11-27T10:00:00.000Z", text: "tool call call_0 `counter__send` … was in flight",
      in_flight: { turn: 0, call: 0, id: "call_0" } },
  });
  assert.equal(view.waiting, true);
  assert.equal(view.text, "tool call call_0 `counter__send` … was in flight");
  assert.equal(view.onTimeout, null);
  assert.equal(view.approve, "skein run approve 01JRUN work");
});

test("a decided approval says who decided, when, and their comment", () => {
  const approved = approvalView(run, {
    id: "publish", state: "done", output: "ship it",
    approval: { requested_at: "2026-11-27T10:00:00.000Z", deadline: "2026-11-27T11:00:00.000Z",
      decision: { approved: true, by: "ada", comment: "ship it", at: "2026-11-27T10:05:00.000Z" } },
  });
  assert.equal(approved.waiting, false);
  assert.equal(approved.status, "approved");
  assert.deepEqual(approved.decision, { approved: true, by: "ada", comment: "ship it", at: "2026-11-27T10:05:00.000Z" });
  assert.equal(approved.verdict, "approved by ada");

  const rejected = approvalView(run, {
    id: "publish", state: "failed", error: "rejected by bob",
    approval: { requested_at: "2026-11-27T10:00:00.000Z", decision: { approved: false, by: "bob", at: "2026-11-27T10:01:00.000Z" } },
  });
  assert.equal(rejected.status, "rejected");
  assert.equal(rejected.decision.comment, "");
  assert.equal(rejected.verdict, "rejected by bob");

  const timedOut = approvalView(run, {
    id: "publish", state: "done",
    approval: { requested_at: "2026-11-27T10:00:00.000Z", deadline: "2026-11-27T11:00:00.000Z",
      decision: { approved: true, by: "timeout", at: "2026-11-27T11:00:00.000Z" } },
  });
  assert.equal(timedOut.verdict, "approved by its timeout (nobody answered in time)");
});

test("an approval step not reached yet is known from the workflow; other steps are not approvals", () => {
  const later = approvalView(run, { id: "later", state: "pending", iteration: 0, attempts: 0 });
  assert.equal(later.status, "pending");
  assert.equal(later.waiting, false);
  assert.equal(later.deadline, null);
  assert.equal(later.onTimeout, null, "no timeout declared: it waits until someone answers");
  assert.equal(approvalView(run, { id: "draft", state: "done", agent: "writer" }), null);
  assert.equal(approvalView({ id: "r", owner: "ada" }, { id: "x", state: "done" }), null);
});

test("a run that waits for approval is known from its row", () => {
  assert.equal(waitsForApproval(run), true);
  assert.equal(waitsForApproval({ state: "running", reason: null }), false);
  assert.equal(waitsForApproval({ state: "failed", reason: "step `publish` failed: rejected by bob" }), false);
});

// ---------------------------------------------------------------- for_each items
const fanOut = {
  id: "summarize",
  agent: "writer",
  state: "running",
  items: [
    { index: 0, state: "done", attempts: 1, prompt: "Summarize\n  topic A", output: "A is\nfine.", instance: "writer-0",
      started_at: "2026-11-27T10:00:00.000Z", finished_at: "2026-11-27T10:00:02.250Z", usage: { prompt_tokens: 9, completion_tokens: 4 } },
    { index: 1, state: "running", attempts: 2, prompt: "Summarize topic B", error: "engine went away", instance: "writer-1",
      started_at: "2026-11-27T10:00:03.000Z",
      turns: [{ at: "2026-11-27T10:00:03.100Z", calls: [{ id: "c0", name: "web__fetch", arguments: '{"q":"B"}', state: "sent", sends: 1, sent_at: "2026-11-27T10:00:03.200Z" }] }] },
    { index: 2, state: "retrying", attempts: 1, prompt: "Summarize topic C", error: "timed out", retry_at: "2026-11-27T10:00:09.000Z",
      started_at: "2026-11-27T10:00:00.000Z" },
    { index: 3, state: "pending", attempts: 0, prompt: "Summarize topic D" },
    { index: 4, state: "done", attempts: 1, prompt: "Summarize topic E", output: "x".repeat(500),
      started_at: "2026-11-27T10:00:00.000Z", finished_at: "2026-11-27T10:00:01.000Z" },
    { index: 5, state: "failed", attempts: 3, prompt: "Summarize topic F", error: "no\nanswer",
      started_at: "2026-11-27T10:00:00.000Z", finished_at: "2026-11-27T10:00:05.000Z" },
  ],
};

test("each item is a row: index, state, attempts, prompt and answer on one line, error, duration", () => {
  const rows = itemRows(fanOut, 40);
  assert.deepEqual(rows.map((r) => [r.index, r.state, r.attempts, r.ms]), [
    [0, "done", 1, 2250],
    [1, "running", 2, null],
    [2, "retrying", 1, null],
    [3, "pending", 0, null],
    [4, "done", 1, 1000],
    [5, "failed", 3, 5000],
  ]);
  assert.equal(rows[0].prompt, "Summarize topic A");
  assert.equal(rows[0].answer, "A is fine.");
  assert.equal(rows[0].instance, "writer-0");
  assert.equal(rows[1].answer, "");
  assert.equal(rows[1].error, "engine went away");
  assert.equal(rows[2].retryAt, "2026-11-27T10:00:09.000Z");
  assert.equal(rows[4].answer.length, 40);
  assert.ok(rows[4].answer.endsWith("…"));
  assert.equal(rows[5].error, "no answer");
});

test("an item's agent loop is its rows as loopRows gives them", () => {
  const rows = itemRows(fanOut);
  assert.deepEqual(rows[1].loop.map((r) => [r.turn, r.name, r.args, r.state, r.ms]), [[1, "web__fetch", '{"q":"B"}', "sent", null]]);
  assert.deepEqual(rows[0].loop, []);
});

test("progress counts the items by state", () => {
  const progress = itemProgress(fanOut);
  assert.deepEqual([progress.total, progress.done, progress.running, progress.retrying, progress.failed, progress.pending], [6, 2, 1, 1, 1, 1]);
  assert.equal(progress.text, "2/6 done, 1 running, 1 retrying, 1 failed");
  assert.equal(itemProgress({ items: [{ state: "done" }, { state: "running" }, { state: "running" }, { state: "pending" }] }).text, "1/4 done, 2 running");
  assert.equal(itemProgress({ id: "empty" }).text, "0/0 done");
});

test("a duration needs both ends", () => {
  assert.equal(between("2026-11-27T10:00:00.000Z", "2026-11-27T10:00:00.250Z"), 250);
  assert.equal(between("2026-11-27T10:00:00.000Z", null), null);
  assert.equal(between(undefined, "2026-11-27T10:00:00.000Z"), null);
});

// ---------------------------------------------------------------- an item asked about
// A fan-out whose items' tool calls were in flight under `in_flight: ask` when the
// server stopped, as `GET /v1/runs/ID` gives it after the restart: item 0 decided,
// item 1 waiting (its question quoting arguments that look like HTML), item 2 running.
const question = "tool call call_0 `web__post` (tool `post` of server `web`) with arguments {\"body\": \"<img src=x onerror=alert(1)>\"} was in flight when its attempt was interrupted";
const asking = {
  id: "01JASK",
  owner: "ada",
  state: "running",
  reason: "waiting for approval of step `post` item 1",
  workflow: { name: "posts", steps: [{ id: "post", agent: "poster", prompt: "Post {{ item }}", for_each: { over: "inputs.things" } }] },
  steps: [{
    id: "post", agent: "poster", state: "running",
    items: [
      { index: 0, state: "pending", attempts: 1, prompt: "Post one",
        approval: { requested_at: "2026-11-27T10:00:00.000Z", text: "tool call call_0 … (item 0)", in_flight: { turn: 0, call: 0, id: "call_0" },
          decision: { approved: true, by: "ada", comment: "it had not run", at: "2026-11-27T10:01:00.000Z" } } },
      { index: 1, state: "waiting", attempts: 1, prompt: "Post two", started_at: "2026-11-27T10:00:00.000Z",
        approval: { requested_at: "2026-11-27T10:00:00.000Z", text: question, in_flight: { turn: 0, call: 0, id: "call_0" } } },
      { index: 2, state: "running", attempts: 1, prompt: "Post three" },
    ],
  }],
};

test("an item waiting shows its index, its question, who may decide and the CLI's --item commands", () => {
  const views = itemApprovals(asking, asking.steps[0]);
  assert.deepEqual(views.map((v) => [v.item, v.label, v.waiting, v.status]), [
    [0, "post item 0", false, "approved"],
    [1, "post item 1", true, "waiting for approval"],
  ], "only the items asked about, in order");
  const waiting = views[1];
  assert.equal(waiting.step, "post");
  assert.equal(waiting.text, question, "the question as it is: the page writes it as text");
  assert.equal(waiting.who, "ada (the run's owner) or an admin");
  assert.equal(waiting.deadline, null);
  assert.equal(waiting.onTimeout, null, "a question on a call waits until someone answers");
  assert.equal(waiting.decision, null);
  assert.equal(waiting.approve, "skein run approve 01JASK post --item 1");
  assert.equal(waiting.reject, "skein run reject 01JASK post --item 1");
  assert.deepEqual(views[0].decision, { approved: true, by: "ada", comment: "it had not run", at: "2026-11-27T10:01:00.000Z" });
  assert.equal(views[0].verdict, "approved by ada");
  assert.equal(approvalView(asking, asking.steps[0]), null, "the step itself does not wait: its item does");
  assert.deepEqual(approvalsOf(asking).map((v) => v.item), [0, 1]);
  assert.deepEqual(approvalsOf({ ...asking, steps: [] }), []);
  assert.equal(waitsForApproval(asking), true);
});

test("the decision's request names the item, and a step's does not", () => {
  const item = itemApprovals(asking, asking.steps[0])[1];
  assert.deepEqual(decisionRequest("01JASK", item, true, "  it did not run  "), {
    path: "/v1/runs/01JASK/steps/post/approve",
    body: { comment: "it did not run", item: 1 },
  });
  assert.deepEqual(decisionRequest("01JASK", item, false, ""), { path: "/v1/runs/01JASK/steps/post/reject", body: { item: 1 } });
  const first = itemApprovals(asking, asking.steps[0])[0];
  assert.deepEqual(decisionRequest("01JASK", first, true).body, { item: 0 }, "item 0 is an item too");
  const publish = approvalView(run, { id: "publish", state: "waiting", prompt: "Publish?", approval: { requested_at: "2026-11-27T10:00:00.000Z" } });
  assert.deepEqual(decisionRequest("01JRUN", publish, true, "ship it"), { path: "/v1/runs/01JRUN/steps/publish/approve", body: { comment: "ship it" } });
  assert.deepEqual(decisionRequest("a/b", { step: "x y", item: null }, false, "   ").path, "/v1/runs/a%2Fb/steps/x%20y/reject");
  assert.deepEqual(decisionRequest("01JRUN", publish, false, "   ").body, {});
});

test("progress counts the items waiting for approval", () => {
  const progress = itemProgress(asking.steps[0]);
  assert.equal(progress.waiting, 1);
  assert.equal(progress.text, "0/3 done, 1 running, 1 waiting for approval");
  assert.equal(itemRows(asking.steps[0])[1].state, "waiting");
});
