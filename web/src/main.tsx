import { render } from 'preact';
import { useEffect } from 'preact/hooks';
import { Overview } from './overview';
import { PlansPage } from './plans';
import { TopologyPage } from './topology';
import { useDaemon, useNow, useRoute } from './live';
import type { Daemon } from './live';
import './style.css';

function ConnectionState(props: { daemon: Daemon }) {
  const { connection, everLive } = props.daemon;
  const text = connection === 'live' ? 'live' : everLive ? 'disconnected, reconnecting…' : 'connecting…';
  return (
    <span class={`connection connection-${connection}`} data-connection={connection} role="status">
      <span aria-hidden="true">{connection === 'live' ? '● ' : '◌ '}</span>
      {text}
    </span>
  );
}

function App() {
  const daemon = useDaemon();
  const route = useRoute();
  // Ticks so "2 min ago" stays true between events; a status event renders with the time too.
  useNow(15000);
  const now = Date.now() / 1000;
  const { status } = daemon;

  useEffect(() => {
    document.title =
      route.page === 'topology' ? `${route.name} · Plumber` : route.page === 'plans' ? 'Plans · Plumber' : 'Plumber';
  }, [route]);

  let body;
  if (status == null) {
    body = <p class="card empty">{daemon.problem ? `Cannot reach the daemon (${daemon.problem}).` : 'Loading…'}</p>;
  } else if (route.page === 'topology') {
    body = <TopologyPage key={route.name} status={status} name={route.name} history={daemon.history} plans={daemon.plans} now={now} />;
  } else if (route.page === 'plans') {
    body = <PlansPage plans={daemon.plans} />;
  } else {
    body = <Overview status={status} now={now} />;
  }
  const plans = daemon.plans?.length;
  return (
    <>
      <a class="skip" href="#main" onClick={(e) => { e.preventDefault(); document.getElementById('main')?.focus(); }}>
        Skip to content
      </a>
      <header class="top">
        <a class="brand" href="#/">
          <span class="logo" aria-hidden="true">⟿</span> Plumber
        </a>
        <nav aria-label="Main">
          <a href="#/" aria-current={route.page !== 'plans' ? 'page' : undefined}>
            Topologies
          </a>
          <a href="#/plans" aria-current={route.page === 'plans' ? 'page' : undefined}>
            Plans{plans ? ` (${plans})` : ''}
          </a>
        </nav>
        <ConnectionState daemon={daemon} />
      </header>
      {/* Which status event the page shows (for tests that compare it with the daemon's). */}
      <main
        id="main"
        tabIndex={-1}
        data-event-id={daemon.statusEvent?.id}
        data-event-opening={daemon.statusEvent?.opening ? '' : undefined}
      >
        {body}
      </main>
    </>
  );
}

const root = document.getElementById('app');
if (root) render(<App />, root);
