import { Graph, layout } from '@dagrejs/dagre';
import { useMemo, useState } from 'preact/hooks';
import type { Kind } from './api';

// One step of a diagram. What it shows is text (kind, state, numbers); the shape repeats the
// kind and the colour the state, so the diagram reads the same without colour.
export interface DagNode {
  id: string;
  kind: Kind;
  inputs: string[];
  /** Upper line: the kind in words (e.g. "processor · jq"). */
  kindLabel: string;
  /** Upper right: the state or change in words, with a glyph. */
  badge: string;
  /** CSS class carrying the colour: `tone-running`, `tone-added`, … */
  tone: string;
  /** Dashed outline: a step that is stopped or removed. */
  dashed?: boolean;
  /** The third line: topic, or replicas · records/s. */
  detail: string;
  /** An optional fourth line (a processor's lag). */
  extra?: string;
  /** An optional last line: the life a move retires, in words. */
  retiring?: string;
  /** The full description for assistive technology (and the hover title). */
  label: string;
  hover: string;
  attrs: Record<string, string>;
}

interface Placed {
  node: DagNode;
  x: number;
  y: number;
  w: number;
  h: number;
}

interface Layout {
  width: number;
  height: number;
  placed: Map<string, { x: number; y: number; w: number; h: number }>;
  edges: { from: string; to: string; d: string }[];
}

const CHAR = 6.6; // average width of a 12 px system-ui character
const PAD = 14;

function nodeSize(n: DagNode): { w: number; h: number } {
  // Only stable text decides the size (a processor's numbers are not): numbers changing
  // never move the layout.
  // The upper line holds the kind and a badge of at most ~11 characters; a source's tip and a
  // sink's notch take room too.
  const tip = n.kind === 'processor' ? 0 : 14;
  const text = Math.max(n.id.length * 7.9, n.kindLabel.length * 6.6 + 104) + tip;
  const detail = n.kind === 'processor' ? (n.retiring != null ? 270 : 176) : n.detail.length * CHAR;
  const w = Math.min(300, Math.max(detail, text) + 2 * PAD);
  const h = 66 + (n.extra != null ? 18 : 0) + (n.retiring != null ? 17 : 0);
  return { w: Math.round(Math.max(w, n.kind === 'processor' ? 204 : 160)), h };
}

// A B-spline through dagre's points (as d3's curveBasis): smooth, and it stays inside the hull.
function basis(points: { x: number; y: number }[]): string {
  if (points.length < 3) return `M${points.map((p) => `${p.x},${p.y}`).join('L')}`;
  const f = (n: number) => Math.round(n * 10) / 10;
  let d = `M${f(points[0].x)},${f(points[0].y)}`;
  const p = [points[0], ...points, points[points.length - 1]];
  d += `L${f((5 * p[0].x + p[1].x) / 6)},${f((5 * p[0].y + p[1].y) / 6)}`;
  for (let i = 1; i < p.length - 2; i++) {
    const a = p[i];
    const b = p[i + 1];
    d += `C${f((2 * a.x + b.x) / 3)},${f((2 * a.y + b.y) / 3)} ${f((a.x + 2 * b.x) / 3)},${f((a.y + 2 * b.y) / 3)} ${f((a.x + 4 * b.x + p[i + 2].x) / 6)},${f((a.y + 4 * b.y + p[i + 2].y) / 6)}`;
  }
  const last = points[points.length - 1];
  return `${d}L${f(last.x)},${f(last.y)}`;
}

function computeLayout(nodes: DagNode[]): Layout {
  const g = new Graph();
  g.setGraph({ rankdir: 'LR', nodesep: 20, ranksep: 44, marginx: 6, marginy: 6 });
  g.setDefaultEdgeLabel(() => ({}));
  const ids = new Set(nodes.map((n) => n.id));
  for (const n of nodes) {
    const { w, h } = nodeSize(n);
    g.setNode(n.id, { width: w, height: h });
  }
  for (const n of nodes) for (const input of n.inputs) if (ids.has(input)) g.setEdge(input, n.id);
  layout(g);
  const placed = new Map<string, { x: number; y: number; w: number; h: number }>();
  for (const n of nodes) {
    const p = g.node(n.id) as { x: number; y: number; width: number; height: number };
    placed.set(n.id, { x: p.x, y: p.y, w: p.width, h: p.height });
  }
  const edges = g.edges().map((e) => {
    const points = (g.edge(e) as { points: { x: number; y: number }[] }).points;
    return { from: e.v, to: e.w, d: basis(points) };
  });
  const graph = g.graph() as { width?: number; height?: number };
  return { width: Math.ceil(graph.width ?? 0), height: Math.ceil(graph.height ?? 0), placed, edges };
}

function shape(kind: Kind, w: number, h: number): string {
  const r = 8;
  const tip = 12;
  switch (kind) {
    case 'source': // flat left, pointing right: data comes out of it
      return `M${r},0H${w - tip}L${w},${h / 2}L${w - tip},${h}H${r}Q0,${h} 0,${h - r}V${r}Q0,0 ${r},0Z`;
    case 'sink': // notched left: data goes into it
      return `M0,0H${w - r}Q${w},0 ${w},${r}V${h - r}Q${w},${h} ${w - r},${h}H0L${tip},${h / 2}Z`;
    default:
      return `M${r},0H${w - r}Q${w},0 ${w},${r}V${h - r}Q${w},${h} ${w - r},${h}H${r}Q0,${h} 0,${h - r}V${r}Q0,0 ${r},0Z`;
  }
}

