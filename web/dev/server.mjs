// A stand-in daemon for front-end work: serves web/dist and fixture JSON, and an event stream
// where lag and records/s move every second and the cutover walks forward.
//
//   node dev/server.mjs [--port 7979] [--frozen] [--log]
//
// --frozen: the documents never change (for screenshots); events still connect.
import { createServer } from 'node:http';
import { readFile } from 'node:fs/promises';
import { extname, join, normalize } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as fx from './fixtures.mjs';

const args = process.argv.slice(2);
const flag = (name) => args.includes(name);
const option = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 && args[i + 1] ? args[i + 1] : fallback;
};
const port = Number(option('--port', process.env.PORT ?? '7979'));
const frozen = flag('--frozen');
const log = flag('--log');
const dist = fileURLToPath(new URL('../dist/', import.meta.url));

const status = fx.status();
const history = fx.history();
const plans = fx.plans();
const clients = new Set();
let eventId = 0;
let version = 0;

function send(res, event, data) {
  res.write(`id: ${++eventId}\nevent: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
}
const broadcast = (event, data) => {
  for (const res of clients) send(res, event, data);
};

// --- the simulation ---------------------------------------------------------------------
const telemetry = () => status.topologies.find((t) => t.name === 'telemetry');
const jitter = (n, spread) => Math.max(0, Math.round(n + (Math.random() - 0.5) * spread));

function tick() {
  for (const t of status.topologies) {
    for (const s of t.steps) {
      if (s.kind !== 'processor' || s.state === 'stopped') continue;
      s.lag = jitter(s.lag ?? 0, Math.max(10, (s.lag ?? 0) * 0.3));
      s.recordsPerSecond = Math.max(0, Math.round(((s.recordsPerSecond ?? 0) + (Math.random() - 0.5) * 40) * 10) / 10);
      if (s.retiring) s.retiring.lag = jitter(s.retiring.lag ?? 0, Math.max(10, (s.retiring.lag ?? 0) * 0.3));
    }
  }
  broadcast('status', status);
}

let idleSince = null;
let generation = 42;

function startCutover(t) {
  const to = fx.commit(`telemetry-v${++generation}`);
  t.phase = 'cutover';
  t.cutover = {
    to,
    from: t.commit,
    startedAt: Math.floor(Date.now() / 1000),
    done: 0,
    remaining: 0,
    current: null,
    waiting: [],
    actions: fx.cutoverActions().map((a, i) => ({ ...a, state: i === 0 ? 'running' : a.state === 'waiting' ? 'waiting' : 'pending', failures: a.failures })),
  };
  recount(t.cutover);
  status.commit = to;
  status.phase = 'cutover';
  const retiring = fx.retiringLives();
  for (const s of t.steps) {
    if (s.name === 'enrich' || s.name === 'score') Object.assign(s, { state: 'starting', retiring: retiring[s.name] });
  }
}

function recount(c) {
  c.done = c.actions.filter((a) => a.state === 'done').length;
  c.remaining = c.actions.length - c.done;
  c.current = c.actions.find((a) => a.state === 'running')?.action ?? null;
  c.waiting = c.actions
    .filter((a) => a.state === 'waiting')
    .map((a) => ({ action: a.action, reason: a.reason ?? '', failures: a.failures ?? 0 }));
}

function advance() {
  const t = telemetry();
  if (!t.cutover) {
    if (idleSince != null && Date.now() - idleSince > 10000) {
      idleSince = null;
      startCutover(t);
    }
    return;
  }
  const c = t.cutover;
  const running = c.actions.find((a) => a.state === 'running');
  if (running) {
    running.state = 'done';
    running.reason = null;
    if (running.action.startsWith('stop-processor') && running.action.includes('.clean.')) {
      t.steps.find((s) => s.name === 'clean').state = 'stopped';
    }
    if (running.action.startsWith('start-processor clean')) {
      Object.assign(t.steps.find((s) => s.name === 'clean'), { state: 'starting' });
    }
    // A retiring life leaves the step once it is stopped.
    for (const s of t.steps) {
      if (s.retiring && running.action === `stop-processor ${s.retiring.group}`) delete s.retiring;
    }
  }
  const next = c.actions.find((a) => a.state !== 'done');
  if (next) {
    next.state = 'running';
    next.reason = null;
    recount(c);
    return;
  }
  // The move is over: it joins the history.
  const entry = {
    topology: t.name,
    from: c.from,
    to: c.to,
    outcome: 'applied',
    startedAt: c.startedAt,
    finishedAt: Math.floor(Date.now() / 1000),
    actions: c.actions.length,
    handovers: [
      {
        step: 'clean',
        fromGroup: 'plumber.telemetry.clean.a41c9e22f0b7',
        toGroup: 'plumber.telemetry.clean.5e1f0a9b2c3d',
        offsets: [0, 1, 2, 3, 4, 5].map((partition) => ({ topic: 'plumber.telemetry.parse.1f0e2d3c4b5a', partition, offset: 50000 + partition * 17 })),
      },
    ],
    author: 'Ada Lovelace <ada@acme.example>',
    message: `telemetry: revision ${generation}`,
    committedAt: c.startedAt - 20,
  };
  history.push(entry);
  t.commit = c.to;
  t.cutover = null;
  t.phase = 'idle';
  status.phase = 'idle';
  for (const s of t.steps) if (s.kind === 'processor') Object.assign(s, { state: 'running', retiring: undefined });
  idleSince = Date.now();
  broadcast('history', entry);
}

if (!frozen) {
  setInterval(() => {
    version++;
    if (version % 3 === 0) advance();
    if (version % 20 === 0) {
      const p = plans[0];
      broadcast('plan', { ref: p.ref, change: 'updated', head: p.head, valid: p.valid, pullRequest: p.pullRequest });
    }
    tick();
  }, 1000);
}

// --- HTTP -------------------------------------------------------------------------------
const TYPES = { '.html': 'text/html; charset=utf-8', '.js': 'text/javascript', '.css': 'text/css', '.svg': 'image/svg+xml' };

function json(res, body, code = 200) {
  res.writeHead(code, { 'content-type': 'application/json', 'cache-control': 'no-store' });
  res.end(JSON.stringify(body));
}

async function file(res, path) {
  const safe = normalize(path).replace(/^(\.\.[/\\])+/, '');
  try {
    const body = await readFile(join(dist, safe));
    res.writeHead(200, { 'content-type': TYPES[extname(safe)] ?? 'application/octet-stream' });
    res.end(body);
  } catch {
    res.writeHead(404, { 'content-type': 'text/plain' });
    res.end('not found (run `npm run build` first?)\n');
  }
}

const server = createServer((req, res) => {
  const url = new URL(req.url ?? '/', 'http://localhost');
  const path = url.pathname;
  if (log) console.log(req.method, path);
  if (path === '/' || path === '/index.html') return file(res, 'index.html');
  if (path.startsWith('/assets/')) return file(res, path.slice(1));
  if (path === '/healthz') return json(res, { ok: true });
  if (path === '/api/status') return json(res, status);
  if (path === '/api/history') return json(res, history);
  if (path === '/api/plans') return json(res, plans);
  if (path.startsWith('/api/plans/')) {
    const ref = decodeURIComponent(path.slice('/api/plans/'.length));
    const plan = plans.find((p) => p.ref === ref);
    return plan ? json(res, plan) : json(res, { error: `no plan of ${ref}` }, 404);
  }
  if (path.startsWith('/api/records/')) {
    const [topology, step] = path.slice('/api/records/'.length).split('/').map(decodeURIComponent);
    const record = (topic, offset, value, headers = []) => ({ topic, partition: 0, offset, timestamp: 1764000000000 + offset, key: `dev-${offset}`, value, headers });
    return json(res, {
      topology, step, commit: status.commit, topics: [`${topology}.${step}.out`],
      records: [record(`${topology}.${step}.out`, 41, '{"lat":52.5,"serial":"***"}'), record(`${topology}.${step}.out`, 42, '{"lat":48.1,"serial":"***"}')],
      deadLetterTopic: `plumber.${topology}.${step}.dlq`,
      deadLetters: [record(`plumber.${topology}.${step}.dlq`, 7, 'not json', [['plumber.error.kind', 'invalid-json'], ['plumber.error', 'expected value at line 1 column 1']])],
    });
  }
  if (path === '/api/events') {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-store', connection: 'keep-alive' });
    res.write('retry: 2000\n\n');
    send(res, 'status', status);
    clients.add(res);
    req.on('close', () => clients.delete(res));
    return;
  }
  res.writeHead(404, { 'content-type': 'text/plain' });
  res.end('not found\n');
});

server.listen(port, '127.0.0.1', () => {
  console.log(`fixture daemon on http://127.0.0.1:${port}/${frozen ? ' (frozen)' : ''}`);
});
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => {
    for (const res of clients) res.destroy();
    server.close(() => process.exit(0));
  });
}
