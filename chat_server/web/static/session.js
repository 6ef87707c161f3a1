// chatlab's web chat page: its session with the auth service. The access token the
// websocket opens with is renewed with a refresh token (POST /refresh) before it
// expires, so a person signs in once and stays signed in until "Sign out", or until
// the auth service refuses the refresh token (401).
//
// Where things are kept (docs/protocol.md, "The web page"):
// - cookie mode, when every auth URL has the page's own scheme and host and is https
//   or a loopback host: the refresh token is the auth service's HttpOnly cookie, which
//   no page script can read (replicas on other ports of the same host share it);
//   localStorage holds only a mark that such a cookie may exist, so that a new tab
//   starts by refreshing instead of asking for the password;
// - body mode, the fallback (an auth URL on another host or scheme, or plain http on a
//   host that is not loopback, where the Secure cookie would not be kept or sent): the
//   refresh token in this tab's sessionStorage;
// - the access token and when to renew it: this tab's sessionStorage.
"use strict";

const SESSION_KEYS = {
  token: "chatlab.token",
  renewAt: "chatlab.token_renew_at", // ms on this browser's clock
  expiresAt: "chatlab.token_expires_at", // ms on this browser's clock
  refresh: "chatlab.refresh", // body mode only
  cookieMark: "chatlab.cookie_session", // localStorage, cookie mode: a cookie may exist
};
const RENEW_AT = 0.8; // of an access token's life
const RENEW_RETRY_MS = [2000, 4000, 8000, 16000, 30000];

function isLoopback(hostname) {
  return hostname === "localhost" || hostname === "[::1]" || /^127\.\d+\.\d+\.\d+$/.test(hostname);
}

// cookie mode needs the cookie set by every replica to be sent to every replica from
// this page: the same host (a cookie ignores ports), the same scheme (SameSite=Strict
// compares it), and a secure context for its Secure flag (https, or loopback)
function cookieModeFor(authUrls) {
  return authUrls.every((url) => {
    const auth = new URL(url);
    return (
      auth.hostname === location.hostname &&
      auth.protocol === location.protocol &&
      (auth.protocol === "https:" || isLoopback(auth.hostname))
    );
  });
}

