// The loomem console: one ES module, no framework, no build step. Every
// number on every page comes from the same REST API a client uses, with the
// key the operator signed in with (kept in sessionStorage, sent as a bearer
// token, never put in a URL). Memory text is untrusted: it is only ever set
// as textContent, never as HTML.

const KEY = "loomem.key";
const main = document.getElementById("main");
let me = null; // the signed-in key's /v1/whoami

// ---- small helpers ------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c) node.append(c);
  return node;
}

function toast(message, bad = false) {
  const t = document.getElementById("toast");
  t.textContent = message;
  t.className = bad ? "error" : "";
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (t.hidden = true), 4000);
}

function headers(json = true) {
  const h = {};
  if (json) h["content-type"] = "application/json";
  const key = sessionStorage.getItem(KEY);
  if (key) h.authorization = `Bearer ${key}`;
  return h;
}

async function api(method, path, body) {
  const resp = await fetch(path, {
    method,
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await resp.text();
  let data;
  try {
    data = text ? JSON.parse(text) : {};
  } catch {
    data = { detail: text };
  }
  if (!resp.ok) {
    const detail = typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail ?? data);
    const err = new Error(`${resp.status}: ${detail}`);
    err.status = resp.status;
    throw err;
  }
  return data;
}

async function sql(query, params = [], maxRows) {
  const body = { sql: query, params };
  if (maxRows) body.max_rows = maxRows;
  return (await api("POST", "/v1/sql", body)).rows;
}

function table(columns, rows, { onRow, testid } = {}) {
  const head = el("tr", {}, columns.map((c) => el("th", { class: c.num ? "num" : null }, c.label ?? c.key)));
  const body = rows.map((r) =>
    el(
      "tr",
      { class: onRow ? "clickable" : null, onclick: onRow ? () => onRow(r) : null },
      columns.map((c) => {
        const v = c.render ? c.render(r) : r[c.key];
        return el("td", { class: c.num ? "num" : null }, v instanceof Node ? v : v ?? "");
      }),
    ),
  );
  return el("table", { "data-testid": testid }, el("thead", {}, head), el("tbody", {}, body));
}

function tags(list) {
  return el("span", {}, (list || []).map((t) => el("span", { class: "tag" }, t)));
}

function short(text, n = 140) {
  text = String(text ?? "");
  return text.length > n ? `${text.slice(0, n)}…` : text;
}

function fmt(n, digits = 3) {
  return typeof n === "number" ? (Number.isInteger(n) ? String(n) : n.toFixed(digits)) : n ?? "";
}

function failed(err) {
  return el("p", { class: "error", "data-testid": "error" }, err.message);
}

async function page(title, build) {
  const box = el("div");
  main.replaceChildren(el("h1", {}, title), box);
  try {
    await build(box);
  } catch (err) {
    box.append(failed(err));
  }
}

function isAdmin() {
  return me && me.role === "admin";
}

// ---- sign in ------------------------------------------------------------

async function signIn() {
  try {
    me = await api("GET", "/v1/whoami");
    return true;
  } catch (err) {
    if (err.status !== 401) toast(err.message, true);
    sessionStorage.removeItem(KEY);
    me = null;
    return false;
  }
}

function signInPage(message) {
  const key = el("input", { type: "password", id: "key", placeholder: "API key", autocomplete: "off", required: true });
  const form = el(
    "form",
    {
      class: "card signin",
      onsubmit: async (e) => {
        e.preventDefault();
        sessionStorage.setItem(KEY, key.value.trim());
        if (await signIn()) route();
        else signInPage("That key was not accepted.");
      },
    },
    el("h1", {}, "Sign in"),
    el("p", { class: "muted" }, "The console calls the REST API with your key. It stays in this tab's session storage."),
    el("label", {}, "API key", key),
    el("p", {}, el("button", { type: "submit", id: "signin" }, "Sign in")),
    message ? el("p", { class: "error" }, message) : null,
  );
  document.getElementById("nav").hidden = true;
  document.getElementById("signout").hidden = true;
  document.getElementById("who").textContent = "";
  main.replaceChildren(form);
  key.focus();
}

// ---- streams --------------------------------------------------------------

async function streamsPage() {
  await page("Streams", async (box) => {
    const [byType, growth, dead] = await Promise.all([
      sql(
        "SELECT stream, memory_type, level, count(*) AS n, max(created_at) AS last_write FROM chunks GROUP BY stream, memory_type, level ORDER BY stream, n DESC",
        [],
        10000,
      ),
      sql(
        "SELECT stream, date_trunc('day', created_at) AS day, count(*) AS n FROM chunks GROUP BY stream, date_trunc('day', created_at) ORDER BY day",
        [],
        10000,
      ),
      sql("SELECT stream, count(*) AS n FROM dead_letters GROUP BY stream", [], 10000),
    ]);
    const streams = new Map();
    for (const r of byType) {
      const s = streams.get(r.stream) ?? { stream: r.stream, total: 0, types: {}, levels: {}, last: "" };
      s.total += r.n;
      s.types[r.memory_type] = (s.types[r.memory_type] ?? 0) + r.n;
      s.levels[`L${r.level}`] = (s.levels[`L${r.level}`] ?? 0) + r.n;
      if (String(r.last_write) > s.last) s.last = String(r.last_write);
      streams.set(r.stream, s);
    }
    const deadBy = Object.fromEntries(dead.map((d) => [d.stream, d.n]));
    const rows = [...streams.values()];
    box.append(
      el(
        "div",
        { class: "cards" },
        el("div", { class: "card stat" }, el("b", { "data-testid": "stream-count" }, rows.length), "streams"),
        el("div", { class: "card stat" }, el("b", {}, rows.reduce((a, r) => a + r.total, 0)), "memories"),
        el("div", { class: "card stat" }, el("b", {}, dead.reduce((a, r) => a + r.n, 0)), "dead letters"),
      ),
      table(
        [
          { key: "stream" },
          { key: "total", label: "memories", num: true },
          { key: "types", label: "by type", render: (r) => Object.entries(r.types).map(([t, n]) => `${t} ${n}`).join(", ") },
          { key: "levels", label: "by level", render: (r) => Object.entries(r.levels).map(([t, n]) => `${t} ${n}`).join(", ") },
          { key: "last", label: "last write" },
          { key: "dead", label: "dead letters", num: true, render: (r) => deadBy[r.stream] ?? 0 },
        ],
        rows,
        { testid: "streams", onRow: (r) => (location.hash = `#/memories?stream=${encodeURIComponent(r.stream)}`) },
      ),
      el("h2", {}, "Growth (memories, cumulative by day)"),
      growthChart(growth),
    );
  });
}

function growthChart(rows) {
  const W = 900, H = 260, pad = 40;
  const days = [...new Set(rows.map((r) => String(r.day)))].sort();
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", "data-testid": "growth" });
  if (days.length === 0) return el("p", { class: "muted" }, "No memories yet.");
  const byStream = new Map();
  for (const r of rows) {
    const m = byStream.get(r.stream) ?? new Map();
    m.set(String(r.day), r.n);
    byStream.set(r.stream, m);
  }
  const series = [...byStream.entries()].map(([stream, m]) => {
    let sum = 0;
    return { stream, points: days.map((d) => (sum += m.get(d) ?? 0)) };
  });
  const max = Math.max(1, ...series.map((s) => s.points[s.points.length - 1]));
  const x = (i) => pad + (days.length === 1 ? (W - 2 * pad) / 2 : (i * (W - 2 * pad)) / (days.length - 1));
  const y = (v) => H - pad - (v * (H - 2 * pad)) / max;
  chart.append(
    svg("line", { x1: pad, y1: H - pad, x2: W - pad, y2: H - pad, stroke: "#999" }),
    svg("line", { x1: pad, y1: pad, x2: pad, y2: H - pad, stroke: "#999" }),
    svg("text", { x: 4, y: pad, text: String(max), "font-size": 11 }),
    svg("text", { x: pad, y: H - 10, text: days[0].slice(0, 10), "font-size": 11 }),
    svg("text", { x: W - pad - 70, y: H - 10, text: days[days.length - 1].slice(0, 10), "font-size": 11 }),
  );
  const colors = ["#2f6fb0", "#d0782a", "#3a9a5b", "#b3261e", "#7b4fb0", "#6b7b8c"];
  series.forEach((s, i) => {
    const color = colors[i % colors.length];
    chart.append(
      svg("polyline", { fill: "none", stroke: color, "stroke-width": 2, points: s.points.map((v, j) => `${x(j)},${y(v)}`).join(" ") }),
      ...s.points.map((v, j) => svg("circle", { cx: x(j), cy: y(v), r: 3, fill: color })),
      svg("text", { x: W - pad + 4 - 120, y: pad + 14 * i, fill: color, "font-size": 12, text: s.stream }),
    );
  });
  return chart;
}

// ---- memories -------------------------------------------------------------

const PAGE = 25;

async function memoriesPage(params) {
  await page("Memories", async (box) => {
    const f = Object.fromEntries(params);
    const field = (name, label, attrs = {}) => el("label", {}, label, el("input", { name, value: f[name] ?? "", ...attrs }));
    const form = el(
      "form",
      {
        class: "bar",
        "data-testid": "memory-filters",
        onsubmit: (e) => {
          e.preventDefault();
          const q = new URLSearchParams();
          for (const [k, v] of new FormData(form)) if (v) q.set(k, v);
          location.hash = `#/memories?${q}`;
        },
      },
      field("stream", "stream"),
      field("type", "type"),
      field("tag", "tag"),
      field("subject", "subject"),
      field("entity", "entity"),
      field("text", "text contains"),
      field("from", "created from", { type: "date" }),
      field("to", "created to", { type: "date" }),
      el("label", { class: "inline" }, el("input", { type: "checkbox", name: "pinned", value: "1", checked: f.pinned ? true : null }), "pinned only"),
      el("label", { class: "inline" }, el("input", { type: "checkbox", name: "superseded", value: "1", checked: f.superseded ? true : null }), "show superseded"),
      el("button", { type: "submit" }, "Filter"),
    );
    box.append(form);
    const where = [];
    const args = [];
    const arg = (v) => {
      args.push(v);
      return `$${args.length}`;
    };
    if (f.stream) where.push(`stream = ${arg(f.stream)}`);
    if (f.type) where.push(`memory_type = ${arg(f.type.toLowerCase())}`);
    if (f.tag) where.push(`array_has(tags, ${arg(f.tag)})`);
    if (f.subject) where.push(`subject = ${arg(f.subject)}`);
    if (f.entity) where.push(`array_has(entities, ${arg(f.entity.toLowerCase())})`);
    if (f.text) where.push(`content ILIKE ${arg(`%${f.text}%`)}`);
    if (f.from) where.push(`created_at >= to_timestamp(${arg(`${f.from}T00:00:00Z`)})`);
    if (f.to) where.push(`created_at < to_timestamp(${arg(`${f.to}T23:59:59Z`)})`);
    if (f.pinned) where.push("pinned");
    if (!f.superseded) where.push("superseded_by IS NULL");
    const clause = where.length ? `WHERE ${where.join(" AND ")}` : "";
    const pageNo = Number(f.page ?? 0);
    const [[{ n }], rows] = await Promise.all([
      sql(`SELECT count(*) AS n FROM chunks ${clause}`, args),
      sql(
        `SELECT id, stream, memory_type, level, content, tags, subject, pinned, immutable, created_at, superseded_by FROM chunks ${clause} ORDER BY created_at DESC, id LIMIT ${PAGE} OFFSET ${pageNo * PAGE}`,
        args,
      ),
    ]);
    box.append(
      el("p", { class: "muted", "data-testid": "memory-count" }, `${n} memories`),
      table(
        [
          { key: "created_at", label: "created" },
          { key: "stream" },
          { key: "memory_type", label: "type" },
          { key: "content", render: (r) => short(r.content) },
          { key: "tags", render: (r) => tags(r.tags) },
          { key: "subject" },
          { key: "pinned", render: (r) => (r.pinned ? "📌" : "") },
          { key: "superseded_by", label: "current", render: (r) => (r.superseded_by ? "superseded" : "yes") },
        ],
        rows,
        { testid: "memories", onRow: (r) => (location.hash = `#/memory/${encodeURIComponent(r.id)}`) },
      ),
    );
    const go = (p) => {
      const q = new URLSearchParams(params);
      q.set("page", p);
      location.hash = `#/memories?${q}`;
    };
    box.append(
      el(
        "div",
        { class: "pager" },
        el("button", { class: "secondary", disabled: pageNo === 0 ? true : null, onclick: () => go(pageNo - 1) }, "‹ Previous"),
        el("span", {}, `page ${pageNo + 1} of ${Math.max(1, Math.ceil(n / PAGE))}`),
        el("button", { class: "secondary", disabled: (pageNo + 1) * PAGE >= n ? true : null, onclick: () => go(pageNo + 1) }, "Next ›"),
      ),
    );
  });
}

async function memoryPage(id) {
  await page("Memory", async (box) => {
    const [m, history] = await Promise.all([
      api("GET", `/v1/memories/${encodeURIComponent(id)}`),
      api("GET", `/v1/memories/${encodeURIComponent(id)}/history`),
    ]);
    const locked = m.immutable;
    const current = !m.superseded_by;
    const act = async (what, fn) => {
      try {
        const r = await fn();
        toast(what);
        if (r && r.id && r.id !== id) location.hash = `#/memory/${encodeURIComponent(r.id)}`;
        else memoryPage(id);
      } catch (err) {
        toast(err.message, true);
      }
    };
    const editor = el("textarea", { rows: 4, "data-testid": "edit-content" }, m.content);
    const reason = el("input", { placeholder: "reason for the edit", "data-testid": "edit-reason" });
    box.append(
      el("div", { class: "card" }, el("pre", { "data-testid": "memory-content" }, m.content)),
      el(
        "div",
        { class: "bar" },
        el("button", { "data-testid": "pin", disabled: locked || !current ? true : null, onclick: () => act(m.pinned ? "Unpinned" : "Pinned", () => api("PATCH", `/v1/memories/${encodeURIComponent(id)}`, { pinned: !m.pinned })) }, m.pinned ? "Unpin" : "Pin"),
        el("button", { "data-testid": "boost", disabled: locked ? true : null, onclick: () => act("Boosted", () => api("POST", "/v1/boost", { id })) }, "Boost"),
        el("button", { class: "danger", "data-testid": "delete", disabled: locked ? true : null, onclick: () => confirm("Delete this memory?") && act("Deleted", async () => { await api("DELETE", `/api/memories/${encodeURIComponent(id)}`); location.hash = "#/memories"; }) }, "Delete"),
        locked ? el("span", { class: "muted" }, "immutable: it cannot be changed") : null,
      ),
      el(
        "div",
        { class: "card" },
        el("h2", {}, "Edit"),
        editor,
        el("div", { class: "bar" }, reason, el("button", { "data-testid": "save-edit", disabled: locked || !current ? true : null, onclick: () => act("Saved as a new version", () => api("PATCH", `/v1/memories/${encodeURIComponent(id)}`, { content: editor.value, reason: reason.value || undefined })) }, "Save as new version")),
      ),
      el("h2", {}, "Fields"),
      table(
        [{ key: "k", label: "field" }, { key: "v", label: "value" }],
        Object.entries(m)
          .filter(([k]) => k !== "content")
          .map(([k, v]) => ({ k, v: typeof v === "object" && v !== null ? JSON.stringify(v) : String(v ?? "") })),
        { testid: "memory-fields" },
      ),
      el("h2", {}, "Versions"),
      table(
        [
          { key: "version", num: true },
          { key: "chunk_id", label: "id" },
          { key: "content", render: (r) => short(r.content) },
          { key: "created_at", label: "created" },
          { key: "valid_until", label: "valid until" },
          { key: "is_current", label: "current", render: (r) => (r.is_current ? "yes" : "") },
        ],
        history.versions,
        { testid: "versions", onRow: (r) => (location.hash = `#/memory/${encodeURIComponent(r.chunk_id)}`) },
      ),
      el("h2", {}, "History"),
      table(
        [
          { key: "created_at", label: "when", render: (r) => (typeof r.created_at === "number" ? new Date(r.created_at / 1000).toISOString() : r.created_at) },
          { key: "event" },
          { key: "chunk_id", label: "memory" },
          { key: "reason" },
          { key: "related_ids", label: "related", render: (r) => (r.related_ids || []).join(", ") },
        ],
        history.events,
        { testid: "history" },
      ),
      el("h2", {}, "Relations"),
      el(
        "p",
        { "data-testid": "relations" },
        (m.entities || []).length ? "Entities: " : "No entities.",
        (m.entities || []).map((e) => el("a", { class: "tag", href: `#/graph?entity=${encodeURIComponent(e)}&stream=${encodeURIComponent(m.stream)}` }, e)),
        m.supersedes ? el("span", {}, " · supersedes ", el("a", { href: `#/memory/${encodeURIComponent(m.supersedes)}` }, m.supersedes)) : null,
        m.superseded_by ? el("span", {}, " · superseded by ", el("a", { href: `#/memory/${encodeURIComponent(m.superseded_by)}` }, m.superseded_by)) : null,
      ),
    );
  });
}

// ---- search playground ----------------------------------------------------

async function searchPage(params) {
  await page("Search playground", async (box) => {
    const f = Object.fromEntries(params);
    const q = el("input", { name: "query", size: 50, value: f.query ?? "", "data-testid": "query", required: true });
    const form = el(
      "form",
      {
        class: "bar",
        onsubmit: async (e) => {
          e.preventDefault();
          const data = Object.fromEntries(new FormData(form));
          const body = { query: data.query, trace: true, top_k: Number(data.top_k || 10), mode: data.mode };
          if (data.streams) body.streams = data.streams.split(",").map((s) => s.trim()).filter(Boolean);
          for (const key of ["fact_type", "subject", "entity", "date_from", "date_to", "valid_at", "time_filter", "now", "as_of"])
            if (data[key]) body[key] = data[key];
          if (data.as_of && /^\d+$/.test(data.as_of)) body.as_of = Number(data.as_of);
          if (data.min_confidence) body.min_confidence = Number(data.min_confidence);
          body.include_superseded = Boolean(data.include_superseded);
          body.dry_run = Boolean(data.dry_run);
          out.replaceChildren(el("p", { class: "muted" }, "Searching…"));
          try {
            out.replaceChildren(results(await api("POST", "/v1/search", body)));
          } catch (err) {
            out.replaceChildren(failed(err));
          }
        },
      },
      el("label", {}, "query", q),
      el("label", {}, "streams (comma-separated; default: the key's)", el("input", { name: "streams", value: f.streams ?? "", "data-testid": "search-streams" })),
      el("label", {}, "mode", el("select", { name: "mode" }, ["hybrid", "bm25", "vector", "graph"].map((m) => el("option", { value: m }, m)))),
      el("label", {}, "top k", el("input", { name: "top_k", type: "number", min: 1, max: 100, value: 10, size: 4 })),
      el("label", {}, "type", el("input", { name: "fact_type", size: 10 })),
      el("label", {}, "subject", el("input", { name: "subject", size: 10 })),
      el("label", {}, "entity", el("input", { name: "entity", size: 10 })),
      el("label", {}, "created from", el("input", { name: "date_from", type: "date" })),
      el("label", {}, "created to", el("input", { name: "date_to", type: "date" })),
      el("label", {}, "relative", el("select", { name: "time_filter" }, ["", "today", "this_week", "this_month"].map((t) => el("option", { value: t }, t || "any time")))),
      el("label", {}, "valid at", el("input", { name: "valid_at", placeholder: "date or RFC 3339", size: 14 })),
      el("label", {}, "now", el("input", { name: "now", placeholder: "date or RFC 3339", size: 14 })),
      el("label", {}, "as of", el("input", { name: "as_of", placeholder: "version or RFC 3339", size: 14 })),
      el("label", {}, "min confidence", el("input", { name: "min_confidence", type: "number", min: 0, max: 1, step: 0.05, size: 4 })),
      el("label", { class: "inline" }, el("input", { type: "checkbox", name: "include_superseded", value: "1" }), "include superseded"),
      el("label", { class: "inline" }, el("input", { type: "checkbox", name: "dry_run", value: "1", checked: true }), "dry run (no access counts)"),
      el("button", { type: "submit", "data-testid": "run-search" }, "Search"),
    );
    const out = el("div", { "data-testid": "search-results" });
    box.append(form, out);
  });
}

function results(resp) {
  const meta = resp.trace_metadata;
  const legs = ["bm25", "vector", "graph"];
  const factorNames = [...new Set(resp.results.flatMap((r) => Object.keys(r.trace_info?.factors ?? {})))];
  return el(
    "div",
    {},
    meta
      ? el(
          "p",
          { class: "muted", "data-testid": "search-meta" },
          `${resp.results.length} results of ${meta.total_results_before_topk} candidates in ${(meta.search_latency_us / 1000).toFixed(1)} ms · streams ${meta.streams.join(", ")} · ` +
            Object.entries(meta.timings_us).map(([k, v]) => `${k} ${(v / 1000).toFixed(2)} ms`).join(", "),
        )
      : null,
    table(
      [
        { key: "rank", num: true, render: (r) => r._rank },
        { key: "content", render: (r) => el("a", { href: `#/memory/${encodeURIComponent(r.chunk_id)}` }, short(r.content, 110)) },
        ...legs.map((leg) => ({
          key: leg,
          label: `${leg} rank / score`,
          num: true,
          render: (r) => {
            const l = r.trace_info?.legs?.[leg];
            return l ? `#${l.rank} / ${fmt(l.score)}` : "—";
          },
        })),
        { key: "fused", num: true, render: (r) => fmt(r.trace_info?.rrf, 4) },
        ...factorNames.map((name) => ({ key: name, num: true, render: (r) => fmt(r.trace_info?.factors?.[name]) })),
        { key: "score_final", label: "final", num: true, render: (r) => fmt(r.score_final, 4) },
      ],
      resp.results.map((r, i) => ({ ...r, _rank: i + 1 })),
      { testid: "trace" },
    ),
  );
}

// ---- graph ----------------------------------------------------------------

async function graphPage(params) {
  await page("Graph", async (box) => {
    const f = Object.fromEntries(params);
    const streams = (await sql("SELECT DISTINCT stream FROM entities ORDER BY stream", [], 10000)).map((r) => r.stream);
    const stream = f.stream || streams[0];
    const picker = el(
      "select",
      { "data-testid": "graph-stream", onchange: () => (location.hash = `#/graph?stream=${encodeURIComponent(picker.value)}`) },
      streams.map((s) => el("option", { value: s, selected: s === stream ? true : null }, s)),
    );
    box.append(el("div", { class: "bar" }, el("label", {}, "stream", picker), el("span", { class: "muted" }, "Drag to pan, wheel to zoom, click an entity for its memories.")));
    if (!stream) {
      box.append(el("p", { class: "muted" }, "No entities yet."));
      return;
    }
    const [entities, edges] = await Promise.all([
      sql("SELECT key, name, entity_type, chunk_count FROM entities WHERE stream = $1 ORDER BY chunk_count DESC LIMIT 150", [stream]),
      sql("SELECT source, target, relation, weight FROM edges WHERE stream = $1 ORDER BY weight DESC LIMIT 400", [stream]),
    ]);
    const detail = el("div", { "data-testid": "entity-detail" });
    box.append(drawGraph(entities, edges, (e) => showEntity(e, stream, detail)), detail);
    const wanted = f.entity && entities.find((e) => e.name === f.entity || e.key === f.entity);
    if (wanted) showEntity(wanted, stream, detail);
  });
}

async function showEntity(e, stream, detail) {
  detail.replaceChildren(el("p", { class: "muted" }, `Loading ${e.name}…`));
  try {
    const rows = await sql(
      "SELECT id, content, created_at FROM chunks WHERE stream = $1 AND superseded_by IS NULL AND (array_has(entities, $2) OR array_has(entities, $3)) ORDER BY created_at DESC LIMIT 50",
      [stream, e.name, e.key],
    );
    detail.replaceChildren(
      el("h2", {}, `${e.name} (${e.entity_type}) · ${rows.length} memories`),
      table([{ key: "created_at", label: "created" }, { key: "content", render: (r) => short(r.content) }], rows, {
        testid: "entity-memories",
        onRow: (r) => (location.hash = `#/memory/${encodeURIComponent(r.id)}`),
      }),
    );
  } catch (err) {
    detail.replaceChildren(failed(err));
  }
}

// A force-directed layout (repulsion between every pair, springs on edges),
// run for a fixed number of steps; fine for the 150 entities shown.
function layout(nodes, links, W, H) {
  nodes.forEach((n, i) => {
    const a = (2 * Math.PI * i) / Math.max(1, nodes.length);
    n.x = W / 2 + (W / 3) * Math.cos(a);
    n.y = H / 2 + (H / 3) * Math.sin(a);
  });
  const k = Math.sqrt((W * H) / Math.max(1, nodes.length)) * 0.3;
  for (let step = 0; step < 200; step++) {
    const t = 8 * (1 - step / 200) + 0.5;
    for (const n of nodes) n.dx = n.dy = 0;
    for (let i = 0; i < nodes.length; i++)
      for (let j = i + 1; j < nodes.length; j++) {
        const a = nodes[i], b = nodes[j];
        const dx = a.x - b.x || 0.01, dy = a.y - b.y || 0.01;
        const d2 = dx * dx + dy * dy;
        const f = (k * k) / d2;
        a.dx += dx * f; a.dy += dy * f; b.dx -= dx * f; b.dy -= dy * f;
      }
    for (const l of links) {
      const dx = l.a.x - l.b.x, dy = l.a.y - l.b.y;
      const d = Math.sqrt(dx * dx + dy * dy) || 0.01;
      const f = d / k;
      l.a.dx -= dx * f; l.a.dy -= dy * f; l.b.dx += dx * f; l.b.dy += dy * f;
    }
    for (const n of nodes) {
      n.dx += (W / 2 - n.x) * 0.5; n.dy += (H / 2 - n.y) * 0.5;
      const d = Math.sqrt(n.dx * n.dx + n.dy * n.dy) || 1;
      n.x = Math.min(W - 60, Math.max(20, n.x + (n.dx / d) * Math.min(d, t)));
      n.y = Math.min(H - 20, Math.max(20, n.y + (n.dy / d) * Math.min(d, t)));
    }
  }
}

function drawGraph(entities, edges, onPick) {
  const W = 1000, H = 520;
  const byKey = new Map();
  const nodes = entities.map((e) => ({ ...e }));
  for (const n of nodes) {
    byKey.set(n.key, n);
    byKey.set(n.name, n);
  }
  const links = edges.map((e) => ({ ...e, a: byKey.get(e.source), b: byKey.get(e.target) })).filter((l) => l.a && l.b && l.a !== l.b);
  layout(nodes, links, W, H);
  const view = { x: 0, y: 0, w: W, h: H };
  const root = svg("svg", { id: "graph-canvas", viewBox: `0 0 ${W} ${H}`, "data-testid": "graph" });
  const setView = () => root.setAttribute("viewBox", `${view.x} ${view.y} ${view.w} ${view.h}`);
  const g = svg("g");
  for (const l of links)
    g.append(svg("line", { x1: l.a.x, y1: l.a.y, x2: l.b.x, y2: l.b.y, stroke: "#b8c2cc", "stroke-width": Math.min(4, 0.7 + Math.log1p(l.weight)) }, svg("title", { text: l.relation })));
  const colors = { person: "#d0782a", place: "#3a9a5b", organization: "#7b4fb0", project: "#b3261e" };
  for (const n of nodes) {
    g.append(
      svg(
        "circle",
        { cx: n.x, cy: n.y, r: 4 + Math.min(10, Math.sqrt(n.chunk_count) * 2), fill: colors[String(n.entity_type).toLowerCase()] ?? "#2f6fb0", "data-entity": n.name, onclick: () => onPick(n) },
        svg("title", { text: `${n.name} (${n.entity_type}): ${n.chunk_count} memories` }),
      ),
      svg("text", { x: n.x + 8, y: n.y + 4, text: n.name }),
    );
  }
  root.append(g);
  root.addEventListener("wheel", (e) => {
    e.preventDefault();
    const s = e.deltaY > 0 ? 1.15 : 1 / 1.15;
    const r = root.getBoundingClientRect();
    const px = view.x + ((e.clientX - r.left) / r.width) * view.w;
    const py = view.y + ((e.clientY - r.top) / r.height) * view.h;
    view.x = px - (px - view.x) * s;
    view.y = py - (py - view.y) * s;
    view.w *= s;
    view.h *= s;
    setView();
  });
  let drag = null;
  root.addEventListener("pointerdown", (e) => {
    if (e.target.tagName === "circle") return;
    drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y };
  });
  root.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const r = root.getBoundingClientRect();
    view.x = drag.vx - ((e.clientX - drag.x) / r.width) * view.w;
    view.y = drag.vy - ((e.clientY - drag.y) / r.height) * view.h;
    setView();
  });
  root.addEventListener("pointerup", () => (drag = null));
  root.addEventListener("pointerleave", () => (drag = null));
  return root;
}

