import { useState } from 'preact/hooks';
import type { Cutover, CutoverAction, HistoryEntry, KeptState, KeptTable, Life, RefPlan, ShownRecord, Status, Step, StepRecords, TopologyStatus } from './api';
import { fetchRecords } from './api';
import { Commit, DaemonError, PhaseBadge, Text, When } from './components';
import { Dag, Legend } from './dag';
import type { DagNode } from './dag';
import { count, duration, iso, rate } from './format';
import { totalLag, totalRate } from './overview';
import { PlanCard, touches } from './plans';

const STATES: Record<string, string> = {
  running: '● running',
  starting: '◐ starting',
  stopped: '■ stopped',
  // During a move: its new life has yet to start.
  pending: '◌ pending',
  external: '○ external',
};

// A retiring life's state, as what it does for the move.
const RETIRING_STATES: Record<string, string> = {
  running: 'draining',
  starting: 'starting',
  stopped: 'stopped',
};
const retiringState = (l: Life) => RETIRING_STATES[l.state] ?? l.state;

// A life's group without what every life of the step shares: the identity's first 8 hex
// digits (as commits are shortened), and its life number if it has one.
function shortGroup(topology: string, step: string, group: string): string {
  const prefix = `plumber.${topology}.${step}.`;
  if (!group.startsWith(prefix)) return group;
  const rest = group.slice(prefix.length);
  return rest.slice(0, 8) + rest.slice(12);
}

const plural = (n: number, one: string, many: string) => `${n} ${n === 1 ? one : many}`;

function processorNumbers(s: Step): string {
  const replicas = s.replicas == null ? '— replicas' : plural(s.replicas, 'replica', 'replicas');
  return `${replicas} · ${rate(s.recordsPerSecond)} rec/s`;
}

function stepNodes(t: TopologyStatus): DagNode[] {
  return t.steps.map((s) => {
    const processor = s.kind === 'processor';
    const detail = processor ? processorNumbers(s) : (s.topic ?? '');
    const kindLabel = processor && s.transform ? `processor · ${s.transform}` : s.kind;
    const topics = [
      s.topic ? `topic ${s.topic}` : null,
      s.internalTopic ? `internal topic ${s.internalTopic}` : null,
      s.deadLetterTopic ? `dead-letter topic ${s.deadLetterTopic}` : null,
    ].filter(Boolean);
    const numbers = processor
      ? `, ${s.replicas ?? 'unknown'} replicas, lag ${s.lag ?? 'unknown'}, ${s.recordsPerSecond ?? 'unknown'} records per second`
      : s.topic
        ? `, topic ${s.topic}`
        : '';
    const old = processor ? s.retiring : null;
    const replacing = old ? `replacing ${shortGroup(t.name, s.name, old.group)}: ${retiringState(old)}, lag ${count(old.lag)}` : undefined;
    const replacingSpoken = old
      ? `, replacing life ${old.group}, ${retiringState(old)}, ${old.replicas} replicas, lag ${old.lag ?? 'unknown'}`
      : '';
    return {
      id: s.name,
      kind: s.kind,
      inputs: s.inputs ?? [],
      kindLabel,
      badge: STATES[s.state] ?? s.state,
      tone: `tone-${s.state}`,
      dashed: s.state === 'stopped',
      detail,
      extra: processor ? `lag ${count(s.lag)}` : undefined,
      retiring: replacing,
      label: `${kindLabel} ${s.name}, ${s.state}${numbers}${replacingSpoken}`,
      hover: [`${s.name} (${kindLabel}, ${s.state})`, ...topics, ...(old ? [`replacing ${old.group} (${retiringState(old)}, lag ${count(old.lag)})`] : [])].join('\n'),
      attrs: {
        'data-step': s.name,
        'data-kind': s.kind,
        'data-state': s.state,
        ...(old ? { 'data-retiring': old.group, 'data-retiring-state': old.state } : {}),
      },
    };
  });
}