const session = {
  urls: [],
  index: null, // the replica (index in urls) that answered last
  cookie: false,
  onEnded: null, // called when the auth service refuses the refresh token
  timer: null,
  retries: 0,
  renewing: null, // the refresh in flight: callers share it
  failedToken: null, // an access token a connection failed with: renew before the next try
  renewedAfterFailure: null, // the token that renewal gave, until a connection succeeds
  generation: 0, // counts sign-outs: an answer to a request made before one is dropped

  // config.auth_urls: the auth service's replicas; onEnded(): the session is over
  configure(authUrls, onEnded) {
    this.urls = authUrls;
    this.cookie = cookieModeFor(authUrls);
    this.onEnded = onEnded;
    if (this.token()) this.schedule();
  },

  token() {
    return sessionStorage.getItem(SESSION_KEYS.token);
  },

  // a session this tab can go on with, maybe after a refresh
  resumable() {
    if (this.token()) return true;
    if (this.cookie) return localStorage.getItem(SESSION_KEYS.cookieMark) === "1";
    return sessionStorage.getItem(SESSION_KEYS.refresh) !== null;
  },

  // renew before using the token: none, past its renewal time, or a connection failed with it
  due() {
    const token = this.token();
    if (!token || token === this.failedToken) return true;
    return Date.now() >= Number(sessionStorage.getItem(SESSION_KEYS.renewAt) || 0);
  },

  expired() {
    return !this.token() || Date.now() >= Number(sessionStorage.getItem(SESSION_KEYS.expiresAt) || 0);
  },

  // a connection opened with `token` failed (refused, or a handshake answered 401: a
  // browser cannot tell them apart): renew before trying again, once per run of
  // failures (when a fresh token fails too the chat server is down or restarting, which
  // more tokens do not mend; the renewal schedule goes on meanwhile)
  connectFailed(token) {
    if (token !== this.renewedAfterFailure) this.failedToken = token;
  },

  connected() {
    this.renewedAfterFailure = null;
  },

  async register(username, password) {
    return this.post("/register", { username, password });
  },

  async logIn(username, password) {
    const payload = { username, password };
    if (this.cookie) payload.cookie = true;
    const result = await this.post("/login", payload);
    if (result.ok) this.keep(result.body);
    return result;
  },

  // one refresh at a time: {ok} with a new token, {ended} when the refresh token was
  // refused (the session is over), else the failure (keep what we have, try later)
  renew() {
    if (!this.renewing) {
      this.renewing = this.refresh().finally(() => {
        this.renewing = null;
      });
    }
    return this.renewing;
  },

  async refresh() {
    const payload = this.cookie ? {} : { refresh_token: sessionStorage.getItem(SESSION_KEYS.refresh) };
    if (!this.cookie && !payload.refresh_token) return this.end();
    const generation = this.generation;
    const result = await this.post("/refresh", payload);
    if (generation !== this.generation) return { ok: false, code: "signed_out", detail: "signed out meanwhile" };
    if (result.ok) {
      this.keep(result.body);
      return result;
    }
    if (result.status === 401) return this.end();
    this.retry();
    return result;
  },

  // "Sign out": the auth service revokes the session; this tab forgets it either way
  async signOut() {
    if (this.renewing) await this.renewing; // sign out the token that refresh leaves
    clearTimeout(this.timer);
    const payload = this.cookie ? {} : { refresh_token: sessionStorage.getItem(SESSION_KEYS.refresh) };
    const result = this.cookie || payload.refresh_token ? await this.post("/logout", payload) : { ok: true };
    this.forget();
    return result;
  },

  forget() {
    this.generation += 1;
    clearTimeout(this.timer);
    this.timer = null;
    this.failedToken = null;
    this.renewedAfterFailure = null;
    this.retries = 0;
    for (const key of ["token", "renewAt", "expiresAt", "refresh"]) sessionStorage.removeItem(SESSION_KEYS[key]);
    localStorage.removeItem(SESSION_KEYS.cookieMark);
  },

  end() {
    this.forget();
    if (this.onEnded) this.onEnded();
    return { ok: false, ended: true, code: "invalid_token", detail: "the session ended" };
  },

  // a login's or refresh's answer: the new access token (and, in body mode, refresh token)
  keep(body) {
    const now = Date.now();
    const afterFailure = this.failedToken !== null && this.failedToken === this.token();
    this.renewedAfterFailure = afterFailure ? body.access_token : null;
    const lifeMs = Number(body.expires_in) * 1000;
    sessionStorage.setItem(SESSION_KEYS.token, body.access_token);
    sessionStorage.setItem(SESSION_KEYS.renewAt, String(now + RENEW_AT * lifeMs));
    sessionStorage.setItem(SESSION_KEYS.expiresAt, String(now + lifeMs));
    if (this.cookie) localStorage.setItem(SESSION_KEYS.cookieMark, "1");
    else sessionStorage.setItem(SESSION_KEYS.refresh, body.refresh_token);
    this.failedToken = null;
    this.retries = 0;
    this.schedule();
  },

  schedule() {
    clearTimeout(this.timer);
    const wait = Number(sessionStorage.getItem(SESSION_KEYS.renewAt) || 0) - Date.now();
    this.timer = setTimeout(() => this.renew(), Math.max(0, wait));
  },

  retry() {
    clearTimeout(this.timer);
    const wait = RENEW_RETRY_MS[Math.min(this.retries, RENEW_RETRY_MS.length - 1)];
    this.retries += 1;
    this.timer = setTimeout(() => this.renew(), wait);
  },

  // a request goes to the replica that answered last (a random one at first, so pages
  // spread over them) and, when that one cannot be reached or answers 503, to the next,
  // each replica once
  async post(path, payload) {
    const urls = this.urls;
    if (this.index === null) this.index = Math.floor(Math.random() * urls.length);
    let result = null;
    for (let tried = 0; tried < urls.length; tried++) {
      const index = (this.index + tried) % urls.length;
      result = await this.postTo(urls[index], path, payload);
      if (result.code === "network" || result.status === 503) continue;
      this.index = index;
      return result;
    }
    return result;
  },

  async postTo(url, path, payload) {
    let response;
    try {
      response = await fetch(url + path, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(payload),
        // the refresh cookie is set by /login and sent to /refresh and /logout
        credentials: this.cookie && path !== "/register" ? "include" : "same-origin",
      });
    } catch (exc) {
      return { ok: false, code: "network", detail: `${url}: ${exc}` };
    }
    let body = {};
    try {
      body = await response.json();
    } catch (_) {
      body = {};
    }
    if (response.ok) return { ok: true, body, status: response.status };
    const retry = response.headers.get("Retry-After");
    const detail = (body.detail || `HTTP ${response.status}`) + (retry ? `; retry after ${retry} s` : "");
    return { ok: false, code: body.error || `http_${response.status}`, detail, status: response.status };
  },
};
