// The server-sent event parser (web/sse.js) on a real stream: the first seconds of
// `GET /v1/live` from a simulated fleet (fixtures/live.txt: its first 12 events), cut into chunks
// anywhere, with CRLF line ends, comments and multi-line data.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { createParser } from "../sse.js";

const LIVE = readFileSync(new URL("fixtures/live.txt", import.meta.url), "utf8");
/** The event names the stream holds, in order (its `event:` lines). */
const NAMES = [...LIVE.matchAll(/^event: (.*)$/gm)].map((m) => m[1]);

/** Every event of `chunks`, pushed one after another into one parser. */
function parse(chunks) {
  const parser = createParser();
  return chunks.flatMap((chunk) => parser.push(chunk));
}

/** `text` in pieces of `size` characters. */
function pieces(text, size) {
  const out = [];
  for (let i = 0; i < text.length; i += size) out.push(text.slice(i, i + size));
  return out;
}

test("the live stream in one chunk gives each of its events, JSON data", () => {
  const events = parse([LIVE]);
  assert.ok(NAMES.length >= 7, `the fixture holds ${NAMES.length} events`);
  assert.deepEqual(events.map((e) => e.event), NAMES);
  assert.deepEqual(NAMES.slice(0, 2), ["hello", "graph"]);
  const hello = JSON.parse(events[0].data);
  assert.equal(hello.admin, true);
  const graph = JSON.parse(events[1].data);
  assert.ok(graph.nodes.length >= 4);
  for (const e of events) JSON.parse(e.data);
});

test("an event cut anywhere, into chunks of any size, comes out whole and once", () => {
  const whole = parse([LIVE]);
  for (const size of [1, 2, 3, 7, 64, 1000, 4096]) {
    assert.deepEqual(parse(pieces(LIVE, size)), whole, `chunks of ${size}`);
  }
  // Cut in two at every place around each event's end (the blank line).
  for (const m of LIVE.matchAll(/\n\n/g)) {
    for (let at = m.index - 3; at <= m.index + 4; at++) {
      assert.deepEqual(parse([LIVE.slice(0, at), LIVE.slice(at)]), whole, `cut at ${at}`);
    }
  }
});

test("an unfinished event waits for its blank line", () => {
  const parser = createParser();
  assert.deepEqual(parser.push("event: runs\ndata: []\n"), []);
  assert.deepEqual(parser.push("\n"), [{ event: "runs", data: "[]" }]);
  assert.deepEqual(parser.push(""), []);
});

test("CRLF line ends, also cut between CR and LF, give the same events", () => {
  const whole = parse([LIVE]);
  const crlf = LIVE.replace(/\n/g, "\r\n");
  assert.deepEqual(parse([crlf]), whole);
  assert.deepEqual(parse(pieces(crlf, 5)), whole);
  for (const m of crlf.matchAll(/\r\n\r\n/g)) {
    for (let at = m.index; at <= m.index + 4; at++) {
      assert.deepEqual(parse([crlf.slice(0, at), crlf.slice(at)]), whole, `cut at ${at}`);
    }
  }
  // LF and CRLF mixed within one blank line.
  assert.deepEqual(parse(["data: 1\r\n\ndata: 2\n\r\ndata: 3\n\n"]).map((e) => e.data), ["1", "2", "3"]);
});

test("comments are skipped: keep-alives between events and lines inside one", () => {
  const events = parse([": keep-alive\n\n", "event: reflex\n: a comment\ndata: {\"id\":1}\n\n", ":\n\n"]);
  assert.deepEqual(events, [{ event: "reflex", data: "{\"id\":1}" }]);
  // A keep-alive between every two events of the real stream changes nothing.
  const withKeepAlives = LIVE.split("\n\n").join("\n\n: keep-alive\n\n");
  assert.deepEqual(parse(pieces(withKeepAlives, 100)), parse([LIVE]));
});

test("data over several lines is joined with newlines", () => {
  const [event] = parse(["event: error\ndata: {\"message\":\ndata:  \"two lines\"}\n\n"]);
  assert.equal(event.event, "error");
  assert.equal(event.data, "{\"message\":\n \"two lines\"}");
  assert.deepEqual(JSON.parse(event.data), { message: "two lines" });
  // The real graph event, its JSON written over many data lines, parses the same.
  const graph = parse([LIVE]).find((e) => e.event === "graph");
  const json = JSON.parse(graph.data);
  const split = `event: graph\n${JSON.stringify(json, null, 1).split("\n").map((l) => `data: ${l}`).join("\n")}\n\n`;
  assert.deepEqual(JSON.parse(parse(pieces(split, 333))[0].data), json);
});

test("fields: no event name is `message`, one space after the colon is dropped, others are ignored", () => {
  assert.deepEqual(parse(["data:x\n\n"]), [{ event: "message", data: "x" }]);
  assert.deepEqual(parse(["data:  x\n\n"]), [{ event: "message", data: " x" }]);
  assert.deepEqual(parse(["id: 7\nretry: 100\nevent: runs\ndata\n\n"]), [{ event: "runs", data: "" }]);
  // An event without data is no event.
  assert.deepEqual(parse(["event: hello\n\n", "id: 3\n\n"]), []);
});
