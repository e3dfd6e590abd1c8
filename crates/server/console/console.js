// berth's web console, core: log-in, API calls, routing, tables, charts.
// Pages are in pages.js. No framework and no build step: plain DOM, with
// every text from the server inserted as text (never as HTML).
//
// Credentials are kept in sessionStorage (this tab only, gone when it
// closes) and sent as HTTP basic auth with each /api/ call, as RabbitMQ's
// UI does; they never appear in a URL.
"use strict";

const Berth = (() => {
  const AUTH_KEY = "berth.auth";
  const USER_KEY = "berth.user";
  // Samples kept per chart series (at 5 s, ten minutes).
  const SAMPLES_MAX = 120;

  class ApiError extends Error {
    constructor(status, reason) {
      super(reason);
      this.status = status;
    }
  }

  let refreshTimer = null;
  let currentRefresh = null;
  const pages = [];

  // ---- DOM helpers -------------------------------------------------------

  /** el("td", {class: "num", onclick: f}, "text", child, ...) */
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "class") e.className = v;
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function $(id) {
    return document.getElementById(id);
  }

  function status(text, isError) {
    const f = $("status");
    f.textContent = text || "";
    f.className = isError ? "error" : "";
  }

  function fmtNumber(n) {
    if (n === undefined || n === null || n === "") return "";
    if (typeof n !== "number") return String(n);
    if (Number.isInteger(n)) return n.toLocaleString("en");
    return Math.abs(n) < 10 ? n.toFixed(2) : n.toFixed(1);
  }

  function fmtBytes(n) {
    if (typeof n !== "number") return "";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i++;
    }
    return (i ? n.toFixed(1) : n) + " " + units[i];
  }

  function get(obj, path) {
    return path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), obj);
  }

  // ---- API ---------------------------------------------------------------

  function enc(s) {
    return encodeURIComponent(s);
  }

  /** Calls /api/PATH; resolves to the parsed JSON (or null), rejects with ApiError. */
  async function api(method, path, body, auth) {
    const headers = {
      Authorization: "Basic " + (auth || sessionStorage.getItem(AUTH_KEY) || ""),
      "X-Requested-With": "berth-console",
    };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let resp;
    try {
      resp = await fetch("/api" + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        credentials: "omit",
        cache: "no-store",
      });
    } catch (e) {
      throw new ApiError(0, "cannot reach berth: " + e.message);
    }
    const text = await resp.text();
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch (_) {
      json = null;
    }
    if (!resp.ok) {
      const reason = (json && (json.reason || json.error)) || text || resp.statusText;
      if (resp.status === 401 && !auth) loggedOut("Logged out: " + reason);
      throw new ApiError(resp.status, `${resp.status} ${reason}`);
    }
    return json;
  }

  // ---- log-in ------------------------------------------------------------

  function showLogin(message) {
    $("login").hidden = false;
    $("page").hidden = true;
    $("nav").hidden = true;
    $("session").hidden = true;
    $("login-error").textContent = message || "";
    stopRefresh();
  }

  function loggedOut(message) {
    sessionStorage.removeItem(AUTH_KEY);
    sessionStorage.removeItem(USER_KEY);
    showLogin(message);
  }

  async function logIn(user, password) {
    const token = btoa(unescape(encodeURIComponent(user + ":" + password)));
    try {
      const me = await api("GET", "/whoami", undefined, token);
      sessionStorage.setItem(AUTH_KEY, token);
      sessionStorage.setItem(USER_KEY, JSON.stringify(me));
      $("login-password").value = "";
      enter();
    } catch (e) {
      $("login-error").textContent = "Login failed: " + e.message;
    }
  }

  function me() {
    try {
      return JSON.parse(sessionStorage.getItem(USER_KEY)) || { name: "", tags: [] };
    } catch (_) {
      return { name: "", tags: [] };
    }
  }

  function isAdmin() {
    return (me().tags || []).includes("administrator");
  }

  function enter() {
    $("login").hidden = true;
    $("page").hidden = false;
    $("nav").hidden = false;
    $("session").hidden = false;
    const u = me();
    $("whoami").textContent = `${u.name} (${(u.tags || []).join(", ") || "no tags"})`;
    route();
  }

  // ---- routing and refresh -----------------------------------------------

  /** page(pattern, render): pattern like "/queues/:vhost/:name". render(main, params) may return a refresh function. */
  function page(pattern, render) {
    const names = [];
    const re = new RegExp(
      "^" +
        pattern.replace(/:[a-z]+/g, (m) => {
          names.push(m.slice(1));
          return "([^/]+)";
        }) +
        "$",
    );
    pages.push({ re, names, render });
  }

  function stopRefresh() {
    if (refreshTimer) clearInterval(refreshTimer);
    refreshTimer = null;
  }

  function startRefresh() {
    stopRefresh();
    const s = Number($("refresh").value);
    if (s > 0 && currentRefresh) {
      refreshTimer = setInterval(() => {
        if (document.hidden || !currentRefresh) return;
        currentRefresh().catch((e) => status(e.message, true));
      }, s * 1000);
    }
  }

  async function route() {
    if (!sessionStorage.getItem(AUTH_KEY)) return showLogin();
    const path = (location.hash || "#/").slice(1) || "/";
    for (const a of document.querySelectorAll("nav a")) {
      const target = a.getAttribute("href").slice(1);
      a.classList.toggle("active", target === "/" ? path === "/" : path.startsWith(target));
    }
    const main = $("page");
    main.replaceChildren();
    currentRefresh = null;
    stopRefresh();
    status("");
    for (const p of pages) {
      const m = p.re.exec(path);
      if (!m) continue;
      const params = {};
      p.names.forEach((n, i) => (params[n] = decodeURIComponent(m[i + 1])));
      try {
        const refresh = await p.render(main, params);
        if (typeof refresh === "function") {
          currentRefresh = refresh;
          await refresh();
          startRefresh();
        }
        status("Updated " + new Date().toLocaleTimeString());
      } catch (e) {
        main.append(el("p", { class: "error", id: "page-error" }, e.message));
      }
      return;
    }
    main.append(el("h1", {}, "Not found"), el("p", {}, "No console page at " + path));
  }

  /** Runs an action from a button or form; shows its error, refreshes on success. */
  async function act(fn, done) {
    try {
      const r = await fn();
      status(done || "Done");
      if (currentRefresh) await currentRefresh();
      return r;
    } catch (e) {
      status(e.message, true);
      throw e;
    }
  }

  // ---- tables ------------------------------------------------------------

  /**
   * A list backed by one of RabbitMQ's list endpoints, paged, sorted and
   * filtered by the server. columns: [{label, key, num, render(row)}].
   * Returns {node, refresh}.
   */
  function serverTable(endpoint, columns, opts) {
    const state = { page: 1, pageSize: 100, sort: (opts && opts.sort) || "name", reverse: false, name: "", regex: false };
    const table = el("table", { id: opts && opts.id });
    const info = el("span", { class: "muted" });
    const pageSel = el("select", { onchange: () => ((state.page = Number(pageSel.value)), refresh()) });
    const filter = el("input", { placeholder: "filter by name", type: "search", id: opts && opts.id && opts.id + "-filter" });
    const regex = el("input", { type: "checkbox" });
    const sizeSel = el("select", { onchange: () => ((state.pageSize = Number(sizeSel.value)), (state.page = 1), refresh()) },
      [20, 100, 500].map((n) => el("option", { value: n, selected: n === 100 }, n)));
    let debounce = null;
    filter.addEventListener("input", () => {
      clearTimeout(debounce);
      debounce = setTimeout(() => ((state.name = filter.value), (state.page = 1), refresh().catch((e) => status(e.message, true))), 300);
    });
    regex.addEventListener("change", () => ((state.regex = regex.checked), refresh()));
    const node = el("div", {},
      el("div", { class: "toolbar" }, filter, el("label", {}, regex, " regex"), "Page ", pageSel, " of size ", sizeSel, info),
      table);

    function head() {
      return el("tr", {}, columns.map((c) => {
        const sortable = c.key && !c.nosort;
        const cls = [c.num ? "num" : "", sortable ? "sortable" : "",
          state.sort === c.key ? (state.reverse ? "sorted-desc" : "sorted-asc") : ""].join(" ").trim();
        return el("th", {
          class: cls || undefined,
          onclick: sortable ? () => {
            if (state.sort === c.key) state.reverse = !state.reverse;
            else ((state.sort = c.key), (state.reverse = false));
            refresh();
          } : undefined,
        }, c.label);
      }));
    }

    async function refresh() {
      const q = new URLSearchParams({ page: state.page, page_size: state.pageSize, sort: state.sort, sort_reverse: state.reverse, pagination: true });
      if (state.name) q.set("name", state.name);
      if (state.regex) q.set("use_regex", "true");
      let r;
      try {
        r = await api("GET", endpoint + "?" + q);
      } catch (e) {
        if (e.status === 400 && state.page > 1) {
          state.page = 1;
          return refresh();
        }
        throw e;
      }
      const rows = r.items.map((row) => el("tr", {}, columns.map((c) => cell(c, row))));
      table.replaceChildren(head(), ...rows);
      if (!rows.length) table.append(el("tr", {}, el("td", { colspan: columns.length, class: "muted" }, "Nothing to show")));
      pageSel.replaceChildren(...Array.from({ length: Math.max(r.page_count, 1) }, (_, i) =>
        el("option", { value: i + 1, selected: i + 1 === r.page }, i + 1)));
      info.textContent = ` ${r.filtered_count} of ${r.total_count} shown${r.filtered_count !== r.total_count ? " (filtered)" : ""}`;
    }
    return { node, refresh };
  }

  function cell(c, row) {
    const v = c.render ? c.render(row) : get(row, c.key);
    return el("td", { class: c.num ? "num" : undefined }, v instanceof Node ? v : c.num ? fmtNumber(v) : v === undefined ? "" : String(v));
  }

  /** A plain table of rows already fetched. */
  function table(columns, rows, id) {
    const t = el("table", { id }, el("tr", {}, columns.map((c) => el("th", { class: c.num ? "num" : undefined }, c.label))));
    for (const row of rows) t.append(el("tr", {}, columns.map((c) => cell(c, row))));
    if (!rows.length) t.append(el("tr", {}, el("td", { colspan: columns.length, class: "muted" }, "Nothing to show")));
    return t;
  }

  /** A two-column table of label/value pairs. */
  function kv(pairs, id) {
    return el("table", { class: "kv", id }, pairs.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v instanceof Node ? v : fmtNumber(v)))));
  }

  function tiles(pairs) {
    return el("div", { class: "tiles" }, pairs.map(([l, n, id]) => el("div", { class: "tile" }, el("div", { class: "n", id }, fmtNumber(n)), el("div", { class: "l" }, l))));
  }

  // ---- charts ------------------------------------------------------------

  /**
   * A line chart over time drawn on a canvas: chart.add({series: value})
   * appends one sample per series and redraws. Keeps SAMPLES_MAX samples.
   */
  function chart(title, seriesNames, id) {
    const canvas = el("canvas", { class: "chart", width: 720, height: 180, id });
    const legend = el("div", { class: "legend" }, seriesNames.map((n, i) => el("span", {}, el("span", { class: "sw sw-" + i }), n)));
    const colors = ["#1d4e89", "#d97706", "#1a7f37", "#9333ea"];
    const samples = [];
    const node = el("div", {}, el("h2", {}, title), legend, canvas);

    function draw() {
      const ctx = canvas.getContext("2d");
      const w = canvas.width;
      const h = canvas.height;
      const pad = { l: 56, r: 10, t: 10, b: 22 };
      ctx.clearRect(0, 0, w, h);
      let max = 0;
      for (const s of samples) for (const n of seriesNames) max = Math.max(max, s.v[n] || 0);
      max = max <= 0 ? 1 : niceCeil(max);
      ctx.font = "11px system-ui, sans-serif";
      ctx.fillStyle = "#5b6670";
      ctx.strokeStyle = "#e5e9ee";
      ctx.lineWidth = 1;
      for (let i = 0; i <= 4; i++) {
        const y = pad.t + ((h - pad.t - pad.b) * i) / 4;
        ctx.beginPath();
        ctx.moveTo(pad.l, y);
        ctx.lineTo(w - pad.r, y);
        ctx.stroke();
        ctx.fillText(fmtNumber((max * (4 - i)) / 4), 4, y + 4);
      }
      if (samples.length) {
        const t0 = samples[0].t;
        const span = Math.max(samples[samples.length - 1].t - t0, 1);
        ctx.fillText(new Date(t0).toLocaleTimeString(), pad.l, h - 6);
        const last = new Date(samples[samples.length - 1].t).toLocaleTimeString();
        ctx.fillText(last, w - pad.r - ctx.measureText(last).width, h - 6);
        seriesNames.forEach((n, i) => {
          ctx.strokeStyle = colors[i % colors.length];
          ctx.lineWidth = 2;
          ctx.beginPath();
          samples.forEach((s, j) => {
            const x = pad.l + ((w - pad.l - pad.r) * (samples.length === 1 ? 1 : (s.t - t0) / span));
            const y = pad.t + (h - pad.t - pad.b) * (1 - (s.v[n] || 0) / max);
            if (j === 0) ctx.moveTo(x, y);
            else ctx.lineTo(x, y);
          });
          ctx.stroke();
        });
      }
    }

    function add(values) {
      samples.push({ t: Date.now(), v: values });
      if (samples.length > SAMPLES_MAX) samples.shift();
      canvas.dataset.last = JSON.stringify(values);
      draw();
    }
    return { node, add };
  }

  function niceCeil(x) {
    const p = Math.pow(10, Math.floor(Math.log10(x)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= x) return m * p;
    return 10 * p;
  }

  // ---- forms -------------------------------------------------------------

  /** A form whose submit runs fn(values) through act(); fields: [{name, label, type, value, options}]. */
  function form(id, fields, submitLabel, fn) {
    const inputs = {};
    const f = el("form", { class: "inline", id },
      fields.map((d) => {
        let input;
        if (d.options) input = el("select", { name: d.name }, d.options.map((o) => el("option", { value: o, selected: o === d.value }, o)));
        else if (d.type === "textarea") input = el("textarea", { name: d.name }, d.value || "");
        else if (d.type === "checkbox") input = el("input", { name: d.name, type: "checkbox", checked: !!d.value });
        else input = el("input", { name: d.name, type: d.type || "text", value: d.value, required: d.required, placeholder: d.placeholder });
        inputs[d.name] = input;
        return el("label", {}, d.label, input);
      }),
      el("button", { type: "submit" }, submitLabel));
    f.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const values = {};
      for (const [k, i] of Object.entries(inputs)) values[k] = i.type === "checkbox" ? i.checked : i.value;
      try {
        await act(() => fn(values), submitLabel + ": done");
      } catch (_) {
        // shown in the status line by act()
      }
    });
    return f;
  }

  /** A button that asks first (when `ask`), then runs fn through act(). */
  function button(label, fn, opts) {
    return el("button", {
      type: "button",
      class: opts && opts.danger ? "danger" : undefined,
      id: opts && opts.id,
      onclick: async () => {
        if (opts && opts.ask && !confirm(opts.ask)) return;
        try {
          await act(fn, label + ": done");
        } catch (_) {
          // shown in the status line by act()
        }
      },
    }, label);
  }

  function link(hash, text) {
    return el("a", { href: "#" + hash }, text);
  }

  /** Vhost names, for selects. */
  async function vhostNames() {
    return (await api("GET", "/vhosts")).map((v) => v.name);
  }

  // ---- start -------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      logIn($("login-user").value, $("login-password").value);
    });
    $("logout").addEventListener("click", () => loggedOut("Logged out."));
    $("refresh").addEventListener("change", startRefresh);
    window.addEventListener("hashchange", route);
    if (sessionStorage.getItem(AUTH_KEY)) enter();
    else showLogin();
  });

  return { el, api, enc, page, serverTable, table, kv, tiles, chart, form, button, link, act, status, fmtNumber, fmtBytes, get, isAdmin, vhostNames, ApiError };
})();
