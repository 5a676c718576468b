/**
 * The tensor relationship diagram: a node's k-hop upstream (left) and downstream (right) neighbours as
 * columns of a small left-to-right SVG diagram, with the condition abbreviations of their watchpoint hits.
 * Clicking a node sends `{type: "click", name}`. Data: the `relations` message of ../PROTOCOL.md.
 */
import { WidgetModel, Msg } from './model';

/** node row: [name, label, cls, depth, marks] (depth < 0 upstream, 0 the node, > 0 downstream) */
export type RelNode = [string, string, string, number, string];
export interface RelationsMsg extends Msg {
  center: string;
  hops: number;
  nodes: RelNode[];
  edges: number[];
}

export const CLASS_COLOURS: Record<string, string> = {
  op: '#4c78a8', module: '#72b7b2', parameter: '#54a24b', gradient: '#e45756', optimizer: '#b279a2',
  input: '#9d755d', scope: '#bab0ac'
};
const NODE_W = 150, NODE_H = 24, COL_GAP = 60, ROW_GAP = 18, PAD = 10, MARK_H = 13;
const SVG = 'http://www.w3.org/2000/svg';

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number>,
                                                   parent?: Element): SVGElementTagNameMap[K] {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  parent?.appendChild(e);
  return e;
}

function clip(text: string, n: number): string {
  return text.length > n ? text.slice(0, n - 1) + '…' : text;
}

/** Node positions: one column per depth (left to right), nodes in the order given, columns centred. */
export function layoutRelations(nodes: RelNode[]): { x: number[]; y: number[]; width: number; height: number } {
  const depths = [...new Set(nodes.map(n => n[3]))].sort((a, b) => a - b);
  const col = new Map(depths.map((d, i) => [d, i]));
  const perCol = depths.map(d => nodes.filter(n => n[3] === d).length);
  const tallest = Math.max(1, ...perCol);
  const rowH = NODE_H + ROW_GAP;
  const height = PAD * 2 + tallest * rowH;
  const seen = new Map<number, number>();
  const x: number[] = [], y: number[] = [];
  for (const n of nodes) {
    const c = col.get(n[3])!;
    const k = seen.get(c) ?? 0;
    seen.set(c, k + 1);
    x.push(PAD + c * (NODE_W + COL_GAP));
    y.push(PAD + MARK_H + (tallest - perCol[c]) * rowH / 2 + k * rowH);
  }
  return { x, y, width: PAD * 2 + depths.length * (NODE_W + COL_GAP) - COL_GAP, height: height + MARK_H };
}

export function renderRelations(model: WidgetModel, el: HTMLElement): () => void {
  el.innerHTML = '';
  el.style.overflow = 'auto';
  el.style.maxHeight = `${Number(model.get('height')) || 320}px`;
  el.style.fontFamily = 'var(--jp-ui-font-family, sans-serif)';
  let selected = '';

  function draw(m: RelationsMsg): void {
    el.innerHTML = '';
    if (!m.nodes.length) {
      el.textContent = 'no node';
      return;
    }
    const { x, y, width, height } = layoutRelations(m.nodes);
    const root = svg('svg', { width, height, class: 'nbdebug-rel-svg', 'font-size': 11 }, el);
    const defs = svg('defs', {}, root);
    const marker = svg('marker', { id: 'nbdebug-rel-arrow', viewBox: '0 0 10 10', refX: 10, refY: 5,
      markerWidth: 6, markerHeight: 6, orient: 'auto-start-reverse' }, defs);
    svg('path', { d: 'M 0 0 L 10 5 L 0 10 z', fill: '#999' }, marker);
    const edges = svg('g', { class: 'nbdebug-rel-edges' }, root);
    for (let k = 0; k + 1 < m.edges.length; k += 2) {
      const a = m.edges[k], b = m.edges[k + 1];
      if (x[a] === undefined || x[b] === undefined) continue;
      let d: string;
      if (x[a] < x[b]) {
        const x0 = x[a] + NODE_W, y0 = y[a] + NODE_H / 2, x1 = x[b], y1 = y[b] + NODE_H / 2, mx = (x0 + x1) / 2;
        d = `M ${x0} ${y0} C ${mx} ${y0}, ${mx} ${y1}, ${x1} ${y1}`;
      } else { // same column (or backwards): a loop on the right
        const x0 = x[a] + NODE_W, y0 = y[a] + NODE_H / 2, x1 = x[b] + NODE_W, y1 = y[b] + NODE_H / 2;
        d = `M ${x0} ${y0} C ${x0 + 30} ${y0}, ${x1 + 30} ${y1}, ${x1} ${y1}`;
      }
      svg('path', { d, fill: 'none', stroke: '#b0b0b0', 'stroke-width': 1.2, 'marker-end': 'url(#nbdebug-rel-arrow)',
        class: 'nbdebug-rel-edge', 'data-src': m.nodes[a][0], 'data-dst': m.nodes[b][0] }, edges);
    }
    const layer = svg('g', { class: 'nbdebug-rel-nodes' }, root);
    m.nodes.forEach(([name, label, cls, depth, marks], i) => {
      const center = name === m.center;
      const g = svg('g', { class: 'nbdebug-rel-node' + (center ? ' nbdebug-rel-center' : '') +
        (name === selected ? ' nbdebug-rel-selected' : ''), 'data-name': name, 'data-depth': depth,
        transform: `translate(${x[i]},${y[i]})`, cursor: 'pointer' }, layer);
      svg('title', {}, g).textContent = `${name} (${cls})`;
      svg('rect', { width: NODE_W, height: NODE_H, rx: 5, fill: CLASS_COLOURS[cls] ?? '#888',
        stroke: center ? '#000' : name === selected ? '#f0a000' : '#333', 'stroke-width': center || name === selected ? 2.5 : 1 }, g);
      const t = svg('text', { x: NODE_W / 2, y: NODE_H / 2 + 4, 'text-anchor': 'middle', fill: '#fff',
        'font-weight': center ? 'bold' : 'normal', class: 'nbdebug-rel-label', 'pointer-events': 'none' }, g);
      t.textContent = clip(label, 22);
      if (marks) {
        const mk = svg('text', { x: NODE_W / 2, y: -3, 'text-anchor': 'middle', fill: '#cf222e',
          'font-weight': 'bold', class: 'nbdebug-rel-mark', 'pointer-events': 'none' }, g);
        mk.textContent = marks;
      }
      g.addEventListener('click', () => {
        selected = name;
        model.send({ type: 'click', name });
        draw(m);
      });
    });
  }

  function onMsg(content: Msg): void {
    if (!content || content.type !== 'relations') return;
    draw(content as RelationsMsg);
  }
  model.on('msg:custom', onMsg);
  model.send({ type: 'hello' });
  return () => {
    model.off('msg:custom', onMsg);
    el.innerHTML = '';
  };
}