// ---- ingestion --------------------------------------------------------------

async function ingestionPage() {
  await page("Ingestion", async (box) => {
    const [status, dead] = await Promise.all([
      api("GET", "/v1/status"),
      sql("SELECT id, stream, pipeline, memory_id, error, attempts, failed_at FROM dead_letters ORDER BY failed_at DESC LIMIT 100"),
    ]);
    const lag = status.bus.lag;
    box.append(
      el(
        "div",
        { class: "cards" },
        el("div", { class: "card stat" }, el("b", {}, status.bus.kind), status.bus.connected ? "bus connected" : "bus DISCONNECTED"),
        el("div", { class: "card stat" }, el("b", { "data-testid": "bus-pending" }, lag ? lag.pending : "—"), "waiting on the bus"),
        el("div", { class: "card stat" }, el("b", {}, lag ? lag.ack_pending : "—"), "in the pipeline"),
        el("div", { class: "card stat" }, el("b", {}, lag ? lag.redelivered : "—"), "redelivered"),
        el("div", { class: "card stat" }, el("b", {}, status.dead_letters), "dead letters"),
        el("div", { class: "card stat" }, el("b", {}, status.embedder.model), `embedder, ${status.embedder.stale} stale`),
      ),
    );
    const pipelines = Object.entries(status.pipelines);
    if (!pipelines.length) box.append(el("p", { class: "muted" }, "Per-stage counters are daemon-wide: an admin key sees them."));
    for (const [name, stages] of pipelines) {
      box.append(
        el("h2", {}, `Pipeline ${name}`),
        table(
          [
            { key: "stage" },
            { key: "batches", num: true },
            { key: "records_in", label: "in", num: true },
            { key: "records_out", label: "out", num: true },
            { key: "dropped", render: (r) => Object.entries(r.dropped).map(([k, v]) => `${k} ${v}`).join(", ") },
            { key: "failed", num: true },
            { key: "rate", label: "records/s in stage", num: true, render: (r) => (r.total_micros ? Math.round((r.records_in * 1e6) / r.total_micros) : "") },
            { key: "per", label: "µs/record", num: true, render: (r) => (r.records_in ? (r.total_micros / r.records_in).toFixed(1) : "") },
          ],
          stages,
          { testid: `pipeline-${name}` },
        ),
      );
    }
    box.append(
      el("h2", {}, "Dead letters"),
      table(
        [
          { key: "failed_at", label: "failed" },
          { key: "stream" },
          { key: "pipeline" },
          { key: "attempts", num: true },
          { key: "error", render: (r) => short(r.error, 200) },
          {
            key: "retry",
            render: (r) =>
              el("button", {
                class: "secondary",
                onclick: async (e) => {
                  e.stopPropagation();
                  try {
                    const res = await api("POST", `/v1/dead-letters/${encodeURIComponent(r.id)}/retry`);
                    toast(`Retried: ${res.status}${res.error ? ` (${res.error})` : ""}`);
                    ingestionPage();
                  } catch (err) {
                    toast(err.message, true);
                  }
                },
              }, "Retry"),
          },
        ],
        dead,
        { testid: "dead-letters" },
      ),
    );
  });
}

