/**
 * Layered (Sugiyama) layout of the graph with elkjs, in a Web Worker, one expanded scope at a time.
 *
 * Each expanded scope is laid out on its own: its direct children (nodes, and child scopes as boxes of
 * their current size) and the edges lifted to them (graph-data.ts). Data entering / leaving the scope
 * goes through two port nodes, `__in` (first layer) and `__out` (last layer), so the connections
 * inside a box are routed too. Layouts are cached per scope against the scope's data version and
 * the sizes of its children; opening or closing a scope recomputes that scope and its ancestors only.
 * Scopes of one depth go to ELK in one call per worker (a small pool). Scopes of more than
 * `FAST_ABOVE` children, and every scope of a run with more than `ELK_BUDGET` children to lay out
 * in all (a saved state opening hundreds of scopes), take layout-fast.ts instead: ELK needs about
 * 1 s per 1,000 nodes. The visible sections (forward, backward, optimizer) are placed side by side.
 */
import ELKApi from 'elkjs/lib/elk-api.js';
import workerSource from 'elk-worker-source';
import { GraphData } from './graph-data';
import { fastLayered } from './layout-fast';

/** Scopes with more direct children than this are laid out by layout-fast.ts (ELK: ~1 s per 1,000). */
export const FAST_ABOVE = 300;
/** When the scopes to lay out hold more children than this in all, they all take the fast layout. */
export const ELK_BUDGET = 2500;

export const NODE_H = 28;
export const BOX_H = 44;
export const HEADER = 30;
export const PAD = 14;
export const PORT = 8;
export const SECTION_GAP = 80;

export interface Rect { x: number; y: number; w: number; h: number }
interface ScopeLayout { sig: string; w: number; h: number; pos: Map<string, Rect>; edges: { a: string; b: string; pts: number[] }[] }

export type ItemKind = 'node' | 'box' | 'frame' | 'port';
export interface Item extends Rect {
  kind: ItemKind;
  /** node id for `node`, -1 otherwise */
  id: number;
  /** scope key for `box` / `frame` / `port` */
  key: string;
  depth: number;
}
export interface EdgeItem {
  /** the items at both ends ("n<id>", "s<key>", "in:<key>", "out:<key>") */
  a: string;
  b: string;
  pts: number[];
  minX: number; minY: number; maxX: number; maxY: number;
}
export interface Scene {
  items: Item[];
  edges: EdgeItem[];
  byRef: Map<string, Item>;
  bounds: Rect;
  /** scopes whose layout was computed for this scene (the rest came from the cache) */
  computed: string[];
  ms: number;
}

const pool: any[] = [];
let next = 0;
let workerUrl = '';
/** Scopes of one depth are laid out in parallel on up to 3 workers. */
const POOL = Math.max(1, Math.min(3, (globalThis.navigator?.hardwareConcurrency ?? 2) - 1));
/** An ELK instance (round robin over the pool), its worker started from a Blob URL of the inlined source. */
function getElk(): any {
  if (pool.length < POOL) {
    if (!workerUrl) workerUrl = URL.createObjectURL(new Blob([workerSource as string], { type: 'application/javascript' }));
    const ELK = (ELKApi as any).default ?? ELKApi;
    pool.push(new ELK({ workerFactory: () => new Worker(workerUrl) }));
    return pool[pool.length - 1];
  }
  return pool[next++ % pool.length];
}

let measureCtx: CanvasRenderingContext2D | null = null;
const widths = new Map<string, number>();
/** Width of `text` in px at `font` (cached). */
export function textWidth(text: string, font = '11px sans-serif'): number {
  const k = font + '\u0001' + text;
  let w = widths.get(k);
  if (w === undefined) {
    if (!measureCtx) measureCtx = document.createElement('canvas').getContext('2d');
    if (measureCtx) {
      measureCtx.font = font;
      w = measureCtx.measureText(text).width;
    } else w = text.length * 6.2;
    if (widths.size > 200000) widths.clear();
    widths.set(k, w);
  }
  return w;
}

/** Start the worker (and its JIT) before the first graph arrives. */
export function warmUp(): void {
  if (pool.length) return;
  for (let i = 0; i < POOL; i++) getElk().layout({ id: 'w', layoutOptions: LAYOUT_OPTIONS, children: [{ id: 'a', width: 10, height: 10 }, { id: 'b', width: 10, height: 10 }],
    edges: [{ id: 'e', sources: ['a'], targets: ['b'] }] }).catch(() => undefined);
}

