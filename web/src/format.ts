import type { PlanAction } from './api';

export const short = (commit: string | null | undefined) => (commit ? commit.slice(0, 8) : '—');

const integer = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });
const decimal = new Intl.NumberFormat('en-US', { maximumFractionDigits: 1, minimumFractionDigits: 1 });

export const count = (n: number | null | undefined) => (n == null ? '—' : integer.format(n));

export const rate = (n: number | null | undefined) =>
  n == null ? '—' : n >= 100 ? integer.format(n) : decimal.format(n);

export function duration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  const h = Math.floor(s / 3600);
  return `${h} h ${Math.floor((s % 3600) / 60)} min`;
}

export function ago(epochSeconds: number, now: number): string {
  const s = Math.round(now - epochSeconds);
  if (s < 5) return 'just now';
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

// ISO 8601 in UTC, minutes precision: the same on every machine.
export const iso = (epochSeconds: number) =>
  new Date(epochSeconds * 1000).toISOString().replace('T', ' ').slice(0, 19) + ' UTC';

export const place = (p: { file: string; line: number | null; column?: number | null }) =>
  p.line == null ? p.file : p.column == null ? `${p.file}:${p.line}` : `${p.file}:${p.line}:${p.column}`;

const str = (v: unknown) => (typeof v === 'string' ? v : v == null ? '' : JSON.stringify(v));
const list = (v: unknown) => (Array.isArray(v) ? v.map(str).join(', ') : '');

function transformName(t: unknown): string {
  if (t && typeof t === 'object') return Object.keys(t)[0] ?? '';
  return str(t);
}

// One plan action as a sentence, like `plumber plan` prints it (src/output/plan.rs).
export function describeAction(a: PlanAction): string {
  switch (a.action) {
    case 'create-topic':
      return `create topic ${str(a.topic)} (${str(a.partitions)} partitions)`;
    case 'start-processor': {
      const inputs = Array.isArray(a.inputs)
        ? a.inputs.map((i: { topic?: unknown; from?: unknown }) => `${str(i.topic)} from ${str(i.from)}`).join(', ')
        : '';
      const outputs = list(a.outputs) || 'nothing';
      return `start ${str(a.step)} running ${transformName(a.transform)} reading ${inputs}; writing ${outputs}`;
    }
    case 'start-warm': {
      const inputs = Array.isArray(a.inputs)
        ? a.inputs.map((i: { topic?: unknown }) => str(i.topic)).join(', ')
        : '';
      return `start ${str(a.step)} warm, running ${transformName(a.transform)}: it holds ${inputs} unread until its hand-off`;
    }
    case 'hand-off':
      return `hand ${str(a.step)} (${str(a.group)}) its start offsets; it reads once its group committed them`;
    case 'update-processor': {
      const scale = a.scale as { min?: number; max?: number } | undefined;
      return `update ${str(a.step)} in place: ${scale?.min ?? '?'}..${scale?.max ?? '?'} replicas`;
    }
    case 'drain-processor':
      return `drain ${str(a.step)} (${str(a.group)}) until its lag on ${list(a.topics)} is 0`;
    case 'stop-processor':
      return a.successor
        ? `stop ${str(a.step)} (${str(a.group)}) and hand its offsets on ${list(a.handOver)} over to ${str(a.successor)}`
        : `stop ${str(a.step)} (${str(a.group)}) gracefully`;
    case 'delete-topic':
      return `delete topic ${str(a.topic)}`;
    default:
      return a.action;
  }
}
