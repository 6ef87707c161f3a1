// chatlab's web chat page: the contract of docs/protocol.md, spoken from a browser.
//
// Rules this file keeps:
// - every string that comes from a user or a server (names, bodies, rooms, error
//   details) reaches the page through textContent, never as HTML;
// - each joined room's last seen seq lives in localStorage under the user's name, so a
//   reload, a dropped connection or signing in again joins again with `since` and gets
//   what it missed (shown marked "replayed", the view on the first of them); "Sign out"
//   forgets them unless the person asked the browser to keep them;
// - session.js keeps the tokens and renews the access token, before it expires, before
//   connecting when it is due and after a failed connect;
// - nothing is loaded from anywhere but this server and the auth service (config.json
//   says where its replicas are).
"use strict";

// + the user's name, in localStorage: { rooms: { name: last seq }, current, keep }
const ROOMS_KEY = "chatlab.rooms.";
const HISTORY_PAGE = 20;
const UNREAD_CONTEXT_PX = 24; // of the message before the first unread, shown above it
const BOTTOM_SLACK_PX = 8; // this close to the end counts as reading the latest
const RECONNECT_DELAYS_MS = [500, 1000, 2000, 4000, 8000];

const ERROR_HINTS = {
  rate_limited: "sending too fast: wait a moment",
  unsupported: "the server did not understand this kind of frame",
  bad_request: "the server refused the request",
  invalid_room: "room names are 1 to 64 of A-Z a-z 0-9 _ . -",
  too_large: "the message is too long",
  not_in_room: "join the room first",
  too_many_rooms: "in too many rooms at once: leave one first",
  unavailable: "the server cannot take this now: try again",
  internal: "the server failed",
  invalid_credentials: "unknown user name or wrong password",
  invalid_token: "the session ended: sign in again",
  username_taken: "that user name is taken",
  network: "the auth service cannot be reached",
};

const state = {
  config: null,
  ws: null,
  user: null,
  roomsOf: null, // the user whose rooms state.rooms holds (and saveRooms keeps)
  keep: false, // keep the rooms on this browser after "Sign out"
  keepChoice: null, // the sign-in form's choice, until the welcome names the user
  welcomed: false,
  loggingOut: false,
  closing: false, // the page is going away: no reconnect
  attempts: 0,
  connecting: false, // connect() is getting a token or opening the websocket
  reconnectTimer: null,
  refs: 0,
  current: null,
  wanted: null, // the room the person asked to join: shown once joined
  pending: new Map(), // room -> the since its join was sent with (null: none)
  // room -> { lastSeq, members: Set, list: <ol>, seen: Set, replayUntil, firstSeq, older,
  //   firstUnread: seq marked, hold: the view stays on it until the person scrolls,
  //   stick: the view follows the latest, newBelow: a live message arrived out of view,
  //   showOldest: "Older messages" asked for a page, shown when it comes }
  rooms: new Map(),
};

const $ = (id) => document.getElementById(id);

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = String(text);
  return node;
}

// ---- the rooms kept per user (localStorage) ------------------------------------------

function savedRecord(user) {
  try {
    const record = JSON.parse(localStorage.getItem(ROOMS_KEY + user) || "{}");
    return record && typeof record === "object" ? record : {};
  } catch (_) {
    return {};
  }
}

function saveRooms() {
  if (state.roomsOf === null) return;
  const rooms = {};
  for (const [name, room] of state.rooms) rooms[name] = room.lastSeq;
  const record = { rooms, current: state.current, keep: state.keep };
  localStorage.setItem(ROOMS_KEY + state.roomsOf, JSON.stringify(record));
}

// the welcome named the user: their rooms, as this browser last saw them, joined again
// from the last seq seen in each (by onWelcome)
function restoreRooms(user) {
  if (state.roomsOf !== null) forgetRooms(false);
  const record = savedRecord(user);
  state.roomsOf = user;
  state.keep = state.keepChoice === null ? record.keep === true : state.keepChoice;
  state.keepChoice = null;
  const rooms = record.rooms && typeof record.rooms === "object" ? record.rooms : {};
  for (const [name, lastSeq] of Object.entries(rooms)) {
    roomState(name).lastSeq = typeof lastSeq === "number" ? lastSeq : null;
  }
  state.current = state.rooms.has(record.current) ? record.current : (state.rooms.keys().next().value ?? null);
  saveRooms();
  renderRoomList();
  renderRoom();
}

