import type { PlanStep, RefPlan, StepDiff, Tally, TopologyPlan } from './api';
import { Commit, PlaceLink, Text, slug } from './components';
import { Dag } from './dag';
import type { DagNode } from './dag';
import { describeAction, short } from './format';
import { topologyHref } from './live';

const CHANGES: Record<string, string> = {
  added: '+ added',
  removed: '− removed',
  replaced: '~ replaced',
  updated: '* updated',
  changed: '~ changed',
  unchanged: '= unchanged',
};

function why(s: PlanStep): string {
  const fields = s.reason?.changed?.map((c) => c.field) ?? [];
  const upstream = s.reason?.upstream ?? [];
  const parts: string[] = [];
  if (fields.length) parts.push(`changed ${fields.join(', ')}`);
  if (upstream.length) parts.push(`input ${upstream.join(', ')} changed`);
  if (parts.length) return parts.join('; ');
  if (s.change === 'added' && s.identity.to) return `new identity ${short(s.identity.to)}`;
  return s.file.split('/').pop() ?? s.file;
}

export function planNodes(t: TopologyPlan): DagNode[] {
  return t.steps.map((s) => {
    const detail = why(s);
    const change = CHANGES[s.change] ?? s.change;
    return {
      id: s.name,
      kind: s.kind,
      inputs: s.inputs ?? [],
      kindLabel: s.kind,
      badge: change,
      tone: `tone-${s.change}`,
      dashed: s.change === 'removed',
      detail,
      label: `${s.kind} ${s.name}: ${s.change}${s.change === 'unchanged' ? '' : `, ${detail}`}`,
      hover: `${s.name} (${s.kind}): ${s.change}\n${s.file}${s.identity.from || s.identity.to ? `\nidentity ${short(s.identity.from)} → ${short(s.identity.to)}` : ''}${s.owners?.length ? `\nowners ${s.owners.join(' ')}` : ''}`,
      attrs: { 'data-plan-step': s.name, 'data-change': s.change },
    };
  });
}

// `30 passed (30 outputs), 10 filtered out, 1 dead-lettered (invalid-json 1)`, as
// `plumber plan --sample` prints it (src/datadiff.rs `Tally::summary`).
function tally(t: Tally): string {
  const kinds = Object.entries(t.deadLettered ?? {});
  const dead = kinds.reduce((n, [, c]) => n + c, 0);
  let text = `${t.passed} passed (${t.outputs} outputs), ${t.filtered} filtered out, ${dead} dead-lettered`;
  if (dead > 0) text += ` (${kinds.map(([k, c]) => `${k} ${c}`).join(', ')})`;
  if (t.failed > 0) text += `, ${t.failed} not run`;
  return text;
}