function Row(props: { term: string; value: string | number | null | undefined; code?: boolean }) {
  if (props.value == null || props.value === '') return null;
  return (
    <div>
      <dt>{props.term}</dt>
      <dd>{props.code ? <code>{props.value}</code> : props.value}</dd>
    </div>
  );
}

function RecordList(props: { records: ShownRecord[]; empty: string; dead?: boolean }) {
  if (props.records.length === 0) return <p class="muted small">{props.empty}</p>;
  return (
    <ol class="records plain small">
      {props.records.map((r) => {
        const why = props.dead ? r.headers.find(([name]) => name === 'plumber.error.kind')?.[1] : undefined;
        return (
          <li key={`${r.topic}/${r.partition}/${r.offset}`} data-record={props.dead ? 'dead-letter' : 'written'}>
            <span class="muted">
              {r.topic}/{r.partition}@{r.offset}
              {r.key != null ? ` · ${r.key}` : ''}
            </span>
            {why ? <span class="pill tone-invalid">{why}</span> : null}
            <code>{r.value}</code>
          </li>
        );
      })}
    </ol>
  );
}

// What a step wrote lately and its dead letters: read only when asked (the button).
function RecentRecords(props: { topology: string; step: string }) {
  const [shown, setShown] = useState<StepRecords | null>(null);
  const [problem, setProblem] = useState<string | null>(null);
  const [reading, setReading] = useState(false);
  const read = () => {
    setReading(true);
    fetchRecords(props.topology, props.step)
      .then((r) => {
        setShown(r);
        setProblem(null);
      })
      .catch((e: unknown) => setProblem(e instanceof Error ? e.message : String(e)))
      .finally(() => setReading(false));
  };
  return (
    <div class="recent-records" data-recent-records={props.step}>
      <button type="button" onClick={read} disabled={reading}>
        {reading ? 'Reading…' : shown ? 'Read the latest records again' : 'Show the latest records'}
      </button>
      {problem ? <p class="error-title small">{problem}</p> : null}
      {shown ? (
        <>
          <h4>Written</h4>
          <RecordList records={shown.records} empty="No record written yet." />
          {shown.deadLetterTopic ? (
            <>
              <h4>Dead letters</h4>
              <RecordList records={shown.deadLetters} empty="No dead letter." dead />
            </>
          ) : null}
          {shown.notes?.map((n) => (
            <p key={n} class="muted small">
              {n}
            </p>
          ))}
        </>
      ) : null}
    </div>
  );
}

function StepDetails(props: { step: Step | null; topology: string }) {
  const s = props.step;
  return (
    <aside class="details" aria-live="polite" aria-labelledby="step-details-title">
      {s == null ? (
        <>
          <h3 id="step-details-title">Step details</h3>
          <p class="muted">Select a step (click it, or Tab to it and press Enter) to see its file, identity, group and topics.</p>
        </>
      ) : (
        <>
          <h3 id="step-details-title">
            {s.name} <span class="muted small">{s.kind}</span>
          </h3>
          <dl>
            <Row term="State" value={STATES[s.state] ?? s.state} />
            <Row term="File" value={s.file} code />
            <Row term="Topic" value={s.topic} code />
            <Row term="Transform" value={s.transform} />
            <Row term="Identity" value={s.identity} code />
            <Row term="Group" value={s.group} code />
            <Row term="Internal topic" value={s.internalTopic} code />
            <Row term="Dead-letter topic" value={s.deadLetterTopic} code />
            {s.kind === 'processor' ? (
              <>
                <Row
                  term="Replicas"
                  value={`${s.replicas ?? '—'}${s.scale ? ` (scale ${s.scale.min}..${s.scale.max})` : ''}`}
                />
                <Row term="Lag" value={count(s.lag)} />
                <Row term="Records/s" value={rate(s.recordsPerSecond)} />
                {s.keepsState ? <StateRows state={s.keepsState} /> : null}
                {s.keepsTable ? <TableRows table={s.keepsTable} /> : null}
              </>
            ) : s.lag != null ? (
              <Row term="Lag" value={count(s.lag)} />
            ) : null}
            <Row term="Reads" value={s.inputs?.join(', ')} />
          </dl>
          {s.retiring ? <RetiringDetails life={s.retiring} /> : null}
          <RecentRecords key={s.name} topology={props.topology} step={s.name} />
        </>
      )}
    </aside>
  );
}