// the page shows no rooms; `fromBrowser`: this browser forgets the user's too
function forgetRooms(fromBrowser) {
  if (fromBrowser && state.roomsOf !== null) localStorage.removeItem(ROOMS_KEY + state.roomsOf);
  state.roomsOf = null;
  state.rooms.clear();
  state.pending.clear();
  state.current = null;
  state.wanted = null;
  for (const list of $("messages").querySelectorAll("ol.messages")) list.remove();
  $("rooms").replaceChildren();
  $("members").replaceChildren();
}

// ---- the event log --------------------------------------------------------------------

function logEvent(text) {
  const item = el("li", "event", `${new Date().toLocaleTimeString()} ${text}`);
  $("events").prepend(item);
}

function logError(code, detail, context) {
  const item = el("li", "error");
  item.dataset.code = code;
  item.append(el("span", "time", `${new Date().toLocaleTimeString()} `));
  item.append(el("span", "code", code));
  // said once: the server's own words when it gave some, else the page's hint for the code
  const said = detail || ERROR_HINTS[code];
  let text = said ? `: ${said}` : "";
  if (context) text += ` [${context}]`;
  item.append(el("span", "detail", text));
  $("events").prepend(item);
}

function setConnection(label, kind) {
  const badge = $("connection");
  badge.textContent = label;
  badge.dataset.state = kind;
}

// ---- auth service (session.js speaks to it) ---------------------------------------------

async function signIn(register) {
  const username = $("username").value.trim();
  const password = $("password").value;
  if (register) {
    const made = await session.register(username, password);
    if (!made.ok) return logError(made.code, made.detail, `register ${username}`);
    logEvent(`registered ${username}`);
  }
  const login = await session.logIn(username, password);
  if (!login.ok) return logError(login.code, login.detail, `sign in ${username}`);
  state.keepChoice = $("remember").checked;
  $("password").value = "";
  showChat();
  connect();
}

// "Sign out": the auth service ends the session (its refresh token), then the page forgets it
async function signOut() {
  state.loggingOut = true;
  clearTimeout(state.reconnectTimer);
  $("logout").disabled = true;
  const result = await session.signOut();
  $("logout").disabled = false;
  if (!result.ok) logError(result.code, result.detail, "sign out");
  logOut("signed out", !state.keep);
}

// the session is over: "Sign out" (`forget`: this browser forgets the user's rooms too)
// or the auth service refused the refresh token (the rooms stay for the next sign-in)
function logOut(reason, forget) {
  state.loggingOut = true;
  clearTimeout(state.reconnectTimer);
  if (state.ws) {
    const ws = state.ws;
    state.ws = null; // its close is not a lost connection; a sign-in may connect at once
    ws.close(1000, "sign out");
  }
  session.forget();
  forgetRooms(forget);
  state.user = null;
  state.welcomed = false;
  state.attempts = 0; // the next sign-in's first connection is not a reconnect
  $("whoami").textContent = "";
  $("logout").hidden = true;
  $("chat-panel").hidden = true;
  $("login-panel").hidden = false;
  setConnection("offline", "offline");
  if (reason) logEvent(reason);
  renderRoom();
}

function showChat() {
  $("login-panel").hidden = true;
  $("chat-panel").hidden = false;
  $("logout").hidden = false;
}

// ---- the websocket -----------------------------------------------------------------------

// opens the websocket with a token that is not due for renewal (renewing it first, and
// signing out only when the auth service refuses the refresh token)
async function connect() {
  state.reconnectTimer = null;
  if (state.ws || state.connecting || !session.resumable()) return;
  state.connecting = true;
  try {
    await openSocket();
  } finally {
    state.connecting = false;
  }
}

async function openSocket() {
  state.loggingOut = false;
  setConnection(state.attempts ? "reconnecting" : "connecting", "reconnecting");
  if (session.due()) {
    const renewed = await session.renew(); // refused: session.onEnded signed the page out
    if (renewed.ended || state.loggingOut || !session.resumable()) return;
    if (!renewed.ok) {
      logError(renewed.code, renewed.detail, "refresh");
      if (session.expired()) return reconnectLater("no fresh token");
    }
  }
  if (state.closing) return;
  const token = session.token();
  state.welcomed = false;
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = `${scheme}//${location.host}/ws?token=${encodeURIComponent(token)}`;
  const ws = new WebSocket(url, state.config.subprotocol);
  state.ws = ws;
  ws.onmessage = (event) => {
    let message;
    try {
      message = JSON.parse(event.data);
    } catch (_) {
      return logError("bad_frame", "a frame that is not JSON");
    }
    handle(message);
  };
  ws.onclose = (event) => {
    if (state.ws !== ws) return;
    state.ws = null;
    setSending(false);
    // refused, or a handshake answered 401: a browser cannot tell them apart
    if (!state.welcomed) session.connectFailed(token);
    if (state.loggingOut || state.closing) return;
    reconnectLater(event.code === 1006 ? "connection lost" : `closed ${event.code} ${event.reason || ""}`.trim());
  };
}

