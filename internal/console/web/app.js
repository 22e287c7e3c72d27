// Roche's console: plain JavaScript over roched's API (Connect's JSON protocol) and its
// /ui/api reads. It is signed in either by a one-time login code (roche ui's URL, in its
// fragment), exchanged for a session cookie roched sets HttpOnly, or by a token the user
// pastes, which lives in this tab's sessionStorage and goes out only as a bearer header.
// Every value from roched is put in the page as text, never as HTML.
"use strict";

const SERVICE = "/roche.v1.SandboxService/";
const TOKEN_KEY = "roche.token";
const REFRESH_MS = 2000;

const $ = (sel) => document.querySelector(sel);
const token = () => sessionStorage.getItem(TOKEN_KEY) || "";

class APIError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

// headers are every request's: the bearer token when the user gave one, and the
// console's own header, without which roched does not honour the session cookie.
function headers(contentType) {
  const h = { "X-Roche-Console": "1" };
  if (token()) h["Authorization"] = "Bearer " + token();
  if (contentType) { h["Content-Type"] = contentType; h["Connect-Protocol-Version"] = "1"; }
  return h;
}

async function failure(r) {
  let j = {};
  try { j = await r.json(); } catch (_) { /* not JSON */ }
  return new APIError(j.code || String(r.status), j.message || r.statusText);
}

// call makes one unary API call.
async function call(method, body) {
  const r = await fetch(SERVICE + method, {
    method: "POST", headers: headers("application/json"), body: JSON.stringify(body || {}),
    credentials: "same-origin", cache: "no-store",
  });
  if (!r.ok) throw await failure(r);
  return r.json();
}

// get reads one of the console's own endpoints.
async function get(path) {
  const r = await fetch("/ui/api/" + path, { headers: headers(), credentials: "same-origin", cache: "no-store" });
  if (!r.ok) throw await failure(r);
  return r.json();
}

// stream makes a server-streaming call in Connect's framing (5-byte envelopes), calling
// onMessage for each message until the stream ends or signal aborts it.
async function stream(method, body, onMessage, signal) {
  const payload = new TextEncoder().encode(JSON.stringify(body));
  const frame = new Uint8Array(5 + payload.length);
  new DataView(frame.buffer).setUint32(1, payload.length);
  frame.set(payload, 5);
  const r = await fetch(SERVICE + method, {
    method: "POST", headers: headers("application/connect+json"), body: frame,
    credentials: "same-origin", cache: "no-store", signal,
  });
  if (!r.ok) throw await failure(r);
  const reader = r.body.getReader();
  let buf = new Uint8Array(0);
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    const joined = new Uint8Array(buf.length + value.length);
    joined.set(buf); joined.set(value, buf.length);
    buf = joined;
    while (buf.length >= 5) {
      const flags = buf[0];
      const n = new DataView(buf.buffer, buf.byteOffset).getUint32(1);
      if (buf.length < 5 + n) break;
      const msg = JSON.parse(new TextDecoder().decode(buf.subarray(5, 5 + n)));
      buf = buf.slice(5 + n);
      if (flags & 2) {
        if (msg.error) throw new APIError(msg.error.code, msg.error.message || msg.error.code);
        return;
      }
      onMessage(msg);
    }
  }
}

const b64decode = (s) => Uint8Array.from(atob(s || ""), (c) => c.charCodeAt(0));
function b64encode(bytes) {
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s);
}

// cell appends a text cell to row.
function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text == null ? "" : String(text);
  if (cls) td.className = cls;
  return td;
}

const shortTime = (ts) => ts ? new Date(ts).toLocaleTimeString() : "";
const enumName = (v, prefix) => String(v || "").replace(prefix, "").toLowerCase();
function bytes(n) {
  if (n == null) return "";
  const u = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}

const state = {
  role: "", selected: "", lastUsage: {}, detailAbort: null, term: null, termPid: 0,
};

function showError(err) {
  $("#error").textContent = err ? String(err.message || err) : "";
  if (err && err.code === "unauthenticated") signOut("Signed out: " + err.message);
}

