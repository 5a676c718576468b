/**
 * A fast layered layout for scopes too big for ELK within the time budget (hundreds of direct
 * children: ELK's layered algorithm takes ~1 s per 1,000 nodes). Same shape of result as ELK's
 * (`{width, height, children, edges}` with edge sections), so layout.ts stores either the same way.
 *
 * Sugiyama, simplified: layers by longest path in execution order (edges against that order are
 * reversed; sources sit just above their first consumer), long edges get a dummy slot in every layer
 * they cross (so they are routed beside the nodes, never through them), a few barycenter sweeps
 * order each layer, x by the mean of the neighbours with minimum gaps, and edges are orthogonal
 * polylines that turn in the gaps between layers. Nodes with no edges are packed in rows below.
 */

export interface FastChild { id: string; width: number; height: number; layer?: 'first' | 'last' }
export interface FastEdge { id: string; source: string; target: string }

const LAYER_GAP = 26;
const NODE_GAP = 18;
const DUMMY_W = 6;

export function fastLayered(children: FastChild[], edges: FastEdge[], pad: { top: number; left: number; bottom: number; right: number }): any {
  const n = children.length;
  const index = new Map<string, number>();
  children.forEach((c, i) => index.set(c.id, i));
  // graph in index (execution) order; edges against it reversed
  const succ: number[][] = children.map(() => []);
  const pred: number[][] = children.map(() => []);
  const E: { a: number; b: number; rev: boolean; id: string }[] = [];
  for (const e of edges) {
    const a = index.get(e.source), b = index.get(e.target);
    if (a === undefined || b === undefined || a === b) continue;
    const rev = a > b;
    const [u, v] = rev ? [b, a] : [a, b];
    succ[u].push(v);
    pred[v].push(u);
    E.push({ a: u, b: v, rev, id: e.id });
  }
  const isolated = children.map((c, i) => !succ[i].length && !pred[i].length && !c.layer);
  const layer = new Array<number>(n).fill(0);
  const first = children.findIndex(c => c.layer === 'first');
  for (let v = 0; v < n; v++) {
    if (isolated[v] || v === first) continue;
    let l = first >= 0 ? 1 : 0;
    for (const u of pred[v]) l = Math.max(l, layer[u] + 1);
    layer[v] = l;
  }
  // sources (parameters, inputs) just above their first consumer
  for (let v = n - 1; v >= 0; v--) {
    if (isolated[v] || pred[v].length || v === first || !succ[v].length) continue;
    let m = Infinity;
    for (const w of succ[v]) m = Math.min(m, layer[w]);
    layer[v] = Math.max(first >= 0 ? 1 : 0, m - 1);
  }
  let maxL = 0;
  for (let v = 0; v < n; v++) if (!isolated[v]) maxL = Math.max(maxL, layer[v]);
  if (children.some(c => c.layer === 'last')) {
    maxL += 1;
    for (let v = 0; v < n; v++) if (children[v].layer === 'last') layer[v] = maxL;
  }
  // slots per layer: real nodes, then dummies of long edges
  type Slot = { node: number; w: number; h: number; x: number; up: Slot[]; down: Slot[]; order: number };
  const layers: Slot[][] = Array.from({ length: maxL + 1 }, () => []);
  const slotOf: Slot[] = new Array(n);
  for (let v = 0; v < n; v++) {
    if (isolated[v]) continue;
    const s: Slot = { node: v, w: children[v].width, h: children[v].height, x: 0, up: [], down: [], order: v };
    slotOf[v] = s;
    layers[layer[v]].push(s);
  }
  const chains: Slot[][] = [];
  for (const e of E) {
    const chain: Slot[] = [slotOf[e.a]];
    for (let l = layer[e.a] + 1; l < layer[e.b]; l++) {
      const d: Slot = { node: -1, w: DUMMY_W, h: 0, x: 0, up: [], down: [], order: e.a + 0.5 };
      layers[l].push(d);
      chain.push(d);
    }
    chain.push(slotOf[e.b]);
    for (let i = 0; i + 1 < chain.length; i++) { chain[i].down.push(chain[i + 1]); chain[i + 1].up.push(chain[i]); }
    chains.push(chain);
  }
  // order: execution order, then barycenter sweeps
  const reindex = () => layers.forEach(L => L.forEach((s, i) => (s.order = i)));
  layers.forEach(L => L.sort((a, b) => a.order - b.order));
  reindex();
  const bary = (s: Slot, nb: Slot[]) => (nb.length ? nb.reduce((t, x) => t + x.order, 0) / nb.length : s.order);
  for (let sweep = 0; sweep < 4; sweep++) {
    const down = sweep % 2 === 0;
    const seq = down ? layers.slice(1) : layers.slice(0, -1).reverse();
    for (const L of seq) {
      const key = new Map<Slot, number>();
      for (const s of L) key.set(s, bary(s, down ? s.up : s.down));
      L.sort((a, b) => key.get(a)! - key.get(b)! || a.order - b.order);
      L.forEach((s, i) => (s.order = i));
    }
  }
  // x: pack, then pull towards the neighbours' mean keeping the gaps
  const gap = (a: Slot, b: Slot) => (a.node < 0 || b.node < 0 ? 8 : NODE_GAP);
  for (const L of layers) {
    let x = 0;
    for (let i = 0; i < L.length; i++) {
      if (i) x += L[i - 1].w / 2 + gap(L[i - 1], L[i]) + L[i].w / 2;
      L[i].x = x;
    }
  }
  /** Real nodes where they want to be (keeping order and gaps); dummies of long edges fit in around them. */
  const place = (L: Slot[], want: number[]) => {
    const P: number[] = [0];
    for (let i = 1; i < L.length; i++) P.push(P[i - 1] + L[i - 1].w / 2 + gap(L[i - 1], L[i]) + L[i].w / 2);
    const x = want.slice();
    const real = L.map((s, i) => (s.node >= 0 ? i : -1)).filter(i => i >= 0);
    for (let k = 1; k < real.length; k++) x[real[k]] = Math.max(x[real[k]], x[real[k - 1]] + P[real[k]] - P[real[k - 1]]);
    for (let k = real.length - 2; k >= 0; k--) {
      const i = real[k], j = real[k + 1];
      x[i] = Math.min(x[i], Math.max(want[i], x[j] - (P[j] - P[i])));
    }
    let prev = -1;
    for (let i = 0; i < L.length; i++) {
      if (L[i].node >= 0) { prev = i; continue; }
      let next = i + 1;
      while (next < L.length && L[next].node < 0) next++;
      const lo = prev >= 0 ? x[prev] + P[i] - P[prev] : -Infinity;
      const hi = next < L.length ? x[next] - (P[next] - P[i]) : Infinity;
      x[i] = Math.min(Math.max(want[i], lo), Math.max(lo, hi));
    }
    for (let i = 1; i < L.length; i++) x[i] = Math.max(x[i], x[i - 1] + P[i] - P[i - 1]);
    L.forEach((s, i) => (s.x = x[i]));
  };
  for (let it = 0; it < 4; it++) {
    const down = it % 2 === 0;
    for (const L of down ? layers.slice(1) : layers.slice(0, -1).reverse()) {
      // real nodes follow their real neighbours (a skip edge's dummy column does not drag the branch)
      const want = L.map(s => {
        const all = down ? s.up : s.down;
        const real = s.node >= 0 ? all.filter(x => x.node >= 0) : all;
        const nb = real.length ? real : all;
        return nb.length ? nb.reduce((t, x) => t + x.x, 0) / nb.length : s.x;
      });
      place(L, want);
    }
  }
  let minX = Infinity, maxX = -Infinity;
  for (const L of layers) for (const s of L) { minX = Math.min(minX, s.x - s.w / 2); maxX = Math.max(maxX, s.x + s.w / 2); }
  if (!isFinite(minX)) { minX = 0; maxX = 0; }
  // y per layer
  const top: number[] = [];
  const height: number[] = [];
  let y = pad.top;
  for (const L of layers) {
    const h = Math.max(0, ...L.map(s => s.h));
    top.push(y);
    height.push(h);
    y += h + LAYER_GAP;
  }
  let bottom = y - LAYER_GAP;
  const ox = pad.left - minX;
  const out: any[] = [];
  for (const L of layers) for (const s of L) if (s.node >= 0) {
    const l = layer[s.node];
    out.push({ id: children[s.node].id, x: ox + s.x - s.w / 2, y: top[l] + (height[l] - s.h) / 2, width: s.w, height: s.h });
  }
  // isolated nodes in rows under the rest
  const width = Math.max(maxX - minX, 200);
  let rx = 0, rowH = 0, ry = bottom + (out.length ? LAYER_GAP : 0), rowsW = 0;
  for (let v = 0; v < n; v++) {
    if (!isolated[v]) continue;
    const c = children[v];
    if (rx > 0 && rx + c.width > width) { rx = 0; ry += rowH + NODE_GAP; rowH = 0; }
    out.push({ id: c.id, x: pad.left + rx, y: ry, width: c.width, height: c.height });
    rowsW = Math.max(rowsW, rx + c.width);
    rx += c.width + NODE_GAP;
    rowH = Math.max(rowH, c.height);
  }
  if (rowH) bottom = ry + rowH;
  const contentW = Math.max(maxX - minX, rowsW);
  // edges: orthogonal, turning in the middle of the gaps between layers
  const resEdges: any[] = [];
  chains.forEach((chain, k) => {
    const e = E[k];
    const pts: { x: number; y: number }[] = [];
    const la = layer[e.a];
    const a = chain[0], b = chain[chain.length - 1];
    pts.push({ x: ox + a.x, y: top[la] + (height[la] + a.h) / 2 });
    for (let i = 1; i < chain.length; i++) {
      const l = la + i;
      const mid = top[l] - LAYER_GAP / 2;
      const px = pts[pts.length - 1].x, nx = ox + chain[i].x;
      if (Math.abs(px - nx) > 0.5) { pts.push({ x: px, y: mid }); pts.push({ x: nx, y: mid }); }
      if (i < chain.length - 1) { pts.push({ x: nx, y: top[l] }); pts.push({ x: nx, y: top[l] + height[l] }); }
    }
    const lb = layer[e.b];
    pts.push({ x: ox + b.x, y: top[lb] + (height[lb] - b.h) / 2 });
    const simple = pts.filter((p, i) => i === 0 || i === pts.length - 1 || !(Math.abs(p.x - pts[i - 1].x) < 0.01 && Math.abs(p.x - pts[i + 1].x) < 0.01));
    if (e.rev) simple.reverse();
    const [src, dst] = e.rev ? [children[e.b].id, children[e.a].id] : [children[e.a].id, children[e.b].id];
    resEdges.push({ id: e.id, sources: [src], targets: [dst], sections: [{ startPoint: simple[0], endPoint: simple[simple.length - 1], bendPoints: simple.slice(1, -1) }] });
  });
  return { width: pad.left + contentW + pad.right, height: bottom + pad.bottom, children: out, edges: resEdges };
}
