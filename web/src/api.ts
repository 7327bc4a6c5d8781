// The daemon's JSON (SPEC §6, notes/web-api.md). Fields an older daemon may lack are optional.

export type Phase = 'idle' | 'cutover' | 'error';
export type Kind = 'source' | 'processor' | 'sink';

export interface Place {
  code: string;
  file: string;
  line: number | null;
  column: number | null;
  message: string;
  url?: string | null;
}

export interface LastError {
  commit: string | null;
  topology: string | null;
  message: string;
  at: number;
  place?: Place | null;
}

export interface CutoverAction {
  action: string;
  state: 'done' | 'running' | 'waiting' | 'pending';
  reason?: string | null;
  failures?: number;
}

export interface Waiting {
  action: string;
  reason: string;
  failures: number;
}

export interface Cutover {
  to: string;
  done: number;
  remaining: number;
  current: string | null;
  waiting: Waiting[];
  from?: string | null;
  startedAt?: number | null;
  actions?: CutoverAction[];
}

export interface Step {
  name: string;
  kind: Kind;
  identity: string | null;
  group: string | null;
  state: string;
  lag: number | null;
  inputs?: string[];
  file?: string;
  topic?: string | null;
  transform?: string | null;
  internalTopic?: string | null;
  deadLetterTopic?: string | null;
  replicas?: number | null;
  scale?: { min: number; max: number } | null;
  recordsPerSecond?: number | null;
  /** A stateful SQL step's state (docs/stateful-sql.md); absent for the others. */
  keepsState?: KeptState | null;
  /** A join's table (each instance holds all of it); absent for the others. */
  keepsTable?: KeptTable | null;
  /** During a move: the life it replaces, still deployed until it has drained and stopped. */
  retiring?: Life | null;
}

export interface KeptState {
  changelog: string;
  /** restore, rebuild, earliest, empty, or cannot (the move waits for `stateStart`). */
  startedFrom: string;
  groups: number | null;
  /** The least stream time of its partitions, ms since the epoch. */
  watermarkMs: number | null;
  /** Changelog entries read by restores under way; 0 when none is. */
  restoringEntries: number | null;
}

export interface KeptTable {
  topic: string;
  rows: number | null;
  /** About the memory the rows take in each instance. */
  bytes: number | null;
  /** Records read by a load under way; 0 once loaded. */
  loadingRecords: number | null;
}

export interface Life {
  group: string;
  identity: string;
  state: string;
  replicas: number;
  lag: number | null;
}

export interface TopologyStatus {
  name: string;
  commit: string | null;
  phase: Phase;
  delivery?: string | null;
  lastError: string | null;
  previewOf?: { name: string; pullRequest: number; topology: string } | null;
  cutover: Cutover | null;
  steps: Step[];
}

export interface Status {
  branch: string;
  commit: string | null;
  phase: Phase;
  lastError: LastError | null;
  forge?: { kind: string; repo: string } | null;
  topologies: TopologyStatus[];
}

export interface Offset {
  topic: string;
  partition: number;
  offset: number;
}

export interface HistoryEntry {
  topology: string;
  from: string | null;
  to: string;
  outcome: string;
  startedAt: number;
  finishedAt: number;
  actions: number;
  handovers: { step: string; fromGroup: string; toGroup: string; offsets: Offset[] }[];
  author?: string | null;
  message?: string | null;
  committedAt?: number | null;
}

export type Change = 'added' | 'removed' | 'replaced' | 'updated' | 'changed' | 'unchanged';

export interface PlanStep {
  name: string;
  kind: Kind;
  change: Change;
  identity: { from: string | null; to: string | null };
  file: string;
  reason?: { changed?: { field: string }[]; upstream?: string[] };
  owners?: string[];
  inputs?: string[];
}

// One plan action as `plan --format json` writes it: tagged by `action`.
export type PlanAction = { action: string } & Record<string, unknown>;

export interface TopologyPlan {
  name: string;
  change: Change;
  cutover: string;
  cluster: string;
  steps: PlanStep[];
  actions: PlanAction[];
  keptTopics?: string[];
}

// What one version of a step did with a plan's sample (src/datadiff.rs `Tally`).
export interface Tally {
  passed: number;
  filtered: number;
  outputs: number;
  deadLettered: Record<string, number>;
  failed: number;
}

// The data diff of one replaced or added processor (src/datadiff.rs `StepDiff`).
export interface StepDiff {
  topology: string;
  step: string;
  change: string;
  topics: string[];
  sampled: number;
  old?: Tally;
  new?: Tally;
  changed: number;
  examples: { key: string | null; input: string; old: string[]; new: string[] }[];
  newDeadLetterKinds: string[];
  fieldsAppeared: string[];
  fieldsVanished: string[];
  note?: string;
  /** What the diff of a step with state or a table cannot show. */
  caveat?: string;
}

export interface RefPlan {
  ref: string;
  head: string;
  base: string;
  from: string | null;
  valid: boolean;
  validAlone?: boolean;
  conflicts: string[];
  errors: Place[];
  topologies: TopologyPlan[];
  preview?: boolean;
  pullRequest?: number | null;
  keepTopics?: boolean;
  dataDiff?: StepDiff[];
}

async function getJson<T>(path: string): Promise<T> {
  // Relative: the page works behind a path prefix, and asks nothing of any other host.
  const response = await fetch(path, { headers: { accept: 'application/json' } });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return (await response.json()) as T;
}

export const fetchStatus = () => getJson<Status>('api/status');

// A record as `GET /api/records/{topology}/{step}` shows it (src/daemon/tail.rs).
export interface ShownRecord {
  topic: string;
  partition: number;
  offset: number;
  timestamp?: number;
  key: string | null;
  value: string;
  headers: [string, string][];
}

export interface StepRecords {
  topology: string;
  step: string;
  commit: string;
  topics: string[];
  records: ShownRecord[];
  deadLetterTopic?: string;
  deadLetters: ShownRecord[];
  notes?: string[];
}

// Read on demand only: the daemon reads the topics when asked.
export const fetchRecords = (topology: string, step: string, limit = 10) =>
  getJson<StepRecords>(`api/records/${encodeURIComponent(topology)}/${encodeURIComponent(step)}?limit=${limit}`);
export const fetchHistory = () => getJson<HistoryEntry[]>('api/history');
// A plan as the page uses it: lists never missing.
export const normalizePlan = (p: RefPlan): RefPlan => ({
  ...p,
  conflicts: p.conflicts ?? [],
  errors: p.errors ?? [],
  topologies: (p.topologies ?? []).map((t) => ({ ...t, steps: t.steps ?? [], actions: t.actions ?? [] })),
});

export const fetchPlans = () => getJson<RefPlan[]>('api/plans').then((plans) => plans.map(normalizePlan));