// exchangeCode spends the login code of roche ui's URL for a session cookie, taking it
// out of the address bar and history first.
async function exchangeCode(code) {
  history.replaceState(null, "", location.pathname);
  const r = await fetch("/ui/session", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ code }),
    credentials: "same-origin", cache: "no-store",
  });
  if (!r.ok) throw new APIError(String(r.status), (await r.text()).trim() || r.statusText);
  sessionStorage.removeItem(TOKEN_KEY);
}

function signOut(why, endSession) {
  if (endSession) fetch("/ui/session", { method: "DELETE", credentials: "same-origin", cache: "no-store" }).catch(() => {});
  sessionStorage.removeItem(TOKEN_KEY);
  closeDetail();
  state.role = "";
  state.lastUsage = {};
  for (const tbody of document.querySelectorAll("main tbody")) tbody.replaceChildren();
  $("#app").hidden = true;
  $("#signout").hidden = true;
  $("#who").textContent = "";
  $("#login").hidden = false;
  $("#login-error").textContent = why || "";
}

async function signIn(quiet) {
  try {
    const me = await get("whoami");
    state.role = me.role;
    $("#who").textContent = "tenant " + me.tenant + " (" + me.role + ")";
    $("#login").hidden = true;
    $("#app").hidden = false;
    $("#signout").hidden = false;
    refresh();
  } catch (err) {
    if (quiet) signOut("");
    else signOut(err.code === "unauthenticated" || err.code === "401" ? "That token is not one roched knows." : String(err.message));
  }
}

// Refreshes overlap (the timer's and an action's): an answer older than one already
// shown is dropped, so that a list asked for before a destroy never replaces one asked
// for after it.
let refreshesStarted = 0;
let refreshShown = 0;

async function refresh() {
  if ($("#app").hidden) return;
  const gen = ++refreshesStarted;
  try {
    const [list, usage, ended, pools, audit] = await Promise.all([
      call("List", {}), get("usage"), get("ended"), call("PoolStatus", {}), get("audit"),
    ]);
    if (gen < refreshShown) return;
    refreshShown = gen;
    renderSandboxes(list.sandboxes || [], usage);
    renderEnded(ended);
    renderPools(pools.pools || []);
    renderAudit(audit);
    showError(null);
  } catch (err) {
    showError(err);
  }
  if (state.selected) refreshDetail().catch(showError);
}

function cpuPercent(id, u) {
  const prev = state.lastUsage[id];
  state.lastUsage[id] = u;
  if (!prev || !u.at || !prev.at) return "";
  const wall = (Date.parse(u.at) - Date.parse(prev.at)) * 1e6;
  if (wall <= 0) return "";
  return (100 * (u.cpu_time_ns - prev.cpu_time_ns) / wall).toFixed(1) + " %";
}

function renderSandboxes(list, usage) {
  const tbody = $("#sandboxes tbody");
  tbody.replaceChildren();
  for (const sb of list) {
    const row = tbody.insertRow();
    row.dataset.id = sb.id;
    if (sb.id === state.selected) row.className = "selected";
    row.addEventListener("click", () => openDetail(sb.id));
    cell(row, sb.id.slice(0, 12), "mono id");
    cell(row, sb.provider);
    cell(row, sb.image);
    cell(row, enumName(sb.state, "SANDBOX_STATE_"), "state");
    const u = usage[sb.id];
    if (u && !u.error) {
      cell(row, cpuPercent(sb.id, u), "cpu");
      cell(row, bytes(u.memory_bytes) + (u.memory_limit_bytes ? " / " + bytes(u.memory_limit_bytes) : ""), "memory");
      cell(row, u.processes, "processes");
    } else {
      const why = u && u.error ? u.error : "not measured by this provider";
      for (const c of ["cpu", "memory", "processes"]) cell(row, "–", c).title = why;
    }
    cell(row, shortTime(sb.expiresAt));
    const actions = row.insertCell();
    if (state.role === "admin") {
      const term = document.createElement("button");
      term.textContent = "Terminal";
      term.className = "terminal";
      term.addEventListener("click", (e) => { e.stopPropagation(); openDetail(sb.id, true); });
      const destroy = document.createElement("button");
      destroy.textContent = "Destroy";
      destroy.className = "destroy";
      destroy.addEventListener("click", async (e) => {
        e.stopPropagation();
        if (!confirm("Destroy sandbox " + sb.id + "?")) return;
        try { await call("Destroy", { ids: [sb.id] }); } catch (err) { showError(err); }
        if (state.selected === sb.id) closeDetail();
        refresh();
      });
      actions.append(term, " ", destroy);
    }
  }
}