const STARTED_FROM: Record<string, string> = {
  restore: 'restored from its changelog',
  rebuild: 'rebuilt from the records before the cutover',
  earliest: 'rebuilt from the earliest records',
  empty: 'empty at its start',
  cannot: 'waiting: the step file must set stateStart',
};

// A stateful step's state: its size, how far its windows have closed, and a restore under way.
function StateRows(props: { state: KeptState }) {
  const k = props.state;
  const restoring = k.restoringEntries ? `, restoring (${count(k.restoringEntries)} entries read)` : '';
  return (
    <>
      <Row term="State" value={`${count(k.groups)} groups${restoring}`} />
      <Row
        term="Watermark"
        value={k.watermarkMs == null ? 'no record counted yet' : new Date(k.watermarkMs).toISOString()}
      />
      <Row term="State started" value={STARTED_FROM[k.startedFrom] ?? k.startedFrom} />
      <Row term="Changelog" value={k.changelog} code />
    </>
  );
}

// A join's table: read whole by each instance before it joins its group, then kept current.
function TableRows(props: { table: KeptTable }) {
  const t = props.table;
  const size = t.bytes == null ? '' : `, about ${mebibytes(t.bytes)} in each instance`;
  const loading = t.loadingRecords ? `, loading (${count(t.loadingRecords)} records read)` : '';
  return (
    <>
      <Row term="Table" value={`${count(t.rows)} rows${size}${loading}`} />
      <Row term="Table topic" value={t.topic} code />
    </>
  );
}

function mebibytes(bytes: number): string {
  return `${(bytes / (1 << 20)).toFixed(1)} MiB`;
}

// The life the move replaces: it runs until it has drained its inputs, then stops.
function RetiringDetails(props: { life: Life }) {
  const l = props.life;
  return (
    <div class="retiring" data-retiring-details={l.group}>
      <h4>Retiring life (this move replaces it)</h4>
      <dl>
        <Row term="State" value={`${STATES[l.state] ?? l.state} (${retiringState(l)})`} />
        <Row term="Group" value={l.group} code />
        <Row term="Identity" value={l.identity} code />
        <Row term="Replicas" value={l.replicas} />
        <Row term="Lag" value={count(l.lag)} />
      </dl>
    </div>
  );
}

const ACTION_STATES: Record<string, { glyph: string; text: string }> = {
  done: { glyph: '✓', text: 'done' },
  running: { glyph: '▶', text: 'running' },
  waiting: { glyph: '‖', text: 'waiting' },
  pending: { glyph: '○', text: 'pending' },
};

// An older daemon gives only the current action and what waits.
function actionsOf(c: Cutover): CutoverAction[] {
  if (c.actions) return c.actions;
  const list: CutoverAction[] = [];
  if (c.current) list.push({ action: c.current, state: 'running' });
  for (const w of c.waiting) list.push({ action: w.action, state: 'waiting', reason: w.reason, failures: w.failures });
  return list;
}