function reconnectLater(why) {
  const delay = RECONNECT_DELAYS_MS[Math.min(state.attempts, RECONNECT_DELAYS_MS.length - 1)];
  state.attempts += 1;
  setConnection("reconnecting", "reconnecting");
  logEvent(`${why}; reconnecting in ${delay / 1000} s`);
  clearTimeout(state.reconnectTimer);
  state.reconnectTimer = setTimeout(connect, delay);
}

function sendFrame(frame) {
  if (state.ws && state.ws.readyState === WebSocket.OPEN && state.welcomed) {
    state.ws.send(JSON.stringify(frame));
    return true;
  }
  logError("offline", "not connected: try again once connected");
  return false;
}

function handle(message) {
  switch (message.type) {
    case "welcome":
      return onWelcome(message);
    case "joined":
      return onJoined(message);
    case "presence":
      return onPresence(message);
    case "message":
      return onMessage(message);
    case "ack":
      return onAck(message);
    case "history":
      return onHistory(message);
    case "error":
      return logError(message.code, message.detail, message.ref ? `ref ${message.ref}` : "");
    default:
      return logError("unknown_frame", `a frame of type ${message.type}`);
  }
}

function onWelcome(message) {
  state.user = message.user;
  state.welcomed = true;
  session.connected();
  const again = state.attempts > 0;
  state.attempts = 0;
  $("whoami").textContent = `signed in as ${message.user}`;
  setConnection("online", "online");
  logEvent(again ? "reconnected" : "connected");
  if (state.roomsOf !== message.user) restoreRooms(message.user);
  setSending(state.current !== null);
  for (const [name, room] of state.rooms) joinRoom(name, room.lastSeq);
}

// ---- rooms ---------------------------------------------------------------------------

function roomState(name) {
  let room = state.rooms.get(name);
  if (!room) {
    const list = el("ol", "messages");
    list.dataset.room = name;
    list.hidden = true;
    list.tabIndex = 0; // scrolled with the keyboard too
    list.setAttribute("aria-label", `messages in ${name}`);
    $("messages").append(list);
    room = { lastSeq: null, members: new Set(), list, seen: new Set(), replayUntil: 0, firstSeq: null, older: true };
    Object.assign(room, { firstUnread: null, hold: false, stick: true, newBelow: false, showOldest: false });
    state.rooms.set(name, room);
    list.addEventListener("scroll", () => {
      room.stick = atBottom(list);
      if (room.stick && room.newBelow) {
        room.newBelow = false;
        renderJump();
      }
    });
    // the person scrolls: the view is theirs, no longer held on the first unread
    for (const kind of ["wheel", "touchstart", "keydown", "mousedown"]) {
      list.addEventListener(kind, () => (room.hold = false), { passive: true });
    }
    renderRoomList();
  }
  return room;
}

function joinRoom(name, since) {
  const frame = { type: "join", room: name };
  if (typeof since === "number") frame.since = since;
  if (sendFrame(frame)) state.pending.set(name, typeof since === "number" ? since : null);
}

function onJoined(message) {
  const since = state.pending.has(message.room) ? state.pending.get(message.room) : null;
  state.pending.delete(message.room);
  const room = roomState(message.room);
  room.members = new Set(message.members);
  // with since, every message up to last_seq that follows is a replay of what we missed
  room.replayUntil = since === null ? 0 : message.last_seq;
  if (since !== null && message.last_seq > since) {
    // a return with messages missed: the view will land on the first of them, marked
    unmark(room);
    room.hold = true;
  }
  if (room.lastSeq === null) room.lastSeq = since === null ? message.last_seq : since;
  if (state.wanted === message.room || !state.rooms.has(state.current)) state.current = message.room;
  saveRooms();
  if (room.seen.size === 0) {
    // an empty view (a fresh join, or a reload): the page before what replays, as context
    const before = (since === null ? message.last_seq : since) + 1;
    if (before > 1) sendFrame({ type: "history", room: message.room, before, limit: HISTORY_PAGE });
  }
  const replaying = since !== null && message.last_seq > since ? `, replaying ${message.last_seq - since} missed` : "";
  logEvent(`joined ${message.room} (last seq ${message.last_seq}${replaying})`);
  renderRoomList();
  renderRoom();
}

