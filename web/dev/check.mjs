// Checks the built page against the fixture daemon in headless Chromium: the DOM hooks the
// browser test relies on (the status event shown among them), live updates without relayout,
// keyboard access, reconnection after a restart, that no request leaves the server and that
// the console has no error. Needs playwright-core, installed outside the repository:
//   (cd /tmp/pw && npm i playwright-core) && PLAYWRIGHT_CORE=/tmp/pw/node_modules/playwright-core/index.mjs node dev/check.mjs
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const { chromium } = await import(process.env.PLAYWRIGHT_CORE ?? 'playwright-core');
const port = Number(process.env.PORT ?? 7980);
const web = fileURLToPath(new URL('..', import.meta.url));
const base = `http://127.0.0.1:${port}/`;
let server;
async function start() {
  server = spawn('node', ['dev/server.mjs', '--port', String(port)], { cwd: web, stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise((r) => server.stdout.once('data', r));
}
const stop = () => new Promise((r) => { server.once('exit', r); server.kill('SIGTERM'); });
const ok = (cond, what) => { console.log(cond ? 'ok  ' : 'FAIL', what); if (!cond) process.exitCode = 1; };

await start();
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'] });
const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
const requests = [];
page.on('request', (r) => requests.push(r.url()));
// Errors in the console fail, but for the page's reconnection attempts while the daemon is away.
const consoleErrors = [];
page.on('pageerror', (e) => consoleErrors.push(`uncaught: ${e.message}`));
page.on('console', (m) => {
  if (m.type() === 'error' && !m.location().url.endsWith('/api/events')) consoleErrors.push(m.text());
});

await page.goto(base + '#/');
await page.waitForSelector('[data-connection="live"]', { timeout: 10000 });
ok(await page.locator('[data-topology="telemetry"][data-phase="cutover"]').count() === 1, 'overview row telemetry, phase cutover');
ok(await page.locator('[data-topology="billing"][data-phase="idle"]').count() === 1, 'overview row billing, phase idle');
ok((await page.locator('[data-error]').first().textContent()).includes('topologies/billing/steps/fx.yaml:12'), 'overview error has file:line');
ok(await page.locator('[data-error] a[href^="https://github.com/acme/topologies/blob/"]').count() === 1, 'error place links to the forge');

await page.click('a[href="#/topology/telemetry"]');
await page.waitForSelector('[data-step="clean"]');
ok(page.url().endsWith('#/topology/telemetry'), 'URL #/topology/telemetry');
const clean = page.locator('[data-step="clean"][data-kind="processor"]');
const text = await clean.textContent();
ok(/clean/.test(text) && /replica/.test(text) && /lag \d/.test(text) && /rec\/s/.test(text), `processor node text: ${text}`);
ok(await page.locator('[data-step="raw"][data-kind="source"][data-state="external"]').count() === 1, 'source node kind/state');
ok(await page.locator('[data-step="alerts"][data-kind="sink"]').count() === 1, 'sink node');
ok(await page.locator('[data-cutover]').count() === 1, 'cutover present');
for (const s of ['done', 'running', 'waiting', 'pending']) ok(await page.locator(`[data-action][data-action-state="${s}"]`).count() > 0, `an action ${s}`);
const histBefore = await page.locator('[data-history][data-to]').count();
ok(histBefore === 3, `history of telemetry: ${histBefore} entries`);
ok(await page.locator('[data-plan="refs/pull/42/head"]').count() === 1, 'plan touching telemetry shown');
ok(await page.locator('[data-plan="refs/heads/fix-fx-timeout"]').count() === 0, 'plan not touching telemetry not shown');

// Numbers change, the layout does not.
const parse = await page.$('[data-step="parse"]');
const t0 = await parse.getAttribute('transform');
const txt0 = await parse.textContent();
const eventOf = () => page.evaluate(() => [document.querySelector('main').dataset.eventId, document.querySelector('main').hasAttribute('data-event-opening')]);
const [id0] = await eventOf();
await page.waitForFunction((t) => document.querySelector('[data-step="parse"]').textContent !== t, txt0, { timeout: 5000 });
const [id1, opening1] = await eventOf();
ok(/^\d+$/.test(id0 ?? '') && Number(id1) > Number(id0) && !opening1, `main marks the status event shown, a numbered change after an update (${id0} -> ${id1})`);
ok(await parse.evaluate((e) => e.isConnected), 'same node element after an update (no re-render of the layout)');
ok((await parse.getAttribute('transform')) === t0, 'node position unchanged after a numbers update');

// Keyboard: Tab to a node, Enter opens its details.
await page.locator('main').focus();
let found = false;
for (let i = 0; i < 30 && !found; i++) {
  await page.keyboard.press('Tab');
  found = await page.evaluate(() => document.activeElement?.getAttribute('data-step') === 'parse');
}
ok(found, 'Tab reaches a node');
await page.keyboard.press('Enter');
const details = await page.locator('.details').textContent();
ok(details.includes('topologies/telemetry/steps/parse.yaml') && details.includes('plumber.telemetry.parse.dlq'), 'Enter shows details (file, dead-letter topic)');
ok((await page.locator('[data-step="parse"]').getAttribute('aria-label')).includes('running'), 'aria-label carries the state');
// Records are read only when asked.
const recordRequests = () => requests.filter((u) => u.includes('/api/records/')).length;
ok(recordRequests() === 0, 'no record read before asking');
await page.locator('[data-recent-records="parse"] button').click();
await page.waitForSelector('[data-recent-records="parse"] [data-record="dead-letter"]');
ok(recordRequests() === 1 && requests.some((u) => u.endsWith('/api/records/telemetry/parse?limit=10')), 'one read of the step\'s records, on asking');
ok((await page.locator('[data-recent-records="parse"] [data-record="written"]').count()) === 2, 'the records the step wrote');
ok((await page.locator('[data-recent-records="parse"] [data-record="dead-letter"]').textContent()).includes('invalid-json'), 'a dead letter with its kind');

// A replaced step shows the life its move retires, in words, beside the new one.
const enrich = page.locator('[data-step="enrich"]');
const retiringGroup = await enrich.getAttribute('data-retiring');
ok(/^plumber\.telemetry\.enrich\.[0-9a-f]{12}$/.test(retiringGroup ?? ''), `enrich marks its retiring life: ${retiringGroup}`);
ok(/replacing [0-9a-f]{8}: draining, lag \d/.test(await enrich.textContent()), `enrich node says it drains the old life: ${await enrich.textContent()}`);
ok((await enrich.getAttribute('aria-label')).includes(`replacing life ${retiringGroup}, draining`), 'aria-label carries the retiring life');
ok(await page.locator('[data-step="parse"][data-retiring]').count() === 0, 'an unreplaced step has no retiring life');
await enrich.click();
const retiringDetails = await page.locator(`.details [data-retiring-details="${retiringGroup}"]`).textContent();
ok(retiringDetails.includes(retiringGroup) && /draining/.test(retiringDetails) && /Replicas\s*2/.test(retiringDetails), `details show the retiring life: ${retiringDetails}`);

// The cutover walks forward, then ends and joins the history.
const done0 = await page.locator('[data-action-state="done"]').count();
await page.waitForFunction((n) => document.querySelectorAll('[data-action-state="done"]').length > n, done0, { timeout: 8000 });
ok(true, 'cutover progresses');
await page.waitForSelector('[data-step="enrich"]:not([data-retiring])', { timeout: 40000 });
ok(true, 'the retiring life leaves enrich once it is stopped');
await page.waitForSelector('[data-cutover]', { state: 'detached', timeout: 40000 });
ok(true, 'cutover ends');
await page.waitForFunction((n) => document.querySelectorAll('[data-history][data-to]').length === n + 1, histBefore, { timeout: 5000 });
ok(true, 'history event appended an entry');

// A daemon restart: reconnecting, then live again, and history and plans fetched again.
const historyFetches = () => requests.filter((u) => u.endsWith('/api/history')).length;
const plansFetches = () => requests.filter((u) => u.endsWith('/api/plans')).length;
const h0 = historyFetches();
const p0 = plansFetches();
await stop();
await page.waitForSelector('[data-connection="reconnecting"]', { timeout: 10000 });
ok((await page.locator('[data-connection]').textContent()).includes('reconnecting'), 'shows reconnecting');
await start();
await page.waitForSelector('[data-connection="live"]', { timeout: 15000 });
ok(true, 'live again after the restart');
await page.waitForFunction(() => document.querySelector('[data-cutover]') != null, null, { timeout: 5000 });
ok(true, 'status of the new daemon shown (cutover again)');
await page.waitForTimeout(500);
ok(historyFetches() > h0 && plansFetches() > p0, `history and plans refetched (${h0}->${historyFetches()}, ${p0}->${plansFetches()})`);

await page.goto(base + '#/plans');
await page.waitForSelector('[data-plan]');
ok(await page.locator('[data-plan]').count() === 2, 'two plans');
ok((await page.locator('[data-plan="refs/heads/fix-fx-timeout"] [data-error]').first().textContent()).includes('topologies/billing/steps/fx.yaml:12'), 'invalid plan error with file:line');
const diff = page.locator('[data-plan="refs/pull/42/head"] [data-diff-step="enrich"]');
ok((await diff.locator('[data-version="new"]').textContent()) === 'new: 90 passed (90 outputs), 0 filtered out, 10 dead-lettered (invalid-json 3, jq-error 7)', 'data diff: the new version\'s tally');
ok((await diff.locator('table.examples tbody tr').count()) === 1 && (await diff.textContent()).includes('new dead-letter kinds: jq-error'), 'data diff: an example and the new dead-letter kind');
ok((await page.locator('[data-plan="refs/pull/42/head"] [data-diff-step="geo"]').textContent()).includes('not sampled'), 'data diff: why a step was not sampled');
ok(await page.locator('[data-plan="refs/pull/42/head"] [data-change="added"]').count() === 1, 'plan diagram marks added steps');

await page.goto(base + '#/topology/billing');
await page.waitForSelector('[data-step="fx"]');
ok((await page.locator('[data-error]').first().textContent()).includes('topologies/billing/steps/fx.yaml:12'), 'billing page shows the daemon error with file:line');
ok(await page.locator('[data-cutover]').count() === 0, 'no cutover on billing');

const outside = requests.filter((u) => !u.startsWith(base));
ok(outside.length === 0, `no request outside the server (${requests.length} requests)`);
ok(consoleErrors.length === 0, `no error in the console${consoleErrors.length ? `: ${consoleErrors.join('; ')}` : ''}`);
await browser.close();
await stop();