export const NODE_FONT = '11px sans-serif';
export const BOX_FONT = 'bold 12px sans-serif';
const clamp = (v: number, a: number, b: number) => Math.max(a, Math.min(b, v));

export function countText(n: number): string {
  return `${n.toLocaleString('en-US')} node${n === 1 ? '' : 's'}`;
}

const LAYOUT_OPTIONS: Record<string, string> = {
  'elk.algorithm': 'layered',
  'elk.direction': 'DOWN',
  'elk.edgeRouting': 'ORTHOGONAL',
  'elk.layered.spacing.nodeNodeBetweenLayers': '26',
  'elk.spacing.nodeNode': '18',
  'elk.spacing.edgeNode': '10',
  'elk.spacing.edgeEdge': '6',
  'elk.layered.spacing.edgeNodeBetweenLayers': '10',
  'elk.layered.spacing.edgeEdgeBetweenLayers': '6',
  'elk.spacing.componentComponent': '28',
  'elk.layered.considerModelOrder.strategy': 'NODES_AND_EDGES',
  'elk.separateConnectedComponents': 'true',
  'elk.aspectRatio': '1.6',
  'elk.padding': `[top=${HEADER + 6},left=${PAD},bottom=${PAD},right=${PAD}]`
};

/** layout-fast.ts on an ELK graph (the same input, the same shape of result). */
function fast(graph: any): any {
  const layer = (c: any) => {
    const v = c.layoutOptions?.['elk.layered.layering.layerConstraint'];
    return v === 'FIRST_SEPARATE' ? 'first' : v === 'LAST_SEPARATE' ? 'last' : undefined;
  };
  return fastLayered(graph.children.map((c: any) => ({ id: c.id, width: c.width, height: c.height, layer: layer(c) })),
    graph.edges.map((e: any) => ({ id: e.id, source: e.sources[0], target: e.targets[0] })),
    { top: HEADER + 6, left: PAD, bottom: PAD, right: PAD });
}

export class Layouts {
  private cache = new Map<string, ScopeLayout>();
  constructor(private g: GraphData) {}

  nodeSize(id: number): [number, number] {
    return [clamp(textWidth(this.g.nodes[id][1], NODE_FONT) + 20, 44, 220), NODE_H];
  }

  boxSize(key: string): [number, number] {
    const row = this.g.scopes.get(key);
    const label = row ? row[2] : key;
    const w = Math.max(textWidth(label, BOX_FONT), textWidth(countText(row ? row[5] : 0), NODE_FONT));
    return [clamp(w + 34, 80, 260), BOX_H];
  }

  private sizeOf(ref: string, expanded: Set<string>): [number, number] {
    if (ref[0] === 'n') return this.nodeSize(Number(ref.slice(1)));
    const key = ref.slice(1);
    if (expanded.has(key)) {
      const l = this.cache.get(key);
      if (l) return [l.w, l.h];
    }
    return this.boxSize(key);
  }

