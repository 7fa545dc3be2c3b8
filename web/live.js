// The server: the API token and signing in, API requests, and the live stream
// (`GET /v1/live`, server-sent events read with fetch so that the token travels in a
// header): reconnects with backoff, a stall timeout, and the page greyed while the
// connection is lost.

import { $ } from "./dom.js";
import { fmtTime } from "./fleet.js";
import { createParser } from "./sse.js";
import { TOKEN_KEY, state } from "./state.js";

const STALL_MS = 20000; // no byte for this long (keep-alives come every 15 s): reconnect

/** Where the stream's events go (`(name, data)`), set by `listen`. */
let onEvent = (_name, _data) => {};

/** Sends each event of the live stream to `handler` (`name`, the parsed JSON data). */
export function listen(handler) {
  onEvent = handler;
}

/** An API request with the token; the JSON answer, or an error with the server's
 *  message (a refused token opens the sign-in dialog). */
export async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { Authorization: `Bearer ${state.token}`, "Content-Type": "application/json", ...(options.headers || {}) },
  });
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch { body = null; }
  if (!response.ok) {
    if (response.status === 401) signIn("The token was refused: " + (body?.error?.message || "sign in again."));
    const message = body?.error?.message || `${response.status} ${response.statusText}`;
    throw new Error(message);
  }
  return body;
}

// ---------------------------------------------------------------- sign in
export function signIn(message) {
  if (state.connection) state.connection.abort();
  state.connection = null;
  setConnection("idle", "not connected");
  $("login-error").textContent = message || "";
  const dialog = $("login");
  if (!dialog.open) dialog.showModal();
  $("token").focus();
}

/** The sign-in dialog's form and the sign-out button. */
export function wireSignIn() {
  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.token = $("token").value.trim();
    if (!state.token) return;
    sessionStorage.setItem(TOKEN_KEY, state.token);
    if ($("remember").checked) localStorage.setItem(TOKEN_KEY, state.token);
    else localStorage.removeItem(TOKEN_KEY);
    $("token").value = "";
    $("login").close();
    connect();
  });
  $("login").addEventListener("cancel", (e) => e.preventDefault());
  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    localStorage.removeItem(TOKEN_KEY);
    state.token = "";
    $("who").textContent = "";
    $("sign-out").hidden = true;
    signIn("");
  });
}

// ---------------------------------------------------------------- live stream
/** Shows the connection's state; while it is lost the page's values are greyed
 *  (they are as of the last update, whose time is shown). */
export function setConnection(kind, text) {
  const e = $("connection");
  e.dataset.state = kind;
  const stale = kind === "lost" && state.lastUpdate > 0;
  document.body.classList.toggle("stale", stale);
  e.dataset.lastUpdate = state.lastUpdate || "";
  e.textContent = stale ? `${text} · values as of ${fmtTime(state.lastUpdate)}` : text;
}

/** Reads `/v1/live` (fetch, so the token travels in a header), and reconnects by
 *  itself after a loss, waiting longer each time (up to 10 s). */
export async function connect() {
  if (state.connection) state.connection.abort();
  const controller = new AbortController();
  state.connection = controller;
  let wait = 500;
  while (!controller.signal.aborted) {
    setConnection("connecting", "connecting…");
    let received = false;
    try {
      const response = await fetch("/v1/live", {
        headers: { Authorization: `Bearer ${state.token}`, Accept: "text/event-stream" },
        signal: controller.signal,
        cache: "no-store",
      });
      if (response.status === 401) {
        const body = await response.json().catch(() => null);
        signIn("The token was refused: " + (body?.error?.message || "sign in again."));
        return;
      }
      if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
      await readEvents(response.body, controller, () => {
        if (!received) {
          received = true;
          wait = 500;
          setConnection("live", "live");
        }
      });
      if (!controller.signal.aborted) throw new Error("the server closed the stream");
    } catch (error) {
      if (controller.signal.aborted) return;
      const seconds = Math.round(wait / 100) / 10;
      setConnection("lost", `connection lost (${error.message}); retrying in ${seconds} s`);
      await new Promise((resolve) => setTimeout(resolve, wait));
      wait = Math.min(wait * 2, 10000);
    }
  }
}

/** Reads a server-sent event stream and dispatches each event. */
async function readEvents(body, controller, onData) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  const parser = createParser();
  let timer = null;
  const stalled = () => {
    clearTimeout(timer);
    timer = setTimeout(() => reader.cancel(new Error("no data for 20 s")), STALL_MS);
  };
  stalled();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      stalled();
      onData();
      for (const { event, data } of parser.push(value)) onEvent(event, JSON.parse(data));
    }
  } finally {
    clearTimeout(timer);
    if (controller.signal.aborted) reader.cancel().catch(() => {});
  }
}
