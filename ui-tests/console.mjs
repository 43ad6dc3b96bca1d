// End-to-end tests of the loomem console in Debian's headless Chromium,
// driven by playwright-core. Started by tests/console/ui.rs against a real
// daemon it has seeded; every step asserts what the page shows and leaves a
// screenshot of the page in SHOTS.
//
// Environment: LOOMEM_URL, ADMIN_KEY, SCOPED_KEY (a key for streams a and
// a2 only), B_MEMORY (the id of a memory in stream b), SHOTS (a directory),
// CHROMIUM (default /usr/bin/chromium).

import { chromium } from "playwright-core";
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

const env = (name, fallback) => {
  const v = process.env[name] ?? fallback;
  if (v === undefined) throw new Error(`${name} is not set`);
  return v;
};
const url = env("LOOMEM_URL");
const shots = env("SHOTS");
mkdirSync(shots, { recursive: true });

function check(cond, message) {
  if (!cond) throw new Error(`check failed: ${message}`);
}

const browser = await chromium.launch({
  executablePath: env("CHROMIUM", "/usr/bin/chromium"),
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});

const T = 20_000; // a step's deadline (the machine may be busy)

async function signedIn(key) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 }, acceptDownloads: true });
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(`${url}/ui`);
  await page.locator("#key").fill(key);
  await page.locator("#signin").click();
  await page.locator("#nav").waitFor({ state: "visible", timeout: T });
  page.errors = errors;
  return { context, page };
}

async function shot(page, name) {
  await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
}

async function rowsOf(page, testid) {
  const t = page.getByTestId(testid);
  await t.waitFor({ timeout: T });
  return t.locator("tbody tr").allInnerTexts();
}