function renderEnded(list) {
  const tbody = $("#ended tbody");
  tbody.replaceChildren();
  for (const sb of list) {
    const row = tbody.insertRow();
    row.dataset.ended = sb.id;
    const end = sb.end || {};
    cell(row, sb.id.slice(0, 12), "mono id");
    cell(row, sb.image);
    cell(row, shortTime(end.at));
    cell(row, end.kind, "reason");
    cell(row, end.detail, "detail");
    cell(row, end.evidence, "mono evidence");
  }
}

function renderPools(pools) {
  const tbody = $("#pools tbody");
  tbody.replaceChildren();
  for (const p of pools) {
    const row = tbody.insertRow();
    cell(row, p.key, "mono");
    cell(row, p.idle, "idle");
    cell(row, p.minIdle + "/" + p.maxIdle);
    cell(row, p.creating, "creating");
    cell(row, p.inUse);
    cell(row, p.target);
    cell(row, p.waiting);
    cell(row, p.hits + "/" + p.misses);
    cell(row, p.lastError, "error");
  }
}

function renderAudit(lines) {
  const tbody = $("#audit tbody");
  tbody.replaceChildren();
  for (const e of lines) {
    const row = tbody.insertRow();
    const a = e.attrs || {};
    cell(row, shortTime(e.time));
    cell(row, e.op, "op");
    cell(row, e.ok ? "ok" : "refused", e.ok ? "ok" : "refused");
    cell(row, (a.id || "").slice(0, 12), "mono");
    const rest = Object.entries(a).filter(([k]) => k !== "id").map(([k, v]) => k + "=" + JSON.stringify(v));
    if (e.err) rest.unshift(e.err);
    cell(row, rest.join(" "), "mono");
  }
}

function openDetail(id, withTerminal) {
  if (state.selected !== id) closeDetail();
  state.selected = id;
  $("#detail").hidden = false;
  $("#detail-id").textContent = id.slice(0, 12);
  for (const row of document.querySelectorAll("#sandboxes tr[data-id]")) {
    row.className = row.dataset.id === id ? "selected" : "";
  }
  refreshDetail().catch(showError);
  if (withTerminal && state.role === "admin" && !state.term) openTerminal(id).catch((err) => {
    $("#terminal-status").textContent = String(err.message || err);
  });
}

function closeDetail() {
  if (state.detailAbort) state.detailAbort.abort();
  state.detailAbort = null;
  if (state.term) { state.term.dispose(); state.term = null; }
  state.termPid = 0;
  state.selected = "";
  state.watching = undefined;
  $("#terminal-box").hidden = true;
  $("#detail").hidden = true;
  $("#command-output").textContent = "";
}

