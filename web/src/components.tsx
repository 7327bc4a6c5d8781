import type { ComponentChildren } from 'preact';
import type { LastError, Phase, Place } from './api';
import { ago, iso, place, short } from './format';

// Every state is said in words; the glyph and the colour only repeat it.
const PHASES: Record<string, string> = { idle: '● idle', cutover: '◆ cutover', error: '✕ error' };

// Messages quote names in backticks (as the CLI prints them): shown as code.
export function Text(props: { text: string }) {
  const parts = props.text.split('`');
  if (parts.length < 3 || parts.length % 2 === 0) return <>{props.text}</>;
  return <>{parts.map((p, i) => (i % 2 === 1 ? <code key={i}>{p}</code> : p))}</>;
}

export function PhaseBadge(props: { phase: Phase | string; extra?: string }) {
  return (
    <span class={`pill phase-${props.phase}`}>
      {PHASES[props.phase] ?? props.phase}
      {props.extra ? ` ${props.extra}` : ''}
    </span>
  );
}

export function Commit(props: { sha: string | null | undefined }) {
  if (!props.sha) return <span class="muted">none</span>;
  return (
    <code class="sha" title={props.sha}>
      {short(props.sha)}
    </code>
  );
}

export function When(props: { at: number; now: number }) {
  return (
    <time dateTime={new Date(props.at * 1000).toISOString()} title={iso(props.at)}>
      {ago(props.at, props.now)}
    </time>
  );
}

export function PlaceLink(props: { place: Place }) {
  const text = place(props.place);
  const url = props.place.url;
  // Only a forge's https address is linked: nothing else may leave the page.
  return url && /^https:\/\//.test(url) ? (
    <a href={url} rel="noreferrer noopener" target="_blank" class="place">
      <code>{text}</code>
      <span class="visually-hidden"> (opens the forge)</span>
    </a>
  ) : (
    <code class="place">{text}</code>
  );
}

export function DaemonError(props: { error: LastError; now: number; title?: string }) {
  const e = props.error;
  return (
    <div class="error-box" data-error>
      <p class="error-title">
        <span aria-hidden="true">✕ </span>
        <strong>{props.title ?? 'Last error'}</strong>
        <span class="muted">
          {e.topology ? <> · topology {e.topology}</> : null}
          {e.commit ? (
            <>
              {' '}
              · commit <Commit sha={e.commit} />
            </>
          ) : null}{' '}
          · <When at={e.at} now={props.now} />
        </span>
      </p>
      <p class="error-message">
        <Text text={e.message} />
      </p>
      {e.place ? (
        <p class="error-place">
          at <PlaceLink place={e.place} />
          {e.place.code ? <span class="muted"> ({e.place.code})</span> : null}
          {e.place.message && e.place.message !== e.message ? (
            <>
              : <Text text={e.place.message} />
            </>
          ) : null}
        </p>
      ) : null}
    </div>
  );
}

export function Section(props: { id: string; title: ComponentChildren; level?: 2 | 3; children: ComponentChildren; class?: string; attrs?: Record<string, string> }) {
  const H = props.level === 3 ? 'h3' : 'h2';
  return (
    <section class={`card ${props.class ?? ''}`} aria-labelledby={props.id} {...props.attrs}>
      <H id={props.id}>{props.title}</H>
      {props.children}
    </section>
  );
}

export const slug = (s: string) => s.replace(/[^A-Za-z0-9_-]+/g, '-');
