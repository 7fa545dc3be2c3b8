// Element helpers: find by id, build elements (text never parsed as HTML), set an
// attribute or a text only when it changed, and the keyboard's Enter and Space.

export const $ = (id) => document.getElementById(id);

/** Children as the DOM takes them: arrays flattened, nothing for null or false. */
export const kids = (...children) => children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false);

/** An element with attributes and children (strings become text: never HTML). */
export function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of kids(children)) {
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

/** Sets an attribute only when it changed: a redraw touches what moved, nothing else. */
export function setAttr(el, name, value) {
  if (value === null || value === undefined) {
    if (el.hasAttribute(name)) el.removeAttribute(name);
    return;
  }
  const text = String(value);
  if (el.getAttribute(name) !== text) el.setAttribute(name, text);
}

export function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

/** A keydown handler that runs `handler` on Enter or Space, as a click would. */
export function onKeyActivate(handler) {
  return function (event) {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      handler.call(this, event);
    }
  };
}