function DataDiffView(props: { d: StepDiff }) {
  const { d } = props;
  return (
    <details class="data-diff" data-diff-step={d.step} open>
      <summary>
        Data diff of <code>{d.step}</code>
        {d.note ? '' : `: ${d.sampled} records from ${d.topics.join(', ')}`}
      </summary>
      {d.note ? (
        <p class="muted small">{d.note}</p>
      ) : (
        <>
          {d.caveat ? <p class="muted small">{d.caveat}</p> : null}
          <ul class="plain small">
            {d.old ? <li data-version="old">old: {tally(d.old)}</li> : null}
            {d.new ? <li data-version="new">new: {tally(d.new)}</li> : null}
            {d.old ? <li>records whose output changed: {d.changed}</li> : null}
            {d.newDeadLetterKinds.length ? <li>new dead-letter kinds: {d.newDeadLetterKinds.join(', ')}</li> : null}
            {d.fieldsAppeared.length ? <li>fields appeared: {d.fieldsAppeared.join(', ')}</li> : null}
            {d.fieldsVanished.length ? <li>fields vanished: {d.fieldsVanished.join(', ')}</li> : null}
          </ul>
          {d.examples.length ? (
            <table class="examples small">
              <thead>
                <tr>
                  <th scope="col">record</th>
                  <th scope="col">old</th>
                  <th scope="col">new</th>
                </tr>
              </thead>
              <tbody>
                {d.examples.map((e, i) => (
                  <tr key={i}>
                    <td>
                      {e.key != null ? <span class="muted">{e.key}: </span> : null}
                      <code>{e.input}</code>
                    </td>
                    <td>
                      <code>{e.old.join('\n')}</code>
                    </td>
                    <td>
                      <code>{e.new.join('\n')}</code>
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          ) : null}
        </>
      )}
    </details>
  );
}

function TopologyPlanView(props: { t: TopologyPlan; plan: RefPlan; level: 3 | 4; link: boolean }) {
  const { t, plan } = props;
  const H = props.level === 3 ? 'h3' : 'h4';
  const id = `plan-${slug(plan.ref)}-${slug(t.name)}`;
  return (
    <div class="plan-topology" aria-labelledby={id}>
      <H id={id}>
        {props.link ? <a href={topologyHref(t.name)}>{t.name}</a> : t.name}{' '}
        <span class={`pill tone-${t.change}`}>{CHANGES[t.change] ?? t.change}</span>{' '}
        <span class="muted small">
          cutover {t.cutover} · cluster {t.cluster}
        </span>
      </H>
      <Dag nodes={planNodes(t)} label={`Plan of ${t.name} for ${plan.ref}: steps by change`} />
      {t.actions.length ? (
        <details class="plan-actions" open={t.actions.length <= 12}>
          <summary>
            {t.actions.length} {t.actions.length === 1 ? 'action' : 'actions'}
          </summary>
          <ol class="action-list plain">
            {t.actions.map((a, i) => (
              <li key={i}>
                <code class="action-kind">{a.action}</code> {describeAction(a)}
              </li>
            ))}
          </ol>
        </details>
      ) : (
        <p class="muted small">No action: nothing to run.</p>
      )}
      {t.keptTopics?.length ? (
        <p class="muted small">
          Kept (not deleted): {t.keptTopics.map((k) => <code key={k}>{k} </code>)}
        </p>
      ) : null}
      {(plan.dataDiff ?? [])
        .filter((d) => d.topology === t.name)
        .map((d) => (
          <DataDiffView key={d.step} d={d} />
        ))}
    </div>
  );
}

export const touches = (plan: RefPlan, topology: string) =>
  plan.topologies.some((t) => t.name === topology && t.change !== 'unchanged') ||
  plan.errors.some((e) => e.file.startsWith(`topologies/${topology}/`)) ||
  plan.conflicts.some((f) => f.startsWith(`topologies/${topology}/`));

export function PlanCard(props: { plan: RefPlan; only?: string; level: 2 | 3 }) {
  const { plan, only } = props;
  const H = props.level === 2 ? 'h2' : 'h3';
  const id = `plan-${slug(plan.ref)}`;
  const shown = plan.topologies.filter((t) => (only ? t.name === only : t.change !== 'unchanged'));
  const unchanged = only ? [] : plan.topologies.filter((t) => t.change === 'unchanged');
  const errors = only ? plan.errors.filter((e) => e.file.startsWith(`topologies/${only}/`)) : plan.errors;
  const verdict = plan.valid
    ? { cls: 'tone-valid', text: '✓ valid' }
    : plan.conflicts.length
      ? { cls: 'tone-invalid', text: '✕ conflicts' }
      : { cls: 'tone-invalid', text: '✕ invalid' };
  return (
    <section class="card plan" data-plan={plan.ref} data-valid={String(plan.valid)} aria-labelledby={id}>
      <div class="plan-head">
        <H id={id}>
          <code>{plan.ref}</code>
          {plan.pullRequest != null ? <span class="muted"> · PR #{plan.pullRequest}</span> : null}
        </H>
        <span class={`pill ${verdict.cls}`}>{verdict.text}</span>
      </div>
      <p class="meta">
        head <Commit sha={plan.head} /> merged into <Commit sha={plan.base} /> · planned from <Commit sha={plan.from} />
        {plan.preview ? ' · preview environment running' : ''}
        {plan.keepTopics ? ' · keeps retired topics' : ''}
      </p>
      {!plan.valid && plan.validAlone ? (
        <p class="note">The ref is valid on its own: only the merge into the branch breaks it.</p>
      ) : null}
      {plan.conflicts.length ? (
        <div class="error-box">
          <p class="error-title">
            <strong>The merge conflicts in</strong>
          </p>
          <ul class="plain">
            {plan.conflicts.map((f) => (
              <li key={f}>
                <code>{f}</code>
              </li>
            ))}
          </ul>
        </div>
      ) : null}
      {errors.length ? (
        <div class="error-box">
          <p class="error-title">
            <strong>
              {errors.length} {errors.length === 1 ? 'error' : 'errors'}
            </strong>
          </p>
          <ul class="plain diagnostics">
            {errors.map((e, i) => (
              <li key={i} data-error>
                <PlaceLink place={e} /> <span class="muted">{e.code}</span> <Text text={e.message} />
              </li>
            ))}
          </ul>
        </div>
      ) : null}
      {plan.valid && shown.length === 0 ? <p class="muted">No topology changes.</p> : null}
      {shown.map((t) => (
        <TopologyPlanView key={t.name} t={t} plan={plan} level={props.level === 2 ? 3 : 4} link={!only} />
      ))}
      {unchanged.length ? <p class="muted small">Unchanged: {unchanged.map((t) => t.name).join(', ')}</p> : null}
    </section>
  );
}

export function PlansPage(props: { plans: RefPlan[] | null }) {
  return (
    <>
      <div class="page-head">
        <h1>Plans of watched refs</h1>
        <p class="summary">What merging each watched branch or pull request would change, planned against what runs now.</p>
      </div>
      {props.plans == null ? (
        <p class="muted">Loading plans…</p>
      ) : props.plans.length === 0 ? (
        <p class="card empty">No watched ref has a plan: the daemon plans the refs matching <code>--watch-refs</code> (by default branches, pull and merge requests).</p>
      ) : (
        props.plans.map((p) => <PlanCard key={p.ref} plan={p} level={2} />)
      )}
    </>
  );
}