function onPresence(message) {
  const room = state.rooms.get(message.room);
  if (!room) return;
  if (message.event === "join") room.members.add(message.user);
  else room.members.delete(message.user);
  logEvent(`${message.user} ${message.event === "join" ? "joined" : "left"} ${message.room}`);
  if (message.room === state.current) renderMembers();
}

function messageItem(message, origin) {
  const item = el("li", `message ${origin}`);
  item.dataset.seq = String(message.seq);
  item.dataset.user = message.user;
  if (message.ref !== undefined) item.dataset.ref = message.ref;
  item.append(el("span", "seq", `#${message.seq}`));
  item.append(el("span", "user", message.user));
  item.append(el("span", "body", message.body));
  const time = new Date(message.ts).toLocaleTimeString();
  const mark = origin === "live" ? time : `${time} ${origin}`;
  item.append(el("span", "mark", mark));
  return item;
}

function place(room, item, seq) {
  // in seq order whatever the order of arrival (history pages come before what they precede)
  let next = null;
  for (const other of room.list.children) {
    if (Number(other.dataset.seq) > seq) {
      next = other;
      break;
    }
  }
  room.list.insertBefore(item, next);
  room.seen.add(seq);
  if (room.firstSeq === null || seq < room.firstSeq) room.firstSeq = seq;
}

function onMessage(message) {
  const room = state.rooms.get(message.room);
  if (!room || room.seen.has(message.seq)) return;
  const origin = message.seq <= room.replayUntil ? "replayed" : "live";
  const item = messageItem(message, origin);
  place(room, item, message.seq);
  if (origin === "replayed" && room.firstUnread === null) {
    room.firstUnread = message.seq;
    item.classList.add("first-unread");
  }
  if (room.lastSeq === null || message.seq > room.lastSeq) {
    room.lastSeq = message.seq;
    saveRooms();
  }
  if (message.room === state.current) {
    follow(room);
    if (origin === "live" && !atBottom(room.list)) room.newBelow = true;
    renderJump();
  }
  renderRoomList();
}

function onAck(message) {
  const room = state.rooms.get(message.room);
  if (!room) return;
  for (const item of room.list.children) {
    if (item.dataset.seq === String(message.seq)) {
      item.classList.add("acked");
      item.querySelector(".mark").textContent += " ✓";
    }
  }
}

function onHistory(message) {
  const room = state.rooms.get(message.room);
  if (!room) return;
  if (message.messages.length === 0) {
    room.older = false;
    logEvent(`no older messages in ${message.room}`);
  }
  for (const old of message.messages) {
    if (!room.seen.has(old.seq)) place(room, messageItem(old, "history"), old.seq);
  }
  if (room.firstSeq === 1) room.older = false;
  if (message.room === state.current) {
    renderRoom();
    if (room.showOldest) room.list.scrollTop = 0;
    else follow(room);
  }
  room.showOldest = false;
}

// ---- where the view of a room's messages is ------------------------------------------

function atBottom(list) {
  return list.scrollHeight - list.scrollTop - list.clientHeight <= BOTTOM_SLACK_PX;
}

function unmark(room) {
  const marked = room.list.querySelector(".first-unread");
  if (marked) marked.classList.remove("first-unread");
  room.firstUnread = null;
}

// after the shown room's list changed: the first unread message at the top of the view
// (the rest below it) until the person scrolls; else the latest, if they were reading it;
// else the view stays where the person put it
function follow(room) {
  const list = room.list;
  if (list.hidden) return;
  const marked = room.hold && list.querySelector(".first-unread");
  if (marked) list.scrollTop = marked.offsetTop - UNREAD_CONTEXT_PX;
  else if (room.stick) list.scrollTop = list.scrollHeight;
}

function renderJump() {
  const room = state.rooms.get(state.current);
  $("jump").hidden = !(room && room.newBelow);
}

function jumpToLatest() {
  const room = state.rooms.get(state.current);
  if (!room) return;
  room.hold = false;
  room.newBelow = false;
  room.list.scrollTop = room.list.scrollHeight;
  renderJump();
  room.list.focus();
}

function olderMessages() {
  const room = state.rooms.get(state.current);
  if (!room || room.firstSeq === null) return;
  if (sendFrame({ type: "history", room: state.current, before: room.firstSeq, limit: HISTORY_PAGE })) {
    room.hold = false; // the person asked for older messages: the view goes to them
    room.stick = false;
    room.showOldest = true;
  }
}

function leaveRoom() {
  const name = state.current;
  const room = state.rooms.get(name);
  if (!room) return;
  sendFrame({ type: "leave", room: name });
  room.list.remove();
  state.rooms.delete(name);
  state.current = state.rooms.size ? state.rooms.keys().next().value : null;
  saveRooms();
  logEvent(`left ${name}`);
  renderRoomList();
  renderRoom();
}