// ---- jobs -------------------------------------------------------------------

async function jobsPage() {
  await page("Jobs", async (box) => {
    if (!isAdmin()) {
      box.append(el("p", { class: "muted" }, "Jobs are daemon-wide: they need the admin key."));
      return;
    }
    const [schedule, runs] = await Promise.all([api("GET", "/admin/jobs"), api("GET", "/v1/jobs?limit=50")]);
    const run = (name) => async () => {
      try {
        const r = await api("POST", `/admin/jobs/${name}/run`, {});
        toast(`${name}: ${r.status} in ${r.duration_ms} ms`);
        jobsPage();
      } catch (err) {
        toast(err.message, true);
      }
    };
    const toggle = async () => {
      try {
        await api("POST", schedule.paused ? "/admin/workers/resume" : "/admin/workers/pause");
        jobsPage();
      } catch (err) {
        toast(err.message, true);
      }
    };
    box.append(
      el(
        "div",
        { class: "bar" },
        el("span", { "data-testid": "scheduler-state" }, `Scheduler ${schedule.scheduler_enabled ? "on" : "off"}; maintenance ${schedule.paused ? "paused" : "running"}.`),
        el("button", { class: "secondary", "data-testid": "pause", onclick: toggle }, schedule.paused ? "Resume" : "Pause"),
      ),
      table(
        [
          { key: "name", label: "job" },
          { key: "cron", render: (r) => r.cron ?? "not scheduled" },
          { key: "enabled", render: (r) => (r.enabled ? "yes" : "no") },
          { key: "next_run", label: "next run" },
          { key: "run", render: (r) => el("button", { "data-testid": `run-${r.name}`, onclick: run(r.name) }, "Run now") },
        ],
        schedule.jobs,
        { testid: "schedule" },
      ),
      el("h2", {}, "Recent runs"),
      table(
        [
          { key: "started_at", label: "started" },
          { key: "job" },
          { key: "trigger" },
          { key: "status" },
          { key: "duration_ms", label: "ms", num: true },
          { key: "report", render: (r) => short(r.error ?? JSON.stringify(r.report ?? ""), 160) },
        ],
        runs.runs,
        { testid: "runs" },
      ),
    );
  });
}