function CutoverView(props: { cutover: Cutover; now: number }) {
  const c = props.cutover;
  const total = c.done + c.remaining;
  const actions = actionsOf(c);
  return (
    <section class="card cutover" data-cutover aria-labelledby="cutover-title">
      <h2 id="cutover-title">Cutover in progress</h2>
      <p class="meta">
        <Commit sha={c.from ?? null} /> → <Commit sha={c.to} />
        {c.startedAt ? (
          <>
            {' '}
            · started <When at={c.startedAt} now={props.now} /> ({duration(props.now - c.startedAt)})
          </>
        ) : null}
      </p>
      <div class="progress-row">
        <progress max={Math.max(total, 1)} value={c.done} aria-labelledby="cutover-progress" />
        <span id="cutover-progress">
          {c.done} of {total} actions done, {c.remaining} remaining
        </span>
      </div>
      <ol class="action-list">
        {actions.map((a, i) => {
          const st = ACTION_STATES[a.state] ?? { glyph: '·', text: a.state };
          return (
            <li key={`${i}:${a.action}`} class={`action action-${a.state}`} data-action={a.action} data-action-state={a.state}>
              <span class="action-state">
                <span aria-hidden="true">{st.glyph} </span>
                {st.text}
              </span>
              <span class="action-text">
                <code>{a.action}</code>
                {a.reason ? <span class="reason">{a.reason}</span> : null}
                {a.failures ? <span class="failures">{plural(a.failures, 'failure', 'failures')} so far</span> : null}
              </span>
            </li>
          );
        })}
      </ol>
    </section>
  );
}

