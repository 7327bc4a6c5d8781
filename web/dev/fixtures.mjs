// Realistic daemon documents for front-end work (shapes as in notes/web-api.md).

import { createHash } from 'node:crypto';

const hex = (seed) => createHash('sha256').update(seed).digest('hex');
export const commit = (seed) => hex(`commit:${seed}`).slice(0, 40);
const id = (seed) => hex(`identity:${seed}`);
const group = (t, s, seed) => `plumber.${t}.${s}.${id(seed).slice(0, 12)}`;

// Times are relative to when the server starts, so "2 min ago" reads true.
export const NOW = Math.floor(Date.now() / 1000);
export const C = {
  billing: commit('billing-fx-retry'),
  old: commit('telemetry-v41'),
  next: commit('telemetry-v42'),
  pr42: commit('geo-enrich'),
  fix: commit('fix-fx-timeout'),
  base: commit('telemetry-v42'),
};

const processor = (t, name, o) => ({
  name,
  kind: 'processor',
  identity: id(`${t}/${name}/${o.life ?? 1}`),
  group: group(t, name, `${t}/${name}/${o.life ?? 1}`),
  state: o.state ?? 'running',
  lag: o.lag ?? 0,
  inputs: o.inputs,
  file: `topologies/${t}/steps/${name}.yaml`,
  topic: null,
  transform: o.transform,
  internalTopic: o.internal ? group(t, name, `${t}/${name}/${o.life ?? 1}`) : null,
  deadLetterTopic: `plumber.${t}.${name}.dlq`,
  replicas: o.replicas ?? 1,
  scale: o.scale ?? { min: 1, max: 4 },
  recordsPerSecond: o.rps ?? null,
  ...(o.retiring ? { retiring: o.retiring } : {}),
});

// The lives of `enrich` and `score` the cutover below replaces: they drain the old `clean`.
export function retiringLives() {
  const life = (name, replicas, lag) => ({
    group: group('telemetry', name, `telemetry/${name}/0`),
    identity: id(`telemetry/${name}/0`),
    state: 'running',
    replicas,
    lag,
  });
  return { enrich: life('enrich', 2, 1204), score: life('score', 1, 310) };
}

const topic = (t, name, kind, topicName, inputs = []) => ({
  name,
  kind,
  identity: null,
  group: null,
  state: 'external',
  lag: null,
  inputs,
  file: `topologies/${t}/steps/${name}.yaml`,
  topic: topicName,
  transform: null,
  internalTopic: null,
  deadLetterTopic: null,
  replicas: null,
  scale: null,
  recordsPerSecond: null,
});

export function telemetrySteps() {
  const t = 'telemetry';
  return [
    topic(t, 'raw', 'source', 'telemetry.raw'),
    topic(t, 'devices', 'source', 'devices.registry'),
    processor(t, 'parse', { inputs: ['raw'], transform: 'jq', internal: true, replicas: 3, lag: 412, rps: 1840.2, scale: { min: 2, max: 6 } }),
    processor(t, 'clean', { inputs: ['parse'], transform: 'sql', internal: true, replicas: 2, lag: 1204, rps: 1790.5, life: 2 }),
    processor(t, 'enrich', { inputs: ['clean', 'devices'], transform: 'http', replicas: 2, lag: 88, rps: 1702.9, state: 'starting', retiring: retiringLives().enrich }),
    processor(t, 'score', { inputs: ['clean'], transform: 'exec', replicas: 1, lag: 0, rps: 96.4, state: 'starting', retiring: retiringLives().score }),
    topic(t, 'warehouse', 'sink', 'telemetry.enriched', ['enrich']),
    topic(t, 'alerts', 'sink', 'telemetry.alerts', ['score']),
  ];
}

export function billingSteps() {
  const t = 'billing';
  return [
    topic(t, 'invoices', 'source', 'billing.invoices'),
    processor(t, 'normalize', { inputs: ['invoices'], transform: 'jq', internal: true, replicas: 1, lag: 3, rps: 42.0 }),
    processor(t, 'fx', { inputs: ['normalize'], transform: 'http', replicas: 2, lag: 17, rps: 41.7, scale: { min: 2, max: 2 } }),
    topic(t, 'ledger', 'sink', 'billing.ledger', ['fx']),
    topic(t, 'audit', 'sink', 'billing.audit', ['normalize']),
  ];
}