try {
  // A wrong key is refused; the admin key signs in.
  {
    const context = await browser.newContext();
    const page = await context.newPage();
    await page.goto(`${url}/ui`);
    await page.locator("#key").fill("not-a-key");
    await page.locator("#signin").click();
    await page.getByText("That key was not accepted.").waitFor({ timeout: T });
    await shot(page, "sign-in");
    check(!(await page.locator("#nav").isVisible()), "the console stays closed without a valid key");
    await context.close();
  }

  const { context, page } = await signedIn(env("ADMIN_KEY"));

  // Streams: every stream with its counts, a growth chart.
  await page.goto(`${url}/ui#/streams`);
  let rows = await rowsOf(page, "streams");
  check(rows.some((r) => r.startsWith("a\t")), `stream a listed: ${rows}`);
  check(rows.some((r) => r.startsWith("b\t")), `stream b listed for the admin: ${rows}`);
  await page.getByTestId("growth").locator("circle").first().waitFor({ timeout: T });
  await shot(page, "streams");

  // Memories: the stored ones are in the table; filter by text.
  await page.goto(`${url}/ui#/memories?stream=a`);
  rows = await rowsOf(page, "memories");
  check(rows.some((r) => r.includes("Alice moved to Lisbon")), `Alice's memory listed: ${rows}`);
  await page.goto(`${url}/ui#/memories?stream=a&text=lisbon`);
  await page.getByTestId("memory-count").getByText("1 memories").waitFor({ timeout: T });
  await shot(page, "memories");

  // A memory's page; an edit makes a new version with the reason in its history.
  await page.getByTestId("memories").locator("tbody tr").first().click();
  await page.getByTestId("memory-content").getByText("Alice moved to Lisbon").waitFor({ timeout: T });
  await page.getByTestId("edit-content").fill("Alice moved to Porto in April");
  await page.getByTestId("edit-reason").fill("she moved again");
  await page.getByTestId("save-edit").click();
  await page.getByTestId("memory-content").getByText("Alice moved to Porto in April").waitFor({ timeout: T });
  rows = await rowsOf(page, "versions");
  check(rows.length === 2, `two versions after the edit: ${rows}`);
  const history = await rowsOf(page, "history");
  check(history.some((r) => r.includes("edited") && r.includes("she moved again")), `the edit and its reason in the history: ${history}`);
  check(history.some((r) => r.includes("superseded")), `the old version superseded: ${history}`);
  await page.getByTestId("pin").click();
  await page.getByTestId("pin").getByText("Unpin").waitFor({ timeout: T });
  await shot(page, "memory");

  // Search playground: each leg's rank in the trace.
  await page.goto(`${url}/ui#/search`);
  await page.getByTestId("query").fill("Bob Acme dashboard");
  await page.getByTestId("search-streams").fill("a");
  await page.getByTestId("run-search").click();
  rows = await rowsOf(page, "trace");
  check(rows.length > 0, "the search found something");
  check(/Bob works at Acme/.test(rows[0]), `Bob's memory first: ${rows[0]}`);
  check(/#1 \//.test(rows[0]), `the first result shows a leg rank #1: ${rows[0]}`);
  const header = await page.getByTestId("trace").locator("thead").innerText();
  for (const col of ["bm25 rank / score", "vector rank / score", "graph rank / score", "fused", "final"])
    check(header.includes(col), `trace column ${col}: ${header}`);
  await shot(page, "search");

  // Graph: entities drawn; clicking one lists its memories.
  await page.goto(`${url}/ui#/graph?stream=a`);
  const bob = page.locator('circle[data-entity="Bob"]');
  await bob.waitFor({ timeout: T });
  check((await page.getByTestId("graph").locator("line").count()) > 0, "edges drawn");
  await bob.click();
  rows = await rowsOf(page, "entity-memories");
  check(rows.some((r) => r.includes("Bob works at Acme")), `Bob's memories listed: ${rows}`);
  await page.getByTestId("graph").hover();
  await page.mouse.wheel(0, -120);
  await shot(page, "graph");

  // SQL: a query as a table, then the same as a CSV download.
  await page.goto(`${url}/ui#/sql`);
  await page.getByTestId("sql-text").fill("SELECT stream, count(*) AS n FROM chunks GROUP BY stream ORDER BY stream");
  await page.getByTestId("sql-run").click();
  rows = await rowsOf(page, "sql-rows");
  check(rows.length === 2 && rows[0].startsWith("a\t") && rows[1].startsWith("b\t"), `a row per stream: ${rows}`);
  const [download] = await Promise.all([page.waitForEvent("download", { timeout: T }), page.getByTestId("sql-csv").click()]);
  const csv = readFileSync(await download.path(), "utf8");
  check(csv.split("\n")[0].trim() === "stream,n", `CSV header: ${csv}`);
  check(csv.includes("a,") && csv.includes("b,"), `CSV rows: ${csv}`);
  await shot(page, "sql");

  // Ingestion: per-stage counters of the store pipeline.
  await page.goto(`${url}/ui#/ingestion`);
  rows = await rowsOf(page, "pipeline-store");
  check(rows.some((r) => r.startsWith("embed\t")), `the embed stage listed: ${rows}`);
  await page.getByTestId("bus-pending").waitFor({ timeout: T });
  await shot(page, "ingestion");

  // Jobs: run decay now; its run appears.
  await page.goto(`${url}/ui#/jobs`);
  await page.getByTestId("run-decay").click();
  await page.getByTestId("runs").locator("tbody tr", { hasText: "decay" }).first().waitFor({ timeout: T });
  rows = await rowsOf(page, "runs");
  check(rows.some((r) => r.includes("decay") && r.includes("succeeded")), `the decay run listed: ${rows}`);
  await shot(page, "jobs");

  // Snapshots: create one; it is listed with what it holds.
  await page.goto(`${url}/ui#/snapshots`);
  await page.getByTestId("snapshot-name").fill("console-test");
  await page.getByTestId("snapshot-create").click();
  await page.getByTestId("snapshots").locator("tbody tr", { hasText: "console-test" }).waitFor({ timeout: T });
  rows = await rowsOf(page, "snapshots");
  check(rows.some((r) => r.includes("console-test") && r.includes("chunks v")), `the snapshot listed: ${rows}`);
  await shot(page, "snapshots");
  check(page.errors.length === 0, `no script errors: ${page.errors}`);
  await context.close();

  // A scoped key sees its own streams only, everywhere.
  {
    const { context, page } = await signedIn(env("SCOPED_KEY"));
    await page.goto(`${url}/ui#/streams`);
    rows = await rowsOf(page, "streams");
    check(rows.length === 1 && rows[0].startsWith("a\t"), `only stream a: ${rows}`);
    await page.goto(`${url}/ui#/memories`);
    rows = await rowsOf(page, "memories");
    check(!rows.some((r) => r.includes("Carol")), `stream b's memory hidden: ${rows}`);
    await page.goto(`${url}/ui#/memory/${env("B_MEMORY")}`);
    await page.getByTestId("error").getByText("404").waitFor({ timeout: T });
    await page.goto(`${url}/ui#/sql`);
    await page.getByTestId("sql-text").fill("SELECT count(*) AS n FROM chunks WHERE stream = 'b'");
    await page.getByTestId("sql-run").click();
    rows = await rowsOf(page, "sql-rows");
    check(rows[0].trim() === "0", `SQL sees nothing of stream b: ${rows}`);
    await page.goto(`${url}/ui#/jobs`);
    await page.getByText("they need the admin key").waitFor({ timeout: T });
    await shot(page, "scoped-key");
    await context.close();
  }
  console.log("console: every check passed");
} finally {
  await browser.close();
}
