import type { Status, TopologyStatus } from './api';
import { Commit, DaemonError, PhaseBadge } from './components';
import { count, rate } from './format';
import { topologyHref } from './live';

// A retiring life's lag counts too: until it has drained, its records are still to process.
export const totalLag = (t: TopologyStatus): number | null => {
  const lags = t.steps
    .flatMap((s) => [s.lag, s.retiring?.lag])
    .filter((l): l is number => l != null);
  return lags.length ? lags.reduce((a, b) => a + b, 0) : null;
};

export const totalRate = (t: TopologyStatus): number | null => {
  const rates = t.steps
    .filter((s) => s.kind === 'processor')
    .map((s) => s.recordsPerSecond)
    .filter((r): r is number => r != null);
  return rates.length ? rates.reduce((a, b) => a + b, 0) : null;
};

export function stepCounts(t: TopologyStatus): string {
  const n = (k: string) => t.steps.filter((s) => s.kind === k).length;
  return `${n('source')} in · ${n('processor')} proc · ${n('sink')} out`;
}

export function Overview(props: { status: Status; now: number }) {
  const { status, now } = props;
  return (
    <>
      <div class="page-head">
        <h1>Topologies</h1>
        <p class="summary">
          Branch <code>{status.branch}</code> at <Commit sha={status.commit} /> · <PhaseBadge phase={status.phase} /> ·{' '}
          {status.topologies.length} {status.topologies.length === 1 ? 'topology' : 'topologies'}
        </p>
      </div>
      {status.lastError ? <DaemonError error={status.lastError} now={now} /> : null}
      <section class="card flush" aria-labelledby="topologies-title">
        <h2 id="topologies-title" class="visually-hidden">
          Every topology
        </h2>
        {status.topologies.length === 0 ? (
          <p class="empty">No topology runs: the branch's newest valid commit defines none.</p>
        ) : (
          <div class="table-scroll">
            <table class="responsive">
              <thead>
                <tr>
                  <th scope="col">Topology</th>
                  <th scope="col">Commit</th>
                  <th scope="col">Phase</th>
                  <th scope="col">Steps</th>
                  <th scope="col" class="num">
                    Total lag
                  </th>
                  <th scope="col" class="num">
                    Records/s
                  </th>
                  <th scope="col">Error</th>
                </tr>
              </thead>
              <tbody>
                {status.topologies.map((t) => (
                  <tr key={t.name} data-topology={t.name} data-phase={t.phase}>
                    <th scope="row" data-label="Topology">
                      <a href={topologyHref(t.name)}>{t.name}</a>
                      {t.previewOf ? (
                        <span class="muted small">
                          {' '}
                          preview of {t.previewOf.topology} (PR #{t.previewOf.pullRequest})
                        </span>
                      ) : null}
                    </th>
                    <td data-label="Commit">
                      <Commit sha={t.commit} />
                    </td>
                    <td data-label="Phase">
                      <PhaseBadge
                        phase={t.phase}
                        extra={t.cutover ? `${t.cutover.done}/${t.cutover.done + t.cutover.remaining}` : undefined}
                      />
                    </td>
                    <td data-label="Steps">
                      {t.steps.length} <span class="muted small">({stepCounts(t)})</span>
                    </td>
                    <td data-label="Total lag" class="num">
                      {count(totalLag(t))}
                    </td>
                    <td data-label="Records/s" class="num">
                      {rate(totalRate(t))}
                    </td>
                    <td data-label="Error" class="error-cell">
                      {t.lastError ? (
                        <span class="error-text" data-error title={t.lastError}>
                          <span aria-hidden="true">✕ </span>
                          {t.lastError}
                        </span>
                      ) : (
                        <span class="muted">none</span>
                      )}
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </section>
    </>
  );
}