const oldClean = group('telemetry', 'clean', 'telemetry/clean/1');
const newClean = group('telemetry', 'clean', 'telemetry/clean/2');
const oldEnrich = group('telemetry', 'enrich', 'telemetry/enrich/0');
const oldScore = group('telemetry', 'score', 'telemetry/score/0');

// The cutover of `telemetry` from C.old to C.next: `clean` replaced, `enrich` and `score`
// replaced below it (their input's identity changed).
export function cutoverActions() {
  return [
    { action: `create-topic ${newClean} (6 partitions)`, state: 'done', reason: null, failures: 0 },
    { action: `start-processor enrich as ${group('telemetry', 'enrich', 'telemetry/enrich/1')}`, state: 'done', reason: null, failures: 0 },
    { action: `start-processor score as ${group('telemetry', 'score', 'telemetry/score/1')}`, state: 'done', reason: null, failures: 0 },
    { action: `stop-processor ${oldClean}`, state: 'running', reason: null, failures: 0 },
    { action: `start-processor clean as ${newClean}`, state: 'pending', reason: `waits for stop-processor ${oldClean}`, failures: 0 },
    { action: `drain-processor ${oldEnrich} on ${oldClean}`, state: 'waiting', reason: `waits for lag 0 on ${oldClean} (lag 1,204)`, failures: 0 },
    { action: `drain-processor ${oldScore} on ${oldClean}`, state: 'waiting', reason: 'call failed: broker timed out describing the group, retrying in 8 s', failures: 2 },
    { action: `stop-processor ${oldEnrich}`, state: 'pending', reason: `waits for drain-processor ${oldEnrich}`, failures: 0 },
    { action: `stop-processor ${oldScore}`, state: 'pending', reason: null, failures: 0 },
    { action: `delete-topic ${oldClean}`, state: 'pending', reason: 'waits for its readers to stop', failures: 0 },
  ];
}

export function status() {
  return {
    branch: 'main',
    commit: C.next,
    phase: 'cutover',
    lastError: {
      commit: C.fix,
      topology: 'billing',
      message: `commit ${C.fix.slice(0, 8)} is invalid: unknown field \`timout\` in topologies/billing/steps/fx.yaml`,
      at: NOW - 340,
      place: {
        code: 'unknown-field',
        file: 'topologies/billing/steps/fx.yaml',
        line: 12,
        column: 5,
        message: 'unknown field `timout`, expected one of `image`, `port`, `path`, `timeout`',
        url: `https://github.com/acme/topologies/blob/${C.fix}/topologies/billing/steps/fx.yaml#L12`,
      },
    },
    forge: { kind: 'github', repo: 'acme/topologies' },
    topologies: [
      {
        name: 'billing',
        commit: C.billing,
        phase: 'idle',
        delivery: 'exactly-once',
        lastError: null,
        cutover: null,
        steps: billingSteps(),
      },
      {
        name: 'telemetry',
        commit: C.old,
        phase: 'cutover',
        delivery: 'exactly-once',
        lastError: null,
        cutover: {
          to: C.next,
          from: C.old,
          startedAt: NOW - 95,
          done: 3,
          remaining: 7,
          current: `stop-processor ${oldClean}`,
          waiting: [],
          actions: cutoverActions(),
        },
        steps: telemetrySteps(),
      },
    ],
  };
}

const handover = (t, step, from, to, topicName, offsets) => ({
  step,
  fromGroup: from,
  toGroup: to,
  offsets: offsets.map((offset, partition) => ({ topic: topicName, partition, offset })),
});

