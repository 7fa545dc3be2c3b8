// What the page knows: the one state object every module reads and updates (from the
// live stream and the user's clicks), and the hooks through which the graph reaches
// the side panel (set by app.js).

export const TOKEN_KEY = "skein.token";

export const state = {
  token: localStorage.getItem(TOKEN_KEY) || sessionStorage.getItem(TOKEN_KEY) || "",
  user: "",
  admin: false,
  sampleIntervalMs: 1000,
  nodes: new Map(), // id -> node view (as /v1/graph gives it)
  history: new Map(), // "node:gpu" -> [{t, util, temp, used}]
  instances: [],
  runs: [],
  sessions: { data: [], more: false },
  reflexes: [],
  collapsed: new Set(),
  expanded: new Set(),
  selected: null, // {kind: "gpu", node, index} | {kind: "instance", name}
  openRun: null,
  migrating: null, // session id whose migrate form is open
  layout: null, // the last ELK result
  topology: "",
  gpuCount: 0, // GPUs in the graph
  dirty: new Set(), // GPU keys to redraw
  allDirty: false,
  frame: 0,
  connection: null, // AbortController of the live stream
  lastUpdate: 0, // when the last event arrived (ms)
  table: false, // the GPU table shown instead of the graph
  sort: { key: "name", descending: false }, // the GPU table's order
  samplesLoaded: false, // the server's recent samples merged since the last `graph`
  samplesWanted: false, // a whole graph arrived: read the recent samples once it is drawn
};

/** What the graph calls in the side panel (panels.js), set by app.js: select a GPU or
 *  an instance, redraw the details, redraw the table (`soon`: at most twice a second),
 *  read and draw the usage. */
export const hooks = {
  select: (_item) => {},
  details: (_soon) => {},
  table: (_soon) => {},
  usage: () => {},
};