function sendMessage() {
  const body = $("body").value;
  if (!body || state.current === null) return;
  state.refs += 1;
  const ref = `web-${Date.now().toString(36)}-${state.refs}`;
  if (sendFrame({ type: "send", room: state.current, body, ref })) $("body").value = "";
}

// ---- rendering (textContent only) ------------------------------------------------------

function renderRoomList() {
  const items = [];
  for (const [name, room] of state.rooms) {
    const item = el("li", name === state.current ? "current" : "");
    item.dataset.room = name;
    const button = el("button", "room");
    button.type = "button";
    if (name === state.current) button.setAttribute("aria-current", "true");
    button.append(el("span", "name", name));
    button.append(el("span", "seq", room.lastSeq === null ? "" : `#${room.lastSeq}`));
    button.addEventListener("click", () => {
      showRoomList(false); // on a phone, the room chosen takes the screen
      state.current = name;
      saveRooms();
      renderRoomList();
      renderRoom();
    });
    item.append(button);
    items.push(item);
  }
  $("rooms").replaceChildren(...items);
  $("rooms-toggle").textContent = `Rooms (${state.rooms.size})${state.current ? `: ${state.current}` : ""}`;
}

// at a phone's width the room list folds behind its button (style.css); wider, it is always shown
function showRoomList(open) {
  $("chat-panel").classList.toggle("rooms-open", open);
  $("rooms-toggle").setAttribute("aria-expanded", String(open));
}

function renderMembers() {
  const room = state.rooms.get(state.current);
  const names = room ? [...room.members].sort() : [];
  $("members").replaceChildren(
    ...names.map((name) => {
      const item = el("li", "member", name === state.user ? `${name} (you)` : name);
      item.dataset.user = name;
      return item;
    }),
  );
}

function renderRoom() {
  const room = state.rooms.get(state.current);
  for (const [name, other] of state.rooms) {
    const shown = name === state.current;
    if (other.list.hidden === shown) {
      other.list.hidden = !shown;
      if (shown) follow(other);
    }
  }
  renderJump();
  $("room-title").textContent = room ? state.current : "no room";
  // the room box names the room on screen, unless the person is typing in it
  if (room && document.activeElement !== $("room-name")) $("room-name").value = state.current;
  $("older").disabled = !room || !room.older || room.firstSeq === null;
  $("leave").disabled = !room;
  setSending(Boolean(room) && state.welcomed);
  renderMembers();
}

function setSending(on) {
  $("body").disabled = !on;
  $("send").disabled = !on;
}

// ---- start --------------------------------------------------------------------------------

async function start() {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn(false);
  });
  $("register").addEventListener("click", () => {
    if ($("login-form").reportValidity()) signIn(true);
  });
  $("logout").addEventListener("click", signOut);
  $("join-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const name = $("room-name").value.trim();
    if (!name) return;
    state.wanted = name;
    if (state.rooms.has(name)) {
      state.current = name;
      renderRoomList();
      return renderRoom();
    }
    logEvent(`joining ${name}`);
    joinRoom(name, null);
  });
  $("send-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sendMessage();
  });
  // leaving the page closes the connection at once (the others see us leave); a page
  // brought back from the back/forward cache connects again and catches up with since
  window.addEventListener("pagehide", () => {
    if (!state.ws) return;
    state.closing = true;
    state.ws.close(1000, "page closed");
  });
  window.addEventListener("pageshow", (event) => {
    state.closing = false;
    if (event.persisted && !state.ws) connect();
  });
  $("older").addEventListener("click", olderMessages);
  $("jump").addEventListener("click", jumpToLatest);
  $("rooms-toggle").addEventListener("click", () => showRoomList(!$("chat-panel").classList.contains("rooms-open")));
  $("leave").addEventListener("click", leaveRoom);

  try {
    const response = await fetch("config.json", { cache: "no-cache" });
    state.config = await response.json();
  } catch (exc) {
    return logError("config", `config.json could not be read (${exc})`);
  }
  if (state.config.subprotocol !== "chatlab.json") {
    return logError("unsupported", `this server speaks ${state.config.subprotocol}; the page speaks chatlab.json`);
  }
  session.configure(state.config.auth_urls, () => logOut("your session ended: sign in again", false));
  if (!session.resumable()) return;
  // a reload: the welcome names the user, whose rooms are joined again (restoreRooms)
  showChat();
  renderRoomList();
  renderRoom();
  connect();
}

start();