// ---- SQL --------------------------------------------------------------------

const TABLES = ["chunks", "entities", "edges", "history", "dead_letters", "llm_calls", "feedback"];

async function sqlPage() {
  await page("SQL", async (box) => {
    const text = el("textarea", { rows: 6, "data-testid": "sql-text" }, sessionStorage.getItem("loomem.sql") ?? "SELECT stream, memory_type, count(*) AS n FROM chunks GROUP BY stream, memory_type ORDER BY n DESC");
    const out = el("div", { "data-testid": "sql-result" });
    const run = async () => {
      sessionStorage.setItem("loomem.sql", text.value);
      try {
        const r = await api("POST", "/v1/sql", { sql: text.value });
        out.replaceChildren(
          el("p", { class: "muted" }, `${r.row_count} rows${r.truncated ? " (truncated)" : ""}`),
          table(r.columns.map((c) => ({ key: c, render: (row) => (typeof row[c] === "object" && row[c] !== null ? JSON.stringify(row[c]) : row[c]) })), r.rows, { testid: "sql-rows" }),
        );
      } catch (err) {
        out.replaceChildren(failed(err));
      }
    };
    const download = (format, ext) => async () => {
      try {
        const resp = await fetch("/v1/sql", { method: "POST", headers: headers(), body: JSON.stringify({ sql: text.value, format }) });
        if (!resp.ok) throw new Error(`${resp.status}: ${(await resp.json()).detail}`);
        const url = URL.createObjectURL(await resp.blob());
        const a = el("a", { href: url, download: `loomem-query.${ext}` });
        document.body.append(a);
        a.click();
        a.remove();
        setTimeout(() => URL.revokeObjectURL(url), 1000);
      } catch (err) {
        out.replaceChildren(failed(err));
      }
    };
    box.append(
      el("p", { class: "muted" }, "Tables: ", TABLES.map((t) => el("a", { class: "tag", href: "#/sql", onclick: (e) => { e.preventDefault(); text.value = `SELECT * FROM ${t} LIMIT 20`; } }, t)), " — read-only, scoped to your key's streams; chunks_valid_at(ts) and chunks_as_of(version) travel in time."),
      text,
      el(
        "div",
        { class: "bar" },
        el("button", { "data-testid": "sql-run", onclick: run }, "Run"),
        el("button", { class: "secondary", "data-testid": "sql-csv", onclick: download("csv", "csv") }, "Download CSV"),
        el("button", { class: "secondary", "data-testid": "sql-parquet", onclick: download("parquet", "parquet") }, "Download Parquet"),
      ),
      out,
    );
  });
}