export function history() {
  return [
    {
      topology: 'billing', from: null, to: commit('billing-initial'), outcome: 'applied',
      startedAt: NOW - 86400 * 3, finishedAt: NOW - 86400 * 3 + 14, actions: 6, handovers: [],
      author: 'Grace Hopper <grace@acme.example>', message: 'billing: first revision', committedAt: NOW - 86400 * 3 - 60,
    },
    {
      topology: 'telemetry', from: null, to: commit('telemetry-v40'), outcome: 'applied',
      startedAt: NOW - 86400 * 2, finishedAt: NOW - 86400 * 2 + 22, actions: 9, handovers: [],
      author: 'Ada Lovelace <ada@acme.example>', message: 'telemetry: parse, clean, enrich and score', committedAt: NOW - 86400 * 2 - 300,
    },
    {
      topology: 'telemetry', from: commit('telemetry-v40'), to: commit('telemetry-v40b'), outcome: 'superseded',
      startedAt: NOW - 7200, finishedAt: NOW - 7170, actions: 2, handovers: [],
      author: 'Ada Lovelace <ada@acme.example>', message: 'clean: drop readings without a device id', committedAt: NOW - 7260,
    },
    {
      topology: 'telemetry', from: commit('telemetry-v40'), to: C.old, outcome: 'applied',
      startedAt: NOW - 7170, finishedAt: NOW - 7112, actions: 8,
      handovers: [
        handover('telemetry', 'clean', group('telemetry', 'clean', 'telemetry/clean/0'), oldClean, group('telemetry', 'parse', 'telemetry/parse/1'), [48211, 47990, 48633, 48102, 47855, 48377]),
      ],
      author: 'Ada Lovelace <ada@acme.example>', message: 'clean: km/h instead of m/s', committedAt: NOW - 7180,
    },
    {
      topology: 'billing', from: commit('billing-initial'), to: C.billing, outcome: 'applied',
      startedAt: NOW - 3600, finishedAt: NOW - 3541, actions: 5,
      handovers: [
        handover('billing', 'fx', group('billing', 'fx', 'billing/fx/0'), group('billing', 'fx', 'billing/fx/1'), group('billing', 'normalize', 'billing/normalize/1'), [9120, 9087, 9233]),
      ],
      author: 'Grace Hopper <grace@acme.example>', message: 'fx: retry the rates service twice', committedAt: NOW - 3700,
    },
  ];
}

const planStep = (name, kind, change, file, inputs, extra = {}) => ({
  name, kind, change, identity: { from: kind === 'processor' && change !== 'added' ? id(`p/${name}/a`) : null, to: kind === 'processor' && change !== 'removed' ? id(`p/${name}/${change === 'unchanged' || change === 'updated' ? 'a' : 'b'}`) : null },
  file, inputs, ...extra,
});