function HistoryView(props: { entries: HistoryEntry[] | null; now: number }) {
  const entries = props.entries ? [...props.entries].reverse() : null;
  return (
    <section class="card flush" aria-labelledby="history-title">
      <h2 id="history-title" class="pad">
        History
      </h2>
      {entries == null ? (
        <p class="muted pad">Loading history…</p>
      ) : entries.length === 0 ? (
        <p class="muted pad">No move finished yet.</p>
      ) : (
        <div class="table-scroll">
          <table class="responsive history">
            <thead>
              <tr>
                <th scope="col">Finished</th>
                <th scope="col">Commit</th>
                <th scope="col">Author</th>
                <th scope="col">Message</th>
                <th scope="col">Duration</th>
                <th scope="col">Outcome</th>
                <th scope="col">Cutover offsets</th>
              </tr>
            </thead>
            <tbody>
              {entries.map((h) => (
                <tr key={`${h.to}:${h.startedAt}:${h.finishedAt}`} data-history data-to={h.to}>
                  <td data-label="Finished">
                    <When at={h.finishedAt} now={props.now} />
                  </td>
                  <td data-label="Commit">
                    <span class="nowrap">
                      {h.from ? (
                        <>
                          <Commit sha={h.from} /> →{' '}
                        </>
                      ) : (
                        <span class="muted">new → </span>
                      )}
                      <Commit sha={h.to} />
                    </span>
                  </td>
                  <td data-label="Author">{h.author ? h.author.replace(/\s*<[^>]*>$/, '') : <span class="muted">—</span>}</td>
                  <td data-label="Message" class="message">
                    {h.message ?? <span class="muted">—</span>}
                    {h.committedAt ? <span class="muted small block">committed {iso(h.committedAt)}</span> : null}
                  </td>
                  <td data-label="Duration" class="nowrap">
                    {duration(h.finishedAt - h.startedAt)}
                    <span class="muted small block">{plural(h.actions, 'action', 'actions')}</span>
                  </td>
                  <td data-label="Outcome">
                    <span class={`pill outcome-${h.outcome}`}>
                      {h.outcome === 'applied' ? '✓ ' : '↷ '}
                      {h.outcome}
                    </span>
                  </td>
                  <td data-label="Cutover offsets">
                    {h.handovers.length === 0 ? (
                      <span class="muted">none</span>
                    ) : (
                      <details>
                        <summary>{plural(h.handovers.length, 'handover', 'handovers')}</summary>
                        {h.handovers.map((ho) => (
                          <div class="handover" key={`${ho.step}:${ho.toGroup}`}>
                            <p>
                              <strong>{ho.step}</strong>: <code>{ho.fromGroup}</code> → <code>{ho.toGroup}</code>
                            </p>
                            <table class="offsets">
                              <thead>
                                <tr>
                                  <th scope="col">Topic</th>
                                  <th scope="col" class="num">
                                    Partition
                                  </th>
                                  <th scope="col" class="num">
                                    Offset
                                  </th>
                                </tr>
                              </thead>
                              <tbody>
                                {ho.offsets.map((o) => (
                                  <tr key={`${o.topic}:${o.partition}`}>
                                    <td>
                                      <code>{o.topic}</code>
                                    </td>
                                    <td class="num">{o.partition}</td>
                                    <td class="num">{count(o.offset)}</td>
                                  </tr>
                                ))}
                              </tbody>
                            </table>
                          </div>
                        ))}
                      </details>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}

// Whether the daemon's last error is about this topology.
const concerns = (status: Status, name: string) => {
  const e = status.lastError;
  return e != null && (e.topology === name || (e.place?.file.startsWith(`topologies/${name}/`) ?? false));
};

export function TopologyPage(props: {
  status: Status;
  name: string;
  history: HistoryEntry[] | null;
  plans: RefPlan[] | null;
  now: number;
}) {
  const { status, name, now } = props;
  const [selected, setSelected] = useState<string | null>(null);
  const t = status.topologies.find((x) => x.name === name);
  if (!t) {
    return (
      <div class="page-head">
        <h1>{name}</h1>
        <p class="card empty">
          No topology <code>{name}</code> runs now. <a href="#/">Back to the overview</a>.
        </p>
      </div>
    );
  }
  const step = t.steps.find((s) => s.name === selected) ?? null;
  const plans = (props.plans ?? []).filter((p) => touches(p, name));
  const history = props.history ? props.history.filter((h) => h.topology === name) : null;
  return (
    <>
      <nav aria-label="Breadcrumb" class="crumbs">
        <a href="#/">Topologies</a> <span aria-hidden="true">/</span> <span aria-current="page">{name}</span>
      </nav>
      <div class="page-head">
        <h1>{name}</h1>
        <p class="summary">
          <PhaseBadge phase={t.phase} /> · commit <Commit sha={t.commit} /> · {plural(t.steps.length, 'step', 'steps')} · total lag{' '}
          {count(totalLag(t))} · {rate(totalRate(t))} rec/s{t.delivery ? ` · ${t.delivery}` : ''}
          {t.previewOf ? ` · preview of ${t.previewOf.topology} (PR #${t.previewOf.pullRequest})` : ''}
        </p>
      </div>
      {t.lastError ? (
        <div class="error-box" data-error>
          <p class="error-title">
            <span aria-hidden="true">✕ </span>
            <strong>Error in {name}</strong>
          </p>
          <p class="error-message">
            <Text text={t.lastError} />
          </p>
        </div>
      ) : null}
      {status.lastError && concerns(status, name) ? (
        <DaemonError error={status.lastError} now={now} title="Last error of the daemon" />
      ) : null}
      <section class="card" aria-labelledby="dag-title">
        <div class="section-head">
          <h2 id="dag-title">Steps</h2>
          <Legend colour="outline colour and label: state" />
        </div>
        <div class="dag-layout">
          <Dag nodes={stepNodes(t)} label={`Steps of ${name}, left to right in data-flow order`} selected={selected} onSelect={setSelected} />
          <StepDetails step={step} topology={name} />
        </div>
      </section>
      {t.cutover ? <CutoverView cutover={t.cutover} now={now} /> : null}
      <HistoryView entries={history} now={now} />
      <section class="plans-of" aria-labelledby="topology-plans-title">
        <h2 id="topology-plans-title">Plans touching {name}</h2>
        {props.plans == null ? (
          <p class="card muted">Loading plans…</p>
        ) : plans.length === 0 ? (
          <p class="card muted">No watched ref changes {name}.</p>
        ) : (
          plans.map((p) => <PlanCard key={p.ref} plan={p} only={name} level={3} />)
        )}
      </section>
    </>
  );
}