  /** Lay out what is visible: the `sections` shown, and inside them the `expanded` scopes. */
  async run(expanded: Set<string>, sections: string[]): Promise<Scene> {
    const t0 = performance.now();
    const g = this.g;
    const open = (k: string) => expanded.has(k) || g.scopes.get(k)?.[1] === null;
    const roots = sections.map(s => `${s}:`).filter(k => {
      const ix = g.index.get(k);
      return ix && (ix.nodes.length || ix.scopes.length);
    });
    // the scopes to lay out, by depth
    const levels: string[][] = [];
    const walk = (k: string, d: number) => {
      (levels[d] ??= []).push(k);
      for (const c of g.index.get(k)?.scopes ?? []) if (open(c)) walk(c, d + 1);
    };
    for (const r of roots) walk(r, 0);
    const openSet = new Set<string>(levels.flat());
    const computed: string[] = [];
    // opening many scopes at once (a saved state, a deep reveal in a big graph): ELK would take
    // seconds, so everything to compute in this run takes the fast layout
    let work = 0;
    for (const k of openSet) if (!this.cache.has(k)) {
      const ix = g.index.get(k)!;
      work += ix.nodes.length + ix.scopes.length;
    }
    const allFast = work > ELK_BUDGET;
    for (let d = levels.length - 1; d >= 0; d--) {
      const jobs: { key: string; sig: string; graph: any }[] = [];
      for (const k of levels[d]) {
        const ix = g.index.get(k)!;
        const sig = `${g.version.get(k) ?? 0}|` + ix.scopes.filter(c => openSet.has(c))
          .map(c => { const l = this.cache.get(c); return l ? `${c}=${l.w.toFixed(1)}x${l.h.toFixed(1)}` : c; }).join(',');
        const have = this.cache.get(k);
        if (have && have.sig === sig) continue;
        computed.push(k);
        const graph = this.scopeGraph(k, `${jobs.length}\u0002`, openSet);
        if (graph) jobs.push({ key: k, sig, graph });
        else this.store(k, sig, '', { width: 120, height: HEADER + 20, children: [], edges: [] });
      }
      // one ELK call per worker for the whole depth: each scope a compound child of a root that
      // stays where it is ('fixed'); ELK lays out each child's content on its own (SEPARATE_CHILDREN)
      const isFast = (j: { graph: any }) => allFast || j.graph.children.length > FAST_ABOVE;
      for (const j of jobs) if (isFast(j)) this.store(j.key, j.sig, j.graph.id, fast(j.graph));
      const big = jobs.filter(j => !isFast(j) && j.graph.children.length > 150);
      const small = jobs.filter(j => !isFast(j) && j.graph.children.length <= 150);
      const batches: (typeof jobs)[] = big.map(j => [j]);
      const per = Math.max(1, Math.ceil(small.length / POOL));
      for (let i = 0; i < small.length; i += per) batches.push(small.slice(i, i + per));
      await Promise.all(batches.map(async batch => {
        const res = await getElk().layout({ id: 'root', layoutOptions: { 'elk.algorithm': 'fixed' }, children: batch.map(j => j.graph) });
        batch.forEach((j, i) => this.store(j.key, j.sig, j.graph.id, res.children[i]));
      }));
    }
    return this.compose(roots, openSet, computed, performance.now() - t0);
  }

  /** The ELK graph of scope `key` (ids prefixed with `pre`), or null when it holds nothing drawn. */
  private scopeGraph(key: string, pre: string, openSet: Set<string>): any {
    const g = this.g;
    const ix = g.index.get(key)!;
    const refs: string[] = [];
    const order = (r: string) => (r[0] === 'n' ? Number(g.nodes[Number(r.slice(1))][5]) : g.firstOrder.get(r.slice(1)) ?? 0);
    for (const n of ix.nodes) refs.push(`n${n}`);
    for (const s of ix.scopes) if (g.index.get(s)!.nodes.length || g.index.get(s)!.scopes.length) refs.push(`s${s}`);
    if (!refs.length) return null;
    refs.sort((a, b) => order(a) - order(b));
    const present = new Set(refs);
    const children: any[] = [];
    const first = { 'elk.layered.layering.layerConstraint': 'FIRST_SEPARATE' };
    const last = { 'elk.layered.layering.layerConstraint': 'LAST_SEPARATE' };
    if (ix.ins.size) children.push({ id: `${pre}__in`, width: PORT * 2, height: PORT, layoutOptions: first });
    for (const r of refs) {
      const [w, h] = this.sizeOf(r, openSet);
      children.push({ id: pre + r, width: w, height: h });
    }
    if (ix.outs.size) children.push({ id: `${pre}__out`, width: PORT * 2, height: PORT, layoutOptions: last });
    const edges: any[] = [];
    let i = 0;
    const edge = (a: string, b: string) => edges.push({ id: `${pre}e${i++}`, sources: [pre + a], targets: [pre + b] });
    for (const [a, b] of ix.edges.values()) if (present.has(a) && present.has(b)) edge(a, b);
    for (const c of ix.ins) if (present.has(c)) edge('__in', c);
    for (const c of ix.outs) if (present.has(c)) edge(c, '__out');
    const options = { ...LAYOUT_OPTIONS };
    if (children.length > 300) options['elk.layered.thoroughness'] = '2';
    return { id: `${pre}root`, layoutOptions: options, children, edges };
  }