// ---- snapshots --------------------------------------------------------------

async function snapshotsPage() {
  await page("Snapshots", async (box) => {
    if (!isAdmin()) {
      box.append(el("p", { class: "muted" }, "Snapshots tag every table at once: they need the admin key."));
      return;
    }
    const { snapshots } = await api("GET", "/v1/snapshots");
    const name = el("input", { placeholder: "name (optional)", "data-testid": "snapshot-name" });
    const act = (what, fn) => async () => {
      try {
        await fn();
        toast(what);
        snapshotsPage();
      } catch (err) {
        toast(err.message, true);
      }
    };
    box.append(
      el("div", { class: "bar" }, name, el("button", { "data-testid": "snapshot-create", onclick: act("Snapshot created", () => api("POST", "/v1/snapshots", name.value ? { name: name.value } : {})) }, "Create snapshot")),
      table(
        [
          { key: "name" },
          { key: "created_at", label: "created" },
          { key: "versions", label: "holds (table versions)", render: (r) => Object.entries(r.versions).map(([t, v]) => `${t} v${v}`).join(", ") },
          {
            key: "actions",
            render: (r) =>
              el(
                "span",
                {},
                el("button", { class: "secondary", onclick: () => confirm(`Roll every table back to ${r.name}?`) && act(`Rolled back to ${r.name}`, () => api("POST", `/v1/snapshots/${encodeURIComponent(r.name)}/rollback`))() }, "Roll back"),
                " ",
                el("button", { class: "danger", onclick: () => confirm(`Delete snapshot ${r.name}?`) && act("Deleted", () => api("DELETE", `/v1/snapshots/${encodeURIComponent(r.name)}`))() }, "Delete"),
              ),
          },
        ],
        snapshots,
        { testid: "snapshots" },
      ),
    );
  });
}

// ---- routing ----------------------------------------------------------------

const PAGES = {
  streams: streamsPage,
  memories: memoriesPage,
  memory: memoryPage,
  search: searchPage,
  graph: graphPage,
  ingestion: ingestionPage,
  jobs: jobsPage,
  sql: sqlPage,
  snapshots: snapshotsPage,
};

async function route() {
  if (!me && !(await signIn())) return signInPage();
  document.getElementById("nav").hidden = false;
  document.getElementById("signout").hidden = !sessionStorage.getItem(KEY);
  const streams = me.accessible_streams.join(", ");
  document.getElementById("who").textContent = `${me.name} (${me.role}) · streams: ${streams}`;
  const [path, query] = (location.hash.slice(2) || "streams").split("?");
  const [name, ...rest] = path.split("/");
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("href") === `#/${name}` || (name === "memory" && a.getAttribute("href") === "#/memories"));
  const show = PAGES[name] ?? streamsPage;
  await show(name === "memory" ? decodeURIComponent(rest.join("/")) : new URLSearchParams(query ?? ""));
}

document.getElementById("signout").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  me = null;
  signInPage();
});
window.addEventListener("hashchange", route);
route();