async function refreshDetail() {
  const id = state.selected;
  const [cmds, egress] = await Promise.all([
    call("ListCommands", { sandboxId: id }),
    call("EgressLog", { sandboxId: id }).catch((err) => ({ error: err })),
  ]);
  if (state.selected !== id) return;
  const tbody = $("#commands tbody");
  tbody.replaceChildren();
  for (const c of cmds.commands || []) {
    const row = tbody.insertRow();
    row.dataset.pid = c.pid;
    row.addEventListener("click", () => watchCommand(id, c.pid));
    cell(row, c.pid);
    cell(row, c.tag);
    cell(row, (c.cmd || []).join(" "), "mono");
    cell(row, c.running ? "running" : "");
    const end = c.end;
    cell(row, end ? (end.timedOut ? "timed out" : end.oomKilled ? "OOM killed" : "exit " + end.exitCode) : "");
  }
  const eb = $("#egress tbody");
  eb.replaceChildren();
  if (egress.error) {
    $("#egress-suggest").textContent = egress.error.message;
    return;
  }
  for (const e of egress.decisions || []) {
    const row = eb.insertRow();
    cell(row, shortTime(e.time));
    cell(row, e.host, "mono");
    cell(row, e.port);
    cell(row, e.allowed ? "allowed" : "refused", e.allowed ? "ok" : "refused");
    cell(row, e.rule, "mono");
    cell(row, e.reason);
    cell(row, e.done ? e.bytesOut + "/" + e.bytesIn : "");
  }
  $("#egress-suggest").textContent = (egress.suggested || []).length ?
    "Entries that would have allowed the refusals: " + egress.suggested.join(", ") : "";
}

// watchCommand replays a background command's output from its start and follows it.
function watchCommand(id, pid) {
  if (state.watching === pid) return;
  state.watching = pid;
  if (state.detailAbort) state.detailAbort.abort();
  const abort = new AbortController();
  state.detailAbort = abort;
  const out = $("#command-output");
  out.textContent = "";
  const dec = new TextDecoder();
  stream("ConnectCommand", { sandboxId: id, command: { pid }, stdoutOffset: 0, stderrOffset: 0 }, (m) => {
    if (m.data) out.textContent += dec.decode(b64decode(m.data.data), { stream: true });
    if (m.end) out.textContent += "\n[ended: exit " + m.end.exitCode + "]";
  }, abort.signal).catch((err) => {
    if (err.name !== "AbortError") out.textContent += "\n[" + err.message + "]";
  });
}

// openTerminal starts a shell in the sandbox on the PTY API and attaches xterm.js to it;
// the shell ends when the page lets go of it (kill_on_close).
async function openTerminal(id) {
  $("#terminal-box").hidden = false;
  const term = new Terminal({ cols: 100, rows: 24, convertEol: false });
  state.term = term;
  term.open($("#terminal"));
  const created = await call("CreatePty", { sandboxId: id, size: { cols: term.cols, rows: term.rows } });
  const pid = created.pid;
  state.termPid = pid;
  $("#terminal-status").textContent = "shell pid " + pid;
  let sending = Promise.resolve();
  const enc = new TextEncoder();
  term.onData((s) => {
    const data = b64encode(enc.encode(s));
    sending = sending.then(() => call("SendPtyInput", { sandboxId: id, pid, data })).catch((err) => {
      $("#terminal-status").textContent = String(err.message);
    });
  });
  term.onResize(({ cols, rows }) => {
    call("ResizePty", { sandboxId: id, pid, size: { cols, rows } }).catch(() => {});
  });
  const abort = new AbortController();
  const prevDispose = term.dispose.bind(term);
  term.dispose = () => { abort.abort(); prevDispose(); };
  term.focus();
  stream("ConnectPty", { sandboxId: id, pid, killOnClose: true }, (m) => {
    if (m.data) term.write(b64decode(m.data));
    if (m.result) $("#terminal-status").textContent = "shell exited " + m.result.exitCode;
  }, abort.signal).catch((err) => {
    if (err.name !== "AbortError") $("#terminal-status").textContent = String(err.message);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  $("#login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
    $("#token").value = "";
    signIn();
  });
  $("#signout").addEventListener("click", () => signOut("", true));
  $("#detail-close").addEventListener("click", closeDetail);
  const code = new URLSearchParams(location.hash.slice(1)).get("code");
  if (code) {
    exchangeCode(code).then(() => signIn(), (err) => signOut("The login code was refused: " + err.message));
  } else if (token()) {
    signIn();
  } else {
    signIn(true); // a session cookie from an earlier sign-in, if any
  }
  setInterval(refresh, REFRESH_MS);
});