  /** Keep ELK's result `res` for scope `key` (child ids without their prefix). */
  private store(key: string, sig: string, rootId: string, res: any): void {
    const cut = rootId ? rootId.length - 'root'.length : 0;
    const strip = (id: string) => id.slice(cut);
    const pos = new Map<string, Rect>();
    for (const c of res.children ?? []) pos.set(strip(c.id), { x: c.x, y: c.y, w: c.width, h: c.height });
    const out: ScopeLayout['edges'] = [];
    for (const e of res.edges ?? []) {
      const s = e.sections?.[0];
      if (!s) continue;
      const pts = [s.startPoint.x, s.startPoint.y];
      for (const p of s.bendPoints ?? []) pts.push(p.x, p.y);
      pts.push(s.endPoint.x, s.endPoint.y);
      out.push({ a: strip(e.sources[0]), b: strip(e.targets[0]), pts });
    }
    const label = this.g.scopes.get(key)?.[2] ?? key;
    const w = Math.max(res.width, textWidth(label, BOX_FONT) + 60);
    this.cache.set(key, { sig, w, h: res.height, pos, edges: out });
  }

  /** Absolute positions of everything drawn. */
  private compose(roots: string[], openSet: Set<string>, computed: string[], ms: number): Scene {
    const items: Item[] = [];
    const edges: EdgeItem[] = [];
    const byRef = new Map<string, Item>();
    const frames: Item[] = [];
    const leaves: Item[] = [];
    const place = (key: string, ox: number, oy: number, depth: number) => {
      const l = this.cache.get(key)!;
      const frame: Item = { kind: 'frame', id: -1, key, x: ox, y: oy, w: l.w, h: l.h, depth };
      frames.push(frame);
      byRef.set(`s${key}`, frame);
      for (const [ref, p] of l.pos) {
        const x = ox + p.x, y = oy + p.y;
        if (ref === '__in' || ref === '__out') {
          const port: Item = { kind: 'port', id: -1, key: `${ref === '__in' ? 'in' : 'out'}:${key}`, x, y, w: p.w, h: p.h, depth };
          leaves.push(port);
          byRef.set(port.key, port);
        } else if (ref[0] === 'n') {
          const it: Item = { kind: 'node', id: Number(ref.slice(1)), key: '', x, y, w: p.w, h: p.h, depth: depth + 1 };
          leaves.push(it);
          byRef.set(ref, it);
        } else if (openSet.has(ref.slice(1))) {
          place(ref.slice(1), x, y, depth + 1);
        } else {
          const it: Item = { kind: 'box', id: -1, key: ref.slice(1), x, y, w: p.w, h: p.h, depth: depth + 1 };
          leaves.push(it);
          byRef.set(ref, it);
        }
      }
      for (const e of l.edges) {
        const pts = e.pts.map((v, i) => v + (i % 2 ? oy : ox));
        let minX = Infinity, minY = Infinity, maxX = -Infinity, maxY = -Infinity;
        for (let i = 0; i < pts.length; i += 2) {
          minX = Math.min(minX, pts[i]); maxX = Math.max(maxX, pts[i]);
          minY = Math.min(minY, pts[i + 1]); maxY = Math.max(maxY, pts[i + 1]);
        }
        const ref = (r: string) => (r === '__in' ? `in:${key}` : r === '__out' ? `out:${key}` : r);
        edges.push({ a: ref(e.a), b: ref(e.b), pts, minX, minY, maxX, maxY });
      }
    };
    let x = 0;
    for (const r of roots) {
      place(r, x, 0, 0);
      x += this.cache.get(r)!.w + SECTION_GAP;
    }
    items.push(...frames, ...leaves);
    let minX = Infinity, minY = Infinity, maxX = -Infinity, maxY = -Infinity;
    for (const f of frames) if (f.depth === 0) {
      minX = Math.min(minX, f.x); minY = Math.min(minY, f.y);
      maxX = Math.max(maxX, f.x + f.w); maxY = Math.max(maxY, f.y + f.h);
    }
    const bounds = items.length ? { x: minX, y: minY, w: maxX - minX, h: maxY - minY } : { x: 0, y: 0, w: 1, h: 1 };
    return { items, edges, byRef, bounds, computed, ms };
  }
}
