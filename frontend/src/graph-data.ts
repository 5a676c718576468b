/**
 * The graph as the kernel sent it (PROTOCOL.md `graph` / `delta` / `marks`), with the indices the view
 * needs: children of each scope, and every edge lifted to the direct children of the scope where its
 * two ends meet (their lowest common scope). Edges between sections are not drawn (the backward
 * section reads every forward activation; drawing those would hide everything else).
 *
 * Child ids inside a scope layout: `"n<id>"` for a node, `"s<key>"` for a child scope.
 */

export type NodeRow = [string, string, string, string, string, number, string, string];
export type ScopeRow = [string, string | null, string, string, number, number];

export interface ScopeIndex {
  nodes: number[];
  scopes: string[];
  /** lifted edges between direct children, deduplicated: "a\u0001b" → [a, b] */
  edges: Map<string, [string, string]>;
  /** direct children that receive / send data across this scope's border */
  ins: Set<string>;
  outs: Set<string>;
}

export interface Marks {
  badges: Map<number, string>;
  paused: number;
  error: number;
  path: number[];
  step: string;
}

export const SECTIONS = ['forward', 'backward', 'optimizer'];

export class GraphData {
  rev = -1;
  nodes: NodeRow[] = [];
  scopes = new Map<string, ScopeRow>();
  edges: number[] = [];
  byName = new Map<string, number>();
  index = new Map<string, ScopeIndex>();
  /** the smallest `order` under each scope: children are laid out in execution order */
  firstOrder = new Map<string, number>();
  /** bumped per scope whenever its index changes (layouts cached against it) */
  version = new Map<string, number>();
  marks: Marks = { badges: new Map(), paused: -1, error: -1, path: [], step: '' };
  /**
   * Module call nodes drawn as their own scope: node id → the module's scope key. At `mix` a module's call
   * (`Module.fc.Linear.forward.0`) and the ops it ran are both recorded; the scope box (closed) or frame
   * (open) stands for the call — its edges are the box's — and the call is not drawn again beside its ops.
   */
  moduleOf = new Map<number, string>();
  private chains = new Map<string, string[]>();

  get loaded(): boolean {
    return this.rev >= 0;
  }

  setGraph(msg: any): void {
    this.rev = Number(msg.rev ?? 0);
    this.nodes = (msg.nodes ?? []) as NodeRow[];
    this.scopes = new Map();
    for (const s of (msg.scopes ?? []) as ScopeRow[]) this.scopes.set(s[0], s);
    this.edges = Array.from(msg.edges ?? []) as number[];
    this.rebuild();
  }

  /** Apply a delta; false when its base is not our rev (the caller asks for the whole graph). */
  applyDelta(msg: any): boolean {
    if (!this.loaded || Number(msg.base) !== this.rev) return false;
    for (const row of (msg.nodes ?? []) as NodeRow[]) this.nodes.push(row);
    for (const [id, row] of (msg.changed ?? []) as [number, NodeRow][]) this.nodes[id] = row;
    for (const s of (msg.scopes ?? []) as ScopeRow[]) this.scopes.set(s[0], s);
    for (const e of (msg.edges ?? []) as number[]) this.edges.push(e);
    this.rev = Number(msg.rev);
    this.rebuild();
    // relabelled nodes and recounted scopes change the sizes drawn in their parents
    const bump = (k: string | null) => { if (k !== null) this.version.set(k, (this.version.get(k) ?? 0) + 1); };
    for (const [id] of (msg.changed ?? []) as [number, NodeRow][]) bump(this.scopeOf(id));
    for (const s of (msg.scopes ?? []) as ScopeRow[]) bump(s[1]);
    return true;
  }

  setMarks(msg: any): void {
    const badges = new Map<number, string>();
    for (const [k, v] of Object.entries(msg.badges ?? {})) badges.set(Number(k), String(v));
    this.marks = {
      badges,
      paused: Number(msg.paused ?? -1),
      error: Number(msg.error ?? -1),
      path: Array.from(msg.path ?? []).map(Number),
      step: String(msg.step ?? '')
    };
  }

