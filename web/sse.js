// A server-sent event stream's parser: text in (as it arrives, in chunks cut
// anywhere), events out. Pure: no DOM, no network (live.js feeds it; tests/sse.test.mjs
// tests it in node).

/** A parser that keeps what an unfinished event has so far. `push(chunk)` returns
 *  the events the chunk completes, in order, each `{ event, data }`: `event` is the
 *  `event:` field (`"message"` without one), `data` the `data:` lines joined by `\n`.
 *  Events end at a blank line (`\n\n`, CRLF too); comment lines (`:`) and fields
 *  other than `event` and `data` are skipped, and so is an event without data. */
export function createParser() {
  let buffer = "";
  return {
    push(chunk) {
      buffer += chunk;
      const events = [];
      let end;
      while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + buffer.slice(end).match(/^\r?\n\r?\n/)[0].length);
        const event = parseBlock(block);
        if (event) events.push(event);
      }
      return events;
    },
  };
}

/** One event's lines (without the blank line that ends it). */
function parseBlock(block) {
  let event = "message";
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const rest = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event = rest;
    else if (field === "data") data.push(rest);
  }
  return data.length ? { event, data: data.join("\n") } : null;
}