const fit = (text: string, width: number, charWidth: number) => {
  const max = Math.floor(width / charWidth);
  return text.length <= max ? text : `${text.slice(0, Math.max(1, max - 1))}…`;
};

let diagrams = 0;

export function Dag(props: {
  nodes: DagNode[];
  label: string;
  selected?: string | null;
  onSelect?: (id: string) => void;
}) {
  const { nodes, selected, onSelect } = props;
  // Layout only when the graph itself changes (steps, kinds, edges), not its numbers.
  const signature = nodes
    .map((n) => `${n.id}\u0000${n.kind}\u0000${n.kindLabel}\u0000${nodeSize(n).w}\u0000${n.inputs.join('\u0001')}\u0000${n.extra != null}\u0000${n.retiring != null}`)
    .join('\u0002');
  const shaped = useMemo(() => computeLayout(nodes), [signature]);
  const [marker] = useState(() => `arrow-${++diagrams}`);

  const placed: Placed[] = [];
  for (const node of nodes) {
    const p = shaped.placed.get(node.id);
    if (p) placed.push({ node, ...p });
  }
  // Tab order follows the data: left to right, then top to bottom.
  placed.sort((a, b) => a.x - b.x || a.y - b.y);

  const interactive = onSelect != null;
  return (
    <div class="dag-scroll">
      <svg
        class="dag"
        width={shaped.width}
        height={shaped.height}
        // Shrinks a little to fit (down to 85 %), then scrolls: text stays legible.
        style={{ width: `clamp(${Math.round(shaped.width * 0.85)}px, 100%, ${shaped.width}px)`, height: 'auto' }}
        viewBox={`0 0 ${shaped.width} ${shaped.height}`}
        role="group"
        aria-label={props.label}
      >
        <defs>
          <marker id={marker} viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
            <path d="M0,0L10,5L0,10z" class="arrowhead" />
          </marker>
        </defs>
        <g aria-hidden="true">
          {shaped.edges.map((e) => (
            <path
              key={`${e.from}->${e.to}`}
              class={`edge${selected && (e.from === selected || e.to === selected) ? ' edge-on' : ''}`}
              d={e.d}
              marker-end={`url(#${marker})`}
            />
          ))}
        </g>
        {placed.map(({ node, x, y, w, h }) => {
          const on = selected === node.id;
          const select = () => onSelect?.(node.id);
          return (
            <g
              key={node.id}
              class={`node kind-${node.kind} ${node.tone}${node.dashed ? ' dashed' : ''}${on ? ' selected' : ''}`}
              transform={`translate(${Math.round(x - w / 2)},${Math.round(y - h / 2)})`}
              tabIndex={0}
              role={interactive ? 'button' : 'img'}
              aria-label={node.label}
              aria-pressed={interactive ? on : undefined}
              onClick={select}
              onFocus={select}
              onKeyDown={(ev: KeyboardEvent) => {
                if (ev.key === 'Enter' || ev.key === ' ') {
                  ev.preventDefault();
                  select();
                }
              }}
              {...node.attrs}
            >
              <title>{node.hover}</title>
              <path class="shape" d={shape(node.kind, w, h)} />
              <text class="kind-label" x={node.kind === 'sink' ? PAD + 8 : PAD} y={19}>
                {node.kindLabel}
              </text>
              <text class="badge" x={w - PAD - (node.kind === 'source' ? 8 : 0)} y={19} text-anchor="end">
                {node.badge}
              </text>
              <text class="name" x={node.kind === 'sink' ? PAD + 8 : PAD} y={41}>
                {fit(node.id, w - 2 * PAD - 8, 7.9)}
              </text>
              <text class="detail" x={node.kind === 'sink' ? PAD + 8 : PAD} y={59}>
                {fit(node.detail, w - 2 * PAD - 10, CHAR)}
              </text>
              {node.extra != null ? (
                <text class="detail" x={PAD} y={76}>
                  {fit(node.extra, w - 2 * PAD, CHAR)}
                </text>
              ) : null}
              {node.retiring != null ? (
                <text class="detail retiring-line" x={PAD} y={node.extra != null ? 93 : 76}>
                  {fit(node.retiring, w - 2 * PAD, CHAR)}
                </text>
              ) : null}
            </g>
          );
        })}
      </svg>
    </div>
  );
}

// The shapes, named: the legend above a diagram.
export function Legend(props: { colour: string }) {
  const item = (kind: Kind) => (
    <span class="legend-item">
      <svg width="22" height="14" viewBox="-1 -1 42 26" aria-hidden="true">
        <path d={shape(kind, 40, 24)} class="legend-shape" />
      </svg>
      {kind}
    </span>
  );
  return (
    <p class="legend muted small">
      {item('source')}
      {item('processor')}
      {item('sink')}
      <span class="legend-item">{props.colour}</span>
    </p>
  );
}
