import { useEffect, useState } from 'preact/hooks';
import { fetchHistory, fetchPlans, fetchStatus } from './api';
import type { HistoryEntry, RefPlan, Status } from './api';

export type Connection = 'live' | 'reconnecting';

export interface Daemon {
  status: Status | null;
  history: HistoryEntry[] | null;
  plans: RefPlan[] | null;
  connection: Connection;
  /** Whether the page has been connected once (the first attempt says "connecting"). */
  everLive: boolean;
  /** Why a fetch failed, shown until the next success. */
  problem: string | null;
  /** The event the status shown came in: its `id`, and whether it was a connection's opening
   * status (or a resync's) rather than the numbered change every client was sent. `null` while
   * the status shown is the fetched one. */
  statusEvent: { id: string; opening: boolean } | null;
}

const sameMove = (a: HistoryEntry, b: HistoryEntry) =>
  a.topology === b.topology && a.to === b.to && a.startedAt === b.startedAt && a.finishedAt === b.finishedAt;

// Follows the daemon: fetches once, then lives on `api/events`. A `status` event replaces the
// status, `plan` refetches the plans, `history` appends the move, `resync` (this page fell
// behind) refetches both; so does the first `status` after an outage (events may have been
// missed while it was down).
export function useDaemon(): Daemon {
  const [state, setState] = useState<Daemon>({
    status: null,
    history: null,
    plans: null,
    connection: 'reconnecting',
    everLive: false,
    problem: null,
    statusEvent: null,
  });

  useEffect(() => {
    let stopped = false;
    let sawStatusEvent = false;
    let source: EventSource | null = null;
    let retry: ReturnType<typeof setTimeout> | undefined;
    let outage = false;
    // The greatest event id this connection has seen, `null` until its first event: a status
    // first on a connection, or numbered as an event already seen (a resync), is a snapshot.
    let seen: number | null = null;
    const numbered = (ev: Event) => {
      const id = Number((ev as MessageEvent).lastEventId);
      const fresh = seen != null && id > seen;
      if (seen == null || id > seen) seen = id;
      return fresh;
    };
    const update = (f: (d: Daemon) => Daemon) => {
      if (!stopped) setState(f);
    };
    const failed = (what: string) => (e: unknown) =>
      update((d) => ({ ...d, problem: `${what}: ${e instanceof Error ? e.message : String(e)}` }));

    const loadHistory = () =>
      fetchHistory().then((history) => update((d) => ({ ...d, history, problem: null })), failed('history'));
    const loadPlans = () =>
      fetchPlans().then((plans) => update((d) => ({ ...d, plans, problem: null })), failed('plans'));

    fetchStatus().then(
      // The event stream's status is newer than a fetch that answers after it.
      (status) => {
        if (!sawStatusEvent) update((d) => ({ ...d, status }));
      },
      failed('status'),
    );
    loadHistory();
    loadPlans();

    const connect = () => {
      seen = null;
      source = new EventSource('api/events');
      source.addEventListener('status', (ev) => {
        const fresh = numbered(ev);
        let status: Status;
        try {
          status = JSON.parse((ev as MessageEvent<string>).data) as Status;
        } catch {
          return;
        }
        sawStatusEvent = true;
        const statusEvent = { id: (ev as MessageEvent).lastEventId, opening: !fresh };
        update((d) => ({ ...d, status, statusEvent, connection: 'live', everLive: true }));
        if (outage) {
          outage = false;
          loadHistory();
          loadPlans();
        }
      });
      source.addEventListener('plan', (ev) => {
        numbered(ev);
        loadPlans();
      });
      // This page fell behind the stream: the daemon sent the status again; read the rest.
      source.addEventListener('resync', () => {
        loadHistory();
        loadPlans();
      });
      source.addEventListener('history', (ev) => {
        numbered(ev);
        let entry: HistoryEntry;
        try {
          entry = JSON.parse((ev as MessageEvent<string>).data) as HistoryEntry;
        } catch {
          return;
        }
        update((d) => ({
          ...d,
          history: d.history ? (d.history.some((h) => sameMove(h, entry)) ? d.history : [...d.history, entry]) : [entry],
        }));
      });
      source.onerror = () => {
        outage = true;
        // The browser reconnects by itself: the next connection starts with a snapshot.
        seen = null;
        update((d) => ({ ...d, connection: 'reconnecting' }));
        // The browser retries by itself unless the answer was not an event stream (a 502 from
        // a proxy, a daemon that is starting): then it gives up, and so we start over.
        if (source && source.readyState === EventSource.CLOSED) {
          source = null;
          clearTimeout(retry);
          retry = setTimeout(() => {
            if (!stopped) connect();
          }, 3000);
        }
      };
    };
    connect();
    return () => {
      stopped = true;
      clearTimeout(retry);
      source?.close();
    };
  }, []);

  return state;
}

// The current `location.hash`, as a route.
export type Route = { page: 'overview' } | { page: 'topology'; name: string } | { page: 'plans' };

export function parseRoute(hash: string): Route {
  const path = hash.replace(/^#/, '');
  const topology = /^\/topology\/(.+)$/.exec(path);
  if (topology) {
    try {
      return { page: 'topology', name: decodeURIComponent(topology[1]) };
    } catch {
      return { page: 'topology', name: topology[1] };
    }
  }
  if (path === '/plans') return { page: 'plans' };
  return { page: 'overview' };
}

export function useRoute(): Route {
  const [route, setRoute] = useState(() => parseRoute(location.hash));
  useEffect(() => {
    const onHash = () => {
      setRoute(parseRoute(location.hash));
      window.scrollTo(0, 0);
    };
    addEventListener('hashchange', onHash);
    return () => removeEventListener('hashchange', onHash);
  }, []);
  return route;
}

// Re-renders every `ms` so "2 min ago" stays true.
export function useNow(ms: number): number {
  const [now, setNow] = useState(() => Date.now() / 1000);
  useEffect(() => {
    const t = setInterval(() => setNow(Date.now() / 1000), ms);
    return () => clearInterval(t);
  }, [ms]);
  return now;
}

export const topologyHref = (name: string) => `#/topology/${encodeURIComponent(name)}`;