export function plans() {
  const f = (s) => `topologies/telemetry/steps/${s}.yaml`;
  return [
    {
      ref: 'refs/pull/42/head', head: C.pr42, base: C.base, from: C.next,
      valid: true, validAlone: true, conflicts: [], errors: [], preview: false, previews: [], pullRequest: 42, keepTopics: false,
      dataDiff: [
        {
          topology: 'telemetry', step: 'enrich', change: 'replaced', topics: ['devices.registry'], sampled: 100,
          old: { passed: 97, filtered: 0, outputs: 97, deadLettered: { 'invalid-json': 3 }, failed: 0 },
          new: { passed: 90, filtered: 0, outputs: 90, deadLettered: { 'invalid-json': 3, 'jq-error': 7 }, failed: 0 },
          changed: 97, newDeadLetterKinds: ['jq-error'], fieldsAppeared: ['cell'], fieldsVanished: [],
          examples: [{ key: 'dev-7', input: '{"lat":52.5,"serial":"***"}', old: ['{"lat":52.5,"serial":"***"}'], new: ['{"cell":52,"lat":52.5,"serial":"***"}'] }],
          readMs: 120, runMs: 15,
        },
        { topology: 'telemetry', step: 'geo', change: 'added', topics: [], sampled: 0, changed: 0, examples: [], newDeadLetterKinds: [], fieldsAppeared: [], fieldsVanished: [], readMs: 0, runMs: 0, note: 'not sampled: it reads `clean`, whose topic is new' },
      ],
      topologies: [
        { name: 'billing', change: 'unchanged', cutover: 'parallel', cluster: 'main', steps: [], actions: [] },
        {
          name: 'telemetry', change: 'changed', cutover: 'parallel', cluster: 'main',
          steps: [
            planStep('raw', 'source', 'unchanged', f('raw'), []),
            planStep('devices', 'source', 'unchanged', f('devices'), []),
            planStep('parse', 'processor', 'unchanged', f('parse'), ['raw']),
            planStep('clean', 'processor', 'updated', f('clean'), ['parse'], { reason: { changed: [{ field: 'scale' }] }, owners: ['@acme/data'] }),
            planStep('geo', 'processor', 'added', f('geo'), ['clean'], { owners: ['@acme/geo'] }),
            planStep('enrich', 'processor', 'replaced', f('enrich'), ['geo', 'devices'], { reason: { changed: [{ field: 'inputs' }], upstream: ['geo'] }, owners: ['@acme/data'] }),
            planStep('legacy-geo', 'processor', 'removed', f('legacy-geo'), ['clean']),
            planStep('score', 'processor', 'unchanged', f('score'), ['clean']),
            planStep('warehouse', 'sink', 'unchanged', f('warehouse'), ['enrich']),
            planStep('alerts', 'sink', 'unchanged', f('alerts'), ['score']),
          ],
          actions: [
            { action: 'update-processor', step: 'clean', identity: id('p/clean/a'), group: newClean, scale: { min: 2, max: 8, lagThreshold: 1000 } },
            { action: 'create-topic', topic: group('telemetry', 'geo', 'p/geo/b'), step: 'geo', partitions: 6, kind: 'internal' },
            { action: 'start-processor', step: 'enrich', identity: id('p/enrich/b'), group: group('telemetry', 'enrich', 'p/enrich/b'), life: 1, inputs: [{ topic: group('telemetry', 'geo', 'p/geo/b'), from: 'earliest' }, { topic: 'devices.registry', from: 'cutover' }], outputs: ['telemetry.enriched'], dlq: 'plumber.telemetry.enrich.dlq', transform: { http: { image: 'ghcr.io/acme/enrich:2.1', port: 8080, path: '/enrich' } }, env: {}, scale: { min: 1, max: 4 } },
            { action: 'start-processor', step: 'geo', identity: id('p/geo/b'), group: group('telemetry', 'geo', 'p/geo/b'), life: 1, inputs: [{ topic: newClean, from: 'latest' }], outputs: [group('telemetry', 'geo', 'p/geo/b')], dlq: 'plumber.telemetry.geo.dlq', transform: { jq: { program: '. + {cell: (.lat|floor)}' } }, env: {}, scale: { min: 1, max: 2 } },
            { action: 'drain-processor', step: 'enrich', identity: id('p/enrich/a'), group: group('telemetry', 'enrich', 'p/enrich/a'), topics: [newClean] },
            { action: 'stop-processor', step: 'enrich', identity: id('p/enrich/a'), group: group('telemetry', 'enrich', 'p/enrich/a'), successor: group('telemetry', 'enrich', 'p/enrich/b'), handOver: ['devices.registry'] },
            { action: 'stop-processor', step: 'legacy-geo', identity: id('p/legacy-geo/a'), group: group('telemetry', 'legacy-geo', 'p/legacy-geo/a') },
          ],
        },
      ],
    },
    {
      ref: 'refs/heads/fix-fx-timeout', head: C.fix, base: C.base, from: C.next,
      valid: false, validAlone: false, conflicts: [], preview: false, previews: [], pullRequest: null, keepTopics: false,
      errors: [
        { code: 'unknown-field', file: 'topologies/billing/steps/fx.yaml', line: 12, column: 5, message: 'unknown field `timout`, expected one of `image`, `port`, `path`, `timeout`' },
        { code: 'unknown-input', file: 'topologies/billing/steps/ledger.yaml', line: 4, column: 9, message: 'input `fx-v2` is not a step of billing' },
      ],
      topologies: [],
    },
  ];
}