  /** Scope key of node `id` (its row's scope, or its section root when that scope is unknown). */
  scopeOf(id: number): string {
    const m = this.moduleOf.get(id);
    if (m !== undefined) return m;
    const s = this.nodes[id][3];
    if (this.scopes.has(s)) return s;
    const sec = s.includes(':') ? s.slice(0, s.indexOf(':')) : 'forward';
    return `${sec}:`;
  }

  /** The scope and its ancestors, innermost first. */
  chain(key: string): string[] {
    let c = this.chains.get(key);
    if (c) return c;
    c = [];
    let k: string | null = key;
    const seen = new Set<string>();
    while (k !== null && !seen.has(k)) {
      seen.add(k);
      c.push(k);
      const row = this.scopes.get(k);
      k = row ? row[1] : null;
    }
    this.chains.set(key, c);
    return c;
  }

  sectionOf(key: string): string {
    const c = this.chain(key);
    const root = c[c.length - 1];
    const row = this.scopes.get(root);
    return row ? row[3] || root.replace(/:.*$/, '') : root.replace(/:.*$/, '');
  }

  /** The scopes to open so that node `id` is drawn (its chain, outermost first). */
  scopesAround(id: number): string[] {
    const c = this.chain(this.scopeOf(id)).slice().reverse();
    return this.moduleOf.has(id) ? c.slice(0, -1) : c; // a module call: its box, closed, stands for it
  }

  /** The scope and its ancestors (the rows as sent, before the module calls are known). */
  chainOf(key: string): string[] {
    const c: string[] = [];
    let k: string | null = key;
    while (k !== null && this.scopes.has(k) && !c.includes(k)) {
      c.push(k);
      k = this.scopes.get(k)![1];
    }
    return c;
  }

  private findModuleCalls(): void {
    this.moduleOf = moduleCalls(this);
  }

  private rebuild(): void {
    const old = this.index;
    this.chains = new Map();
    this.byName = new Map();
    this.nodes.forEach((r, i) => {
      this.byName.set(r[0], i);
      if (!r[1]) r[1] = tail(String(r[0]));
    });
    for (const [k, row] of this.scopes) if (!row[2]) row[2] = tail(k);
    this.findModuleCalls();
    // make sure every section root and every scope's parent exists
    for (const sec of SECTIONS) {
      const k = `${sec}:`;
      if (!this.scopes.has(k)) this.scopes.set(k, [k, null, sec, sec, -1, 0]);
    }
    const idx = new Map<string, ScopeIndex>();
    const get = (k: string): ScopeIndex => {
      let s = idx.get(k);
      if (!s) idx.set(k, (s = { nodes: [], scopes: [], edges: new Map(), ins: new Set(), outs: new Set() }));
      return s;
    };
    for (const [k, row] of this.scopes) {
      get(k);
      if (row[1] !== null && this.scopes.has(row[1])) get(row[1]).scopes.push(k);
    }
    const nodeScope: string[] = new Array(this.nodes.length);
    const first = new Map<string, number>();
    for (let i = 0; i < this.nodes.length; i++) {
      nodeScope[i] = this.scopeOf(i);
      if (!this.moduleOf.has(i)) get(nodeScope[i]).nodes.push(i);
      const o = Number(this.nodes[i][5]);
      for (const k of this.chain(nodeScope[i])) {
        const f = first.get(k);
        if (f !== undefined && f <= o) break;
        first.set(k, o);
      }
    }
    this.firstOrder = first;
    const E = this.edges;
    for (let i = 0; i + 1 < E.length; i += 2) {
      const u = E[i], v = E[i + 1];
      if (u === v || u >= this.nodes.length || v >= this.nodes.length) continue;
      const cu = this.chain(nodeScope[u]), cv = this.chain(nodeScope[v]);
      if (cu[cu.length - 1] !== cv[cv.length - 1]) continue; // across sections: not drawn
      // lowest common scope: walk both chains from the root
      let a = cu.length - 1, b = cv.length - 1;
      while (a > 0 && b > 0 && cu[a - 1] === cv[b - 1]) { a--; b--; }
      const lca = cu[a];
      // a module call stands as its scope: an edge between it and its own ops is inside the box (not
      // drawn); any other edge starts or ends at the box, one level up
      const hu = this.moduleOf.has(u), hv = this.moduleOf.has(v);
      if ((hu && a === 0) || (hv && b === 0)) continue;
      const childU = a === 0 ? `n${u}` : `s${cu[a - 1]}`;
      const childV = b === 0 ? `n${v}` : `s${cv[b - 1]}`;
      if (childU !== childV) get(lca).edges.set(`${childU}\u0001${childV}`, [childU, childV]);
      for (let j = hu ? 1 : 0; j < a; j++) get(cu[j]).outs.add(j === 0 ? `n${u}` : `s${cu[j - 1]}`);
      for (let j = hv ? 1 : 0; j < b; j++) get(cv[j]).ins.add(j === 0 ? `n${v}` : `s${cv[j - 1]}`);
    }
    // a scope's version changes when what it holds changes
    for (const [k, s] of idx) {
      const o = old.get(k);
      const same = o && o.nodes.length === s.nodes.length && o.scopes.length === s.scopes.length &&
        o.edges.size === s.edges.size && o.ins.size === s.ins.size && o.outs.size === s.outs.size &&
        sameLabels(this, o, s);
      if (!same) this.version.set(k, (this.version.get(k) ?? 0) + 1);
    }
    this.index = idx;
  }
}

/**
 * Module call nodes drawn as their scope (see `GraphData.moduleOf`): a `Module.<path>.<Class>.<forward|
 * backward>.<n>` node that the kernel put in its own module's scope (`"forward:<path with />"`, done when
 * that scope holds the module's ops), when the scope holds more than the calls.
 */
function moduleCalls(g: GraphData): Map<number, string> {
  const calls = new Map<number, string>();
  const nCalls = new Map<string, number>();
  for (let i = 0; i < g.nodes.length; i++) {
    const k = g.nodes[i][3], name = String(g.nodes[i][0]);
    if (!name.startsWith('Module.')) continue;
    const parts = name.split('.');
    if (parts[0] !== 'Module' || parts.length < 5 || !['forward', 'backward'].includes(parts[parts.length - 2])) continue;
    const sec = k.slice(0, k.indexOf(':'));
    if (k.indexOf(':') < 0 || `${sec}:${parts.slice(1, -3).join('/')}` !== k || !g.scopes.has(k)) continue;
    calls.set(i, k);
    nCalls.set(k, (nCalls.get(k) ?? 0) + 1);
  }
  if (!calls.size) return calls;
  const held = new Map<string, number>(); // scope → nodes in it, all depths
  for (let i = 0; i < g.nodes.length; i++) for (const k of g.chainOf(g.nodes[i][3])) held.set(k, (held.get(k) ?? 0) + 1);
  for (const [i, k] of calls) if ((held.get(k) ?? 0) <= (nCalls.get(k) ?? 0)) calls.delete(i);
  return calls;
}

function sameLabels(g: GraphData, o: ScopeIndex, s: ScopeIndex): boolean {
  for (let i = 0; i < s.nodes.length; i++) if (o.nodes[i] !== s.nodes[i]) return false;
  for (let i = 0; i < s.scopes.length; i++) if (o.scopes[i] !== s.scopes[i]) return false;
  void g;
  return true;
}

/** A label for a row that has none: the name's last part ("GELU.0" of "block.act.GELU.0"). */
function tail(name: string): string {
  const parts = name.split(/[.:/]/).filter(Boolean);
  if (!parts.length) return name;
  const last = parts[parts.length - 1];
  return /^\d+$/.test(last) && parts.length > 1 ? `${parts[parts.length - 2]}.${last}` : last;
}
