/**
 * The graph view: the model's dataflow graph laid out by ELK (layout.ts) and drawn on a canvas
 * (graph-draw.ts), with zoom (wheel), pan (drag), fit / fit-to-selection, a minimap on large graphs,
 * hover cards, search that reveals, section toggles (forward / + backward / + optimizer), and the
 * marks sent by the kernel. See ../PROTOCOL.md for the traits and messages.
 *
 * Click a node: `selected` is set and `{"type": "click"}` sent. Click a collapsed scope: it opens in
 * place; click an open scope's header: it closes (both through the `expanded` trait).
 *
 * For tests and benchmarks the element gets `el.nbdebugGraph`:
 * - `ready`: Promise resolved once the first graph is laid out and drawn;
 * - `idle()`: Promise resolved when no layout is pending (after the last change);
 * - `stats()`: `{visibleNodes, visibleBoxes, visibleItems, layoutMs, drawMs, computedScopes, zoom}`;
 * - `labelBoxes()` / `badgeBoxes()`: screen rects (CSS px, canvas-relative) of what the last frame drew;
 * - `nodeBox(name)`: the drawn box of a node (graph coordinates) or null when hidden;
 *   `screenBox(name)`: the same in canvas px; `scopeBox(key)`: a scope's box or frame in canvas px;
 * - `edgePath(src, dst)`: the drawn polyline `[[x, y], ...]` (graph coordinates) of the edge between
 *   the items standing for the two nodes, or null;
 * - `expand(key)`, `collapse(key)`, `reveal(name)`, `fit()`, `fitSelection()`: Promises that resolve
 *   when the view has been laid out and drawn again;
 * - `zoom(k)` (multiply at the centre), `pan(dx, dy)` (CSS px), `frame()`: draw now, returns ms;
 * - `nodeBoxes()`: `{name: box}` of every node drawn; `edgePaths()`: `[{a, b, pts}]` of every edge drawn
 *   (`a`/`b`: node names, or `s<scope key>` / `in:<key>` / `out:<key>` for boxes and ports);
 * - `scopes()`: the keys of the scope boxes and frames drawn; `traits()`: `{expanded, selected, sections}`;
 * - `camera()`: `{k, tx, ty, W, H}` (screen = graph × k + t); `click(x, y)`: a click at canvas px;
 * - `setFull(on)` / `isFull()`: the full-screen mode (the "Full screen" button; Esc leaves); the grip under
 *   the canvas resizes the pane (saved in the `height` trait);
 * - `hiddenModuleCalls()`: module call nodes drawn as their own scope box (GraphData.moduleOf);
 * - `edgesFrom(name)` / `edgesTo(name)`: the names at the other end of the edges the kernel sent out of /
 *   into a node (a module call's output edges included: ui/graph_edges.py), as the node details list them.
 *
 * Search matches node names, labels and op types, and aliases (`SEARCH_ALIASES`: "softmax" finds
 * `scaled_dot_product_attention`); with no match it says so under the box.
 */
import { WidgetModel } from './model';
import { SECTIONS } from './graph-data';
import { GraphStore, storeFor } from './graph-store';
import { Scene, Item, HEADER, Rect, warmUp } from './layout';
import { Camera, draw, DrawOutput, representative, CLS_COLORS } from './graph-draw';

const STYLE = `
.nbdebug-graph{position:relative;font:12px sans-serif;color:#24292f;border:1px solid #d0d7de;border-radius:6px;overflow:hidden;background:#fff}
.nbdebug-graph .ng-bar{display:flex;gap:6px;align-items:center;padding:4px 6px;border-bottom:1px solid #d0d7de;background:#f6f8fa;flex-wrap:wrap}
.nbdebug-graph .ng-bar button{font:12px sans-serif;padding:2px 8px;border:1px solid #d0d7de;border-radius:4px;background:#fff;cursor:pointer}
.nbdebug-graph .ng-bar button.on{background:#0969da;color:#fff;border-color:#0969da}
.nbdebug-graph .ng-bar input{font:12px sans-serif;padding:2px 6px;border:1px solid #d0d7de;border-radius:4px;width:200px}
.nbdebug-graph .ng-stage{position:relative}
.nbdebug-graph canvas.ng-main{display:block;width:100%;cursor:grab}
.nbdebug-graph canvas.ng-mini{position:absolute;right:8px;bottom:8px;border:1px solid #d0d7de;background:rgba(255,255,255,.92);border-radius:4px;cursor:pointer}
.nbdebug-graph .ng-status{position:absolute;left:8px;bottom:8px;padding:2px 8px;border-radius:4px;background:#fff8c5;border:1px solid #d4a72c;display:none}
.nbdebug-graph .ng-busy{position:absolute;right:8px;top:6px;color:#57606a;display:none}
.nbdebug-graph .ng-card{position:absolute;pointer-events:none;background:#fff;border:1px solid #d0d7de;border-radius:6px;box-shadow:0 4px 12px rgba(0,0,0,.12);padding:6px 8px;display:none;max-width:360px;z-index:3}
.nbdebug-graph .ng-card table{border-collapse:collapse}.nbdebug-graph .ng-card td{padding:1px 6px 1px 0;vertical-align:top}
.nbdebug-graph .ng-card td:first-child{color:#57606a;white-space:nowrap}
.nbdebug-graph .ng-results{position:absolute;z-index:4;background:#fff;border:1px solid #d0d7de;border-radius:4px;max-height:240px;overflow:auto;display:none;box-shadow:0 4px 12px rgba(0,0,0,.12)}
.nbdebug-graph .ng-results div{padding:2px 8px;cursor:pointer;white-space:nowrap}.nbdebug-graph .ng-results div:hover,.nbdebug-graph .ng-results div.cur{background:#ddf4ff}
.nbdebug-graph .ng-results div.ng-nomatch{color:#57606a;cursor:default;font-style:italic}
.nbdebug-graph .ng-grip{height:8px;cursor:ns-resize;background:#f6f8fa;border-top:1px solid #d0d7de}
.nbdebug-graph .ng-grip:hover{background:#ddf4ff}
.nbdebug-graph.ng-fullscreen{position:fixed;left:0;top:0;right:0;bottom:0;z-index:10000;border-radius:0;border:none}
.nbdebug-graph .ng-empty{position:absolute;left:0;right:0;top:40%;text-align:center;color:#57606a}
`;

function ensureStyle(): void {
  if (document.getElementById('nbdebug-graph-style')) return;
  const s = document.createElement('style');
  s.id = 'nbdebug-graph-style';
  s.textContent = STYLE;
  document.head.appendChild(s);
}

const esc = (s: string) => s.replace(/[&<>"]/g, c => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' }[c]!));

class GraphView {
  private store: GraphStore;
  private root: HTMLDivElement;
  private canvas: HTMLCanvasElement;
  private mini: HTMLCanvasElement;
  private card: HTMLDivElement;
  private statusEl: HTMLDivElement;
  private busyEl: HTMLDivElement;
  private emptyEl: HTMLDivElement;
  private results: HTMLDivElement;
  private search: HTMLInputElement;
  private secButtons: HTMLButtonElement[] = [];
  private scene: Scene | null = null;
  private cam: Camera = { k: 1, tx: 20, ty: 30 };
  private W = 600;
  private H = 400;
  private dpr = 1;
  private last: DrawOutput = { labels: [], badges: [], ms: 0 };
  private framePending = false;
  private hover: Item | null = null;
  private hoverTimer = 0;
  private fitted = false;
  private anchor: { ref: string; sx: number; sy: number } | null = null;
  private layoutChain: Promise<void> = Promise.resolve();
  private queued: Promise<void> | null = null;
  private layoutMs = 0;
  private computed = 0;
  private resolveReady!: () => void;
  readonly ready: Promise<void>;
  private cleanups: (() => void)[] = [];
  private miniImage: HTMLCanvasElement | null = null;
  private miniScale = 1;
  private miniOrigin = { x: 0, y: 0 };
  private pendingCenter: string | null = null;
  private measured = false;
  private userMoved = false;
  private full = false;
  private placeholder = document.createElement('div');
  private dragHeight: number | null = null;

  constructor(private model: WidgetModel, private el: HTMLElement) {
    ensureStyle();
    this.store = storeFor(model);
    this.ready = new Promise(r => (this.resolveReady = r));
    el.textContent = '';
    this.root = document.createElement('div');
    this.root.className = 'nbdebug-graph';
    this.root.innerHTML = `<div class="ng-bar">
      <input class="ng-search" type="search" placeholder="Search nodes…" spellcheck="false">
      <span class="ng-secs"></span>
      <button class="ng-fit" title="Fit the graph to the view">Fit</button>
      <button class="ng-fitsel" title="Centre the selected node">Fit selection</button>
      <button class="ng-full" title="Full screen (Esc leaves)">Full screen</button>
    </div><div class="ng-stage"><canvas class="ng-main"></canvas><canvas class="ng-mini"></canvas>
      <div class="ng-status"></div><div class="ng-busy">laying out…</div><div class="ng-empty">waiting for the graph…</div>
      <div class="ng-card"></div></div><div class="ng-grip" title="Drag to resize the graph"></div><div class="ng-results"></div>`;
    el.appendChild(this.root);
    const q = <T extends Element>(s: string) => this.root.querySelector(s) as T;
    this.canvas = q('canvas.ng-main');
    this.mini = q('canvas.ng-mini');
    this.card = q('.ng-card');
    this.statusEl = q('.ng-status');
    this.busyEl = q('.ng-busy');
    this.emptyEl = q('.ng-empty');
    this.results = q('.ng-results');
    this.search = q('.ng-search');
    const secs = q<HTMLSpanElement>('.ng-secs');
    const modes: [string, string[]][] = [['Forward', ['forward']], ['+ Backward', ['forward', 'backward']], ['+ Optimizer', SECTIONS]];
    for (const [text, list] of modes) {
      const b = document.createElement('button');
      b.textContent = text;
      b.dataset.sections = list.join(',');
      b.addEventListener('click', () => this.setTrait('sections', list));
      secs.appendChild(b);
      this.secButtons.push(b);
    }
    q<HTMLButtonElement>('.ng-fit').addEventListener('click', () => this.fit());
    q<HTMLButtonElement>('.ng-fitsel').addEventListener('click', () => this.fitSelection());
    q<HTMLButtonElement>('.ng-full').addEventListener('click', () => this.setFull(!this.full));
    this.bindGrip(q<HTMLDivElement>('.ng-grip'));
    this.bindCanvas();
    this.bindSearch();

    const on = (ev: string, cb: (...a: any[]) => void) => {
      model.on(ev, cb);
      this.cleanups.push(() => model.off(ev, cb));
    };
    on('msg:custom', (msg: any) => this.store.receive(model, msg));
    on('change:expanded', () => this.relayout());
    on('change:sections', () => { this.syncButtons(); this.relayout(); });
    on('change:selected', () => this.requestFrame());
    on('change:status', () => this.syncStatus());
    on('change:height', () => this.resize());
    this.store.views.add(this);
    this.cleanups.push(() => this.store.views.delete(this));
    const ro = new ResizeObserver(() => this.resize());
    ro.observe(this.root);
    this.cleanups.push(() => ro.disconnect());
    this.syncButtons();
    this.syncStatus();
    this.resize();
    (el as any).nbdebugGraph = this.api();
    if (this.store.data.loaded) this.relayout();
    else {
      try { warmUp(); } catch { /* reported by the first layout */ }
      model.send({ type: 'hello', rev: -1 });
    }
  }

  destroy(): void {
    if (this.full) this.setFull(false);
    for (const c of this.cleanups) c();
    window.clearTimeout(this.hoverTimer);
    this.el.textContent = '';
    delete (this.el as any).nbdebugGraph;
  }

  // ---- traits -------------------------------------------------------------------------------------
  private trait<T>(key: string, dflt: T): T {
    const v = this.model.get(key);
    return v === undefined || v === null ? dflt : v;
  }
  private setTrait(key: string, value: unknown): void {
    this.model.set(key, value);
    this.model.save_changes();
  }
  private expanded(): Set<string> {
    return new Set<string>(this.trait<string[]>('expanded', []));
  }
  private sections(): string[] {
    const s = this.trait<string[]>('sections', SECTIONS);
    return SECTIONS.filter(x => s.includes(x));
  }
  private selectedId(): number {
    const n = this.trait<string>('selected', '');
    return n ? this.store.data.byName.get(n) ?? -1 : -1;
  }
  private syncButtons(): void {
    const cur = this.sections().join(',');
    for (const b of this.secButtons) b.classList.toggle('on', b.dataset.sections === cur);
  }
  private syncStatus(): void {
    const s = this.trait<string>('status', 'live');
    const text = s === 'closed' ? 'debugger closed — showing the last graph' : s === 'offline' ? 'offline snapshot' : '';
    this.statusEl.textContent = text;
    this.statusEl.style.display = text ? 'block' : 'none';
    this.root.style.opacity = s === 'closed' ? '0.8' : '1';
  }

  // ---- store events -------------------------------------------------------------------------------
  onData(kind: string, msg: any): void {
    if (kind === 'graph') this.relayout();
    else if (kind === 'marks') this.requestFrame();
    else if (kind === 'card') { if (this.hover && this.hoverName() === String(msg.name)) this.showCard(); }
    else if (kind === 'command') {
      const name = String(msg.name ?? '');
      if (msg.action === 'reveal') void this.reveal(name);
      else if (msg.action === 'fit') this.fit();
      else if (msg.action === 'fit-selection') this.fitSelection();
    }
  }

  // ---- layout -------------------------------------------------------------------------------------
  /** Lay out again (serialised; calls made while one is waiting share it). */
  relayout(): Promise<void> {
    if (this.queued) return this.queued;
    const p = this.layoutChain.then(async () => {
      this.queued = null;
      if (!this.store.data.loaded) return;
      this.busyEl.style.display = 'block';
      const t0 = performance.now();
      try {
        const scene = await this.store.layouts.run(this.expanded(), this.sections());
        this.layoutMs = performance.now() - t0;
        this.computed = scene.computed.length;
        this.setScene(scene);
      } catch (e) {
        this.statusEl.textContent = `layout failed: ${e}`;
        this.statusEl.style.display = 'block';
      } finally {
        this.busyEl.style.display = 'none';
      }
    });
    this.queued = p;
    this.layoutChain = p;
    return p;
  }

  private setScene(scene: Scene): void {
    this.scene = scene;
    this.emptyEl.style.display = scene.items.length ? 'none' : 'block';
    this.emptyEl.textContent = 'no nodes in the sections shown';
    if (this.anchor) {
      const it = scene.byRef.get(this.anchor.ref);
      if (it) {
        this.cam.tx = this.anchor.sx - it.x * this.cam.k;
        this.cam.ty = this.anchor.sy - it.y * this.cam.k;
      }
      this.anchor = null;
    }
    if (this.pendingCenter !== null) {
      this.centerOn(this.pendingCenter);
      this.pendingCenter = null;
    } else if (!this.fitted) {
      this.fitted = true;
      const sel = this.selectedId();
      if (sel >= 0 && representative(scene, this.store.data, sel)) this.fitSelection(false);
      else this.initialView();
    }
    this.buildMini();
    this.frame();
    this.resolveReady();
  }

  // ---- pane size: resizable, full screen -----------------------------------------------------------
  /** Full screen: the graph covers the window (Esc or the button leaves); the view keeps its centre. */
  setFull(on: boolean): void {
    if (on === this.full) return;
    const cx = (this.W / 2 - this.cam.tx) / this.cam.k, cy = (this.H / 2 - this.cam.ty) / this.cam.k;
    this.full = on;
    // on the page's body while full: no notebook ancestor (a transform, `contain`) clips a fixed element
    this.placeholder.style.height = `${this.root.offsetHeight}px`;
    if (on) this.el.replaceChildren(this.placeholder), document.body.appendChild(this.root);
    else this.el.replaceChildren(this.root);
    this.root.classList.toggle('ng-fullscreen', on);
    (this.root.querySelector('.ng-full') as HTMLElement).classList.toggle('on', on);
    (this.root.querySelector('.ng-full') as HTMLElement).textContent = on ? 'Leave full screen' : 'Full screen';
    this.resize();
    this.cam.tx = this.W / 2 - cx * this.cam.k;
    this.cam.ty = this.H / 2 - cy * this.cam.k;
    this.frame();
  }
  /** The grip under the canvas: drag to make the pane taller or shorter (saved in the `height` trait). */
  private bindGrip(grip: HTMLDivElement): void {
    let y0 = 0, h0 = 0;
    const move = (e: PointerEvent) => {
      this.dragHeight = Math.max(160, Math.round(h0 + e.clientY - y0));
      this.resize();
    };
    const up = () => {
      window.removeEventListener('pointermove', move);
      window.removeEventListener('pointerup', up);
      if (this.dragHeight !== null) this.setTrait('height', this.dragHeight);
      this.dragHeight = null;
    };
    grip.addEventListener('pointerdown', e => {
      e.preventDefault();
      y0 = e.clientY;
      h0 = Number(this.trait<number>('height', 420)) || 420;
      window.addEventListener('pointermove', move);
      window.addEventListener('pointerup', up);
    });
    const esc = (e: KeyboardEvent) => { if (e.key === 'Escape' && this.full) this.setFull(false); };
    window.addEventListener('keydown', esc);
    this.cleanups.push(() => window.removeEventListener('keydown', esc));
    const win = () => { if (this.full) this.resize(); };
    window.addEventListener('resize', win);
    this.cleanups.push(() => window.removeEventListener('resize', win));
  }

  // ---- camera -------------------------------------------------------------------------------------
  private resize(): void {
    const grip = 8;
    const h = this.full ? window.innerHeight - grip
      : this.dragHeight ?? (Number(this.trait<number>('height', 420)) || 420);
    const bar = (this.root.querySelector('.ng-bar') as HTMLElement).offsetHeight || 30;
    const H = Math.max(120, h - bar);
    const W = Math.max(120, this.root.clientWidth || this.el.clientWidth || 600);
    this.dpr = window.devicePixelRatio || 1;
    if (W === this.W && H === this.H && this.canvas.width === Math.round(W * this.dpr)) return;
    this.W = W;
    this.H = H;
    this.canvas.style.height = `${H}px`;
    this.canvas.width = Math.round(W * this.dpr);
    this.canvas.height = Math.round(H * this.dpr);
    // first drawn while not in the page (no width yet): frame it again now that it has one
    const measured = this.root.clientWidth > 0;
    if (measured && !this.measured && this.scene && !this.userMoved) {
      const sel = this.selectedId();
      if (sel >= 0 && representative(this.scene, this.store.data, sel)) this.fitSelection(false);
      else this.initialView();
    }
    this.measured = this.measured || measured;
    this.frame();
  }

  private fitRect(r: Rect, maxK: number): void {
    const m = 24;
    const k = Math.min((this.W - 2 * m) / Math.max(r.w, 1), (this.H - 2 * m - 16) / Math.max(r.h, 1), maxK);
    this.cam.k = Math.max(k, 0.005);
    this.cam.tx = this.W / 2 - (r.x + r.w / 2) * this.cam.k;
    this.cam.ty = (this.H + 16) / 2 - (r.y + r.h / 2) * this.cam.k;
  }
  fit(draw = true): void {
    if (!this.scene) return;
    this.fitRect(this.scene.bounds, 1.25);
    if (draw) this.frame();
  }
  /** Fit the whole graph when that leaves it readable; else a readable zoom, from the top. */
  private initialView(): void {
    const b = this.scene!.bounds;
    this.fitRect(b, 1.25);
    if (this.cam.k >= 0.55) return;
    const k = Math.max(this.cam.k, Math.min(0.8, (this.W - 48) / b.w));
    this.cam.k = k;
    this.cam.tx = b.w * k < this.W - 48 ? this.W / 2 - (b.x + b.w / 2) * k : 24 - b.x * k;
    this.cam.ty = 34 - b.y * k;
  }
  fitSelection(draw = true): void {
    if (!this.scene) return;
    const it = representative(this.scene, this.store.data, this.selectedId());
    if (!it) return;
    const ctx = { x: it.x - it.w * 2, y: it.y - it.h * 4, w: it.w * 5, h: it.h * 9 };
    this.fitRect(ctx, 1.6);
    if (draw) this.frame();
  }
  private centerOn(name: string): void {
    const id = this.store.data.byName.get(name);
    if (id === undefined || !this.scene) return;
    const it = representative(this.scene, this.store.data, id);
    if (!it) return;
    if (this.cam.k < 0.9) this.cam.k = 1.2;
    this.cam.tx = this.W / 2 - (it.x + it.w / 2) * this.cam.k;
    this.cam.ty = this.H / 2 - (it.y + it.h / 2) * this.cam.k;
  }
  zoomAt(f: number, x: number, y: number): void {
    const k = Math.min(8, Math.max(0.002, this.cam.k * f));
    const r = k / this.cam.k;
    this.cam.tx = x - (x - this.cam.tx) * r;
    this.cam.ty = y - (y - this.cam.ty) * r;
    this.cam.k = k;
    this.requestFrame();
  }

  // ---- drawing ------------------------------------------------------------------------------------
  requestFrame(): void {
    if (this.framePending) return;
    this.framePending = true;
    requestAnimationFrame(() => {
      this.framePending = false;
      this.frame();
    });
  }
  frame(): number {
    const ctx = this.canvas.getContext('2d');
    if (!ctx || !this.scene) return 0;
    this.last = draw(ctx, {
      scene: this.scene, data: this.store.data, cam: this.cam, W: this.W, H: this.H, dpr: this.dpr,
      selected: this.selectedId(), hover: this.hover
    });
    this.drawMini();
    return this.last.ms;
  }

  private buildMini(): void {
    const s = this.scene!;
    const b = s.bounds;
    const fitK = Math.min(this.W / b.w, this.H / b.h);
    const show = s.items.length > 120 || fitK < 0.35;
    this.mini.style.display = show ? 'block' : 'none';
    if (!show) { this.miniImage = null; return; }
    const MW = 180, MH = 120;
    const k = Math.min(MW / b.w, MH / b.h);
    const w = Math.max(20, Math.round(b.w * k)), h = Math.max(20, Math.round(b.h * k));
    this.mini.width = w * this.dpr;
    this.mini.height = h * this.dpr;
    this.mini.style.width = `${w}px`;
    this.mini.style.height = `${h}px`;
    this.miniScale = k;
    this.miniOrigin = { x: b.x, y: b.y };
    const img = document.createElement('canvas');
    img.width = this.mini.width;
    img.height = this.mini.height;
    const c = img.getContext('2d')!;
    c.setTransform(k * this.dpr, 0, 0, k * this.dpr, -b.x * k * this.dpr, -b.y * k * this.dpr);
    for (const it of s.items) {
      if (it.kind === 'frame') {
        c.strokeStyle = 'rgba(87,96,106,0.5)';
        c.lineWidth = 1 / (k * this.dpr);
        c.strokeRect(it.x, it.y, it.w, it.h);
      } else if (it.kind !== 'port') {
        c.fillStyle = it.kind === 'box' ? '#8c959f' : (CLS_COLORS[this.store.data.nodes[it.id][2]] ?? CLS_COLORS.op)[1];
        c.fillRect(it.x, it.y, Math.max(it.w, 2 / k), Math.max(it.h, 2 / k));
      }
    }
    this.miniImage = img;
  }
  private drawMini(): void {
    if (!this.miniImage) return;
    const c = this.mini.getContext('2d')!;
    c.setTransform(1, 0, 0, 1, 0, 0);
    c.clearRect(0, 0, this.mini.width, this.mini.height);
    c.drawImage(this.miniImage, 0, 0);
    const k = this.miniScale * this.dpr, { k: ck, tx, ty } = this.cam;
    c.strokeStyle = '#0969da';
    c.lineWidth = 1.5;
    c.strokeRect((-tx / ck - this.miniOrigin.x) * k, (-ty / ck - this.miniOrigin.y) * k, (this.W / ck) * k, (this.H / ck) * k);
  }

  // ---- picking and input --------------------------------------------------------------------------
  private pick(x: number, y: number): { item: Item; header: boolean } | null {
    if (!this.scene) return null;
    const wx = (x - this.cam.tx) / this.cam.k, wy = (y - this.cam.ty) / this.cam.k;
    const items = this.scene.items;
    let frame: Item | null = null;
    for (let i = items.length - 1; i >= 0; i--) {
      const it = items[i];
      if (wx < it.x || wx > it.x + it.w || wy < it.y || wy > it.y + it.h) continue;
      if (it.kind === 'frame') { if (!frame || it.depth > frame.depth) frame = it; continue; }
      if (it.kind === 'port') continue;
      return { item: it, header: false };
    }
    if (frame) return { item: frame, header: wy <= frame.y + HEADER };
    return null;
  }

  private hoverName(): string {
    const h = this.hover;
    if (!h) return '';
    return h.kind === 'node' ? this.store.data.nodes[h.id][0] : h.key;
  }

  private showCard(): void {
    const h = this.hover;
    if (!h || !this.scene) { this.card.style.display = 'none'; return; }
    const d = this.store.data;
    let title: string, rows: [string, string][];
    if (h.kind === 'node') {
      const r = d.nodes[h.id];
      title = r[0];
      rows = [['type', r[4] || r[2]], ['class', r[2]]];
      if (r[6]) rows.push(['shape', r[6]]);
      if (r[7]) rows.push(['dtype', r[7]]);
      const badge = d.marks.badges.get(h.id);
      if (badge) rows.push(['hits', badge]);
      for (const row of this.store.cards.get(r[0]) ?? []) if (!rows.some(x => x[0] === row[0] && x[1] === row[1])) rows.push(row);
    } else {
      const s = d.scopes.get(h.key);
      title = s?.[2] ?? h.key;
      rows = [['scope', h.key], ['nodes', String(s?.[5] ?? 0)], ['', h.kind === 'box' ? 'click to open' : 'click the header to close']];
    }
    this.card.innerHTML = `<b>${esc(title)}</b><table>${rows.map(([a, b]) => `<tr><td>${esc(a)}</td><td>${esc(b)}</td></tr>`).join('')}</table>`;
    const sx = (h.x + h.w) * this.cam.k + this.cam.tx + 8, sy = h.y * this.cam.k + this.cam.ty;
    this.card.style.display = 'block';
    const cw = this.card.offsetWidth, ch = this.card.offsetHeight;
    this.card.style.left = `${Math.max(4, Math.min(sx, this.W - cw - 4))}px`;
    this.card.style.top = `${Math.max(4, Math.min(sy, this.H - ch - 4))}px`;
  }

  private setHover(it: Item | null): void {
    if (it === this.hover) return;
    this.hover = it;
    window.clearTimeout(this.hoverTimer);
    this.card.style.display = 'none';
    this.requestFrame();
    if (!it || it.kind === 'port') return;
    this.hoverTimer = window.setTimeout(() => {
      this.showCard();
      if (it.kind === 'node') this.model.send({ type: 'hover', name: this.store.data.nodes[it.id][0] });
    }, 180);
  }

  private bindCanvas(): void {
    const c = this.canvas;
    let down: { x: number; y: number; tx: number; ty: number; moved: boolean } | null = null;
    const local = (e: MouseEvent) => { const r = c.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
    const onDown = (e: MouseEvent) => {
      if (e.button !== 0) return;
      const [x, y] = local(e);
      down = { x, y, tx: this.cam.tx, ty: this.cam.ty, moved: false };
      c.style.cursor = 'grabbing';
    };
    const onMove = (e: MouseEvent) => {
      const [x, y] = local(e);
      if (down) {
        if (Math.abs(x - down.x) + Math.abs(y - down.y) > 3) down.moved = true;
        if (down.moved) {
          this.userMoved = true;
          this.cam.tx = down.tx + x - down.x;
          this.cam.ty = down.ty + y - down.y;
          this.setHover(null);
          this.requestFrame();
        }
        return;
      }
      const p = this.pick(x, y);
      this.setHover(p && p.item.kind !== 'frame' ? p.item : p && p.header && p.item.depth > 0 ? p.item : null);
      c.style.cursor = p && (p.item.kind !== 'frame' || (p.header && p.item.depth > 0)) ? 'pointer' : 'grab';
    };
    const onUp = (e: MouseEvent) => {
      if (!down) return;
      const d = down;
      down = null;
      c.style.cursor = 'grab';
      if (d.moved) return;
      const [x, y] = local(e);
      this.clickAt(x, y);
    };
    const onWheel = (e: WheelEvent) => {
      e.preventDefault();
      this.userMoved = true;
      const [x, y] = local(e);
      const dy = e.deltaMode === 1 ? e.deltaY * 16 : e.deltaY;
      this.zoomAt(Math.exp(-dy * 0.0015), x, y);
    };
    const onLeave = () => this.setHover(null);
    c.addEventListener('mousedown', onDown);
    window.addEventListener('mousemove', onMove);
    window.addEventListener('mouseup', onUp);
    c.addEventListener('wheel', onWheel, { passive: false });
    c.addEventListener('mouseleave', onLeave);
    this.cleanups.push(() => {
      window.removeEventListener('mousemove', onMove);
      window.removeEventListener('mouseup', onUp);
    });
    // minimap: click or drag to move the view there
    let miniDown = false;
    const miniMove = (e: MouseEvent) => {
      const r = this.mini.getBoundingClientRect();
      const wx = (e.clientX - r.left) / this.miniScale + this.miniOrigin.x;
      const wy = (e.clientY - r.top) / this.miniScale + this.miniOrigin.y;
      this.cam.tx = this.W / 2 - wx * this.cam.k;
      this.cam.ty = this.H / 2 - wy * this.cam.k;
      this.requestFrame();
    };
    this.mini.addEventListener('mousedown', e => { e.stopPropagation(); miniDown = true; miniMove(e); });
    this.mini.addEventListener('mousemove', e => { if (miniDown) miniMove(e); });
    const miniUp = () => { miniDown = false; };
    window.addEventListener('mouseup', miniUp);
    this.cleanups.push(() => window.removeEventListener('mouseup', miniUp));
  }

  /** What a click at canvas point (x, y) does. */
  clickAt(x: number, y: number): void {
    const p = this.pick(x, y);
    if (!p) return;
    const it = p.item;
    if (it.kind === 'node') {
      const name = this.store.data.nodes[it.id][0];
      this.setTrait('selected', name);
      this.model.send({ type: 'click', name });
      this.requestFrame();
    } else if (it.kind === 'box') void this.toggle(it.key, true);
    else if (it.kind === 'frame' && p.header && it.depth > 0) void this.toggle(it.key, false);
  }

  /** Open or close scope `key` in place (the item stays where it was on the screen). */
  toggle(key: string, open: boolean): Promise<void> {
    const ex = this.expanded();
    if (ex.has(key) === open) return this.relayout();
    const it = this.scene?.byRef.get(`s${key}`);
    if (it) this.anchor = { ref: `s${key}`, sx: it.x * this.cam.k + this.cam.tx, sy: it.y * this.cam.k + this.cam.ty };
    if (open) ex.add(key);
    else ex.delete(key); // scopes open inside stay open for the next time
    this.setTrait('expanded', [...ex]);
    return this.relayout();
  }

  /** Open the scopes around `name` (and its section), select it and centre it. */
  reveal(name: string): Promise<void> {
    const d = this.store.data;
    const id = d.byName.get(name);
    if (id === undefined) return Promise.resolve();
    const sec = d.sectionOf(d.scopeOf(id));
    const secs = this.sections();
    if (!secs.includes(sec)) this.setTrait('sections', SECTIONS.filter(s => s === sec || secs.includes(s)));
    const ex = this.expanded();
    const before = ex.size;
    for (const k of d.scopesAround(id)) if (d.scopes.get(k)?.[1] !== null) ex.add(k);
    if (ex.size !== before) this.setTrait('expanded', [...ex]);
    this.setTrait('selected', name);
    this.pendingCenter = name;
    return this.relayout();
  }

  // ---- search -------------------------------------------------------------------------------------
  private bindSearch(): void {
    let matches: number[] = [];
    let cur = 0;
    const close = () => { this.results.style.display = 'none'; };
    const go = (i: number) => {
      const id = matches[i];
      if (id === undefined) return;
      close();
      void this.reveal(this.store.data.nodes[id][0]);
    };
    const render = () => {
      const q = this.search.value.trim();
      if (q && !matches.length) {
        this.results.innerHTML = `<div class="ng-nomatch">no node matches “${esc(q)}” (names, op types)</div>`;
      } else this.results.innerHTML = matches.map((id, i) => {
        const r = this.store.data.nodes[id];
        return `<div data-i="${i}" class="${i === cur ? 'cur' : ''}">${esc(r[0])} <span style="color:#57606a">${esc(r[4] || r[2])}</span></div>`;
      }).join('');
      const sr = this.search.getBoundingClientRect(), rr = this.root.getBoundingClientRect();
      this.results.style.left = `${sr.left - rr.left}px`;
      this.results.style.top = `${sr.bottom - rr.top + 2}px`;
      this.results.style.display = matches.length || q ? 'block' : 'none';
    };
    this.search.addEventListener('input', () => {
      matches = searchNodes(this.store.data.nodes, this.search.value, 50);
      cur = 0;
      render();
    });
    this.search.addEventListener('keydown', e => {
      if (e.key === 'Enter') { e.preventDefault(); go(cur); }
      else if (e.key === 'ArrowDown') { cur = Math.min(matches.length - 1, cur + 1); render(); e.preventDefault(); }
      else if (e.key === 'ArrowUp') { cur = Math.max(0, cur - 1); render(); e.preventDefault(); }
      else if (e.key === 'Escape') close();
    });
    this.results.addEventListener('mousedown', e => {
      const t = (e.target as HTMLElement).closest('[data-i]') as HTMLElement | null;
      if (t) { e.preventDefault(); go(Number(t.dataset.i)); }
    });
    this.search.addEventListener('blur', () => window.setTimeout(close, 150));
  }

  // ---- test / benchmark API -----------------------------------------------------------------------
  private api(): Record<string, unknown> {
    const d = () => this.store.data;
    const boxOf = (name: string) => {
      const id = d().byName.get(name);
      if (id === undefined || !this.scene) return null;
      const it = this.scene.byRef.get(`n${id}`);
      return it ? { x: it.x, y: it.y, w: it.w, h: it.h } : null;
    };
    return {
      ready: this.ready,
      idle: () => this.relayoutIdle(),
      stats: () => {
        const items = this.scene?.items ?? [];
        return {
          visibleNodes: items.filter(i => i.kind === 'node').length,
          visibleBoxes: items.filter(i => i.kind === 'box').length,
          visibleItems: items.length,
          layoutMs: this.layoutMs,
          drawMs: this.last.ms,
          computedScopes: this.computed,
          zoom: this.cam.k,
          minimap: this.mini.style.display !== 'none'
        };
      },
      labelBoxes: () => this.last.labels.map(r => ({ ...r })),
      badgeBoxes: () => this.last.badges.map(r => ({ ...r })),
      nodeBox: boxOf,
      screenBox: (name: string) => {
        const b = boxOf(name);
        if (!b) return null;
        const { k, tx, ty } = this.cam;
        return { x: b.x * k + tx, y: b.y * k + ty, w: b.w * k, h: b.h * k };
      },
      edgePath: (src: string, dst: string) => {
        const a = d().byName.get(src), b = d().byName.get(dst);
        if (a === undefined || b === undefined || !this.scene) return null;
        const ra = representative(this.scene, d(), a), rb = representative(this.scene, d(), b);
        if (!ra || !rb) return null;
        const refA = ra.kind === 'node' ? `n${ra.id}` : `s${ra.key}`, refB = rb.kind === 'node' ? `n${rb.id}` : `s${rb.key}`;
        const e = this.scene.edges.find(x => x.a === refA && x.b === refB);
        if (!e) return null;
        const out: [number, number][] = [];
        for (let i = 0; i < e.pts.length; i += 2) out.push([e.pts[i], e.pts[i + 1]]);
        return out;
      },
      scopeBox: (key: string) => {
        const it = this.scene?.byRef.get(`s${key}`);
        if (!it) return null;
        const { k, tx, ty } = this.cam;
        return { x: it.x * k + tx, y: it.y * k + ty, w: it.w * k, h: it.h * k, open: it.kind === 'frame' };
      },
      nodeBoxes: () => {
        const out: Record<string, Rect> = {};
        for (const it of this.scene?.items ?? []) if (it.kind === 'node') out[d().nodes[it.id][0]] = { x: it.x, y: it.y, w: it.w, h: it.h };
        return out;
      },
      edgePaths: () => (this.scene?.edges ?? []).map(e => {
        const name = (r: string) => (r[0] === 'n' ? d().nodes[Number(r.slice(1))][0] : r);
        const pts: [number, number][] = [];
        for (let i = 0; i < e.pts.length; i += 2) pts.push([e.pts[i], e.pts[i + 1]]);
        return { a: name(e.a), b: name(e.b), pts };
      }),
      scopes: () => (this.scene?.items ?? []).filter(i => i.kind === 'box' || i.kind === 'frame').map(i => i.key),
      expand: (key: string) => this.toggle(key, true),
      collapse: (key: string) => this.toggle(key, false),
      reveal: (name: string) => this.reveal(name),
      fit: () => { this.fit(); return Promise.resolve(); },
      fitSelection: () => { this.fitSelection(); return Promise.resolve(); },
      zoom: (k: number) => { this.zoomAt(k, this.W / 2, this.H / 2); return this.frame(); },
      pan: (dx: number, dy: number) => { this.cam.tx += dx; this.cam.ty += dy; return this.frame(); },
      frame: () => this.frame(),
      camera: () => ({ ...this.cam, W: this.W, H: this.H }),
      traits: () => ({ expanded: [...this.expanded()], selected: this.trait('selected', ''), sections: this.sections() }),
      click: (x: number, y: number) => this.clickAt(x, y),
      setFull: (on: boolean) => { this.setFull(on); return Promise.resolve(); },
      isFull: () => this.full,
      hiddenModuleCalls: () => [...d().moduleOf.keys()].map(i => d().nodes[i][0]),
      edgesFrom: (name: string) => this.edgeEnds(name, 0),
      edgesTo: (name: string) => this.edgeEnds(name, 1)
    };
  }
  /** Names at the other end of the edges sent with node `name` at end `end` (0: out of it, 1: into it). */
  private edgeEnds(name: string, end: 0 | 1): string[] {
    const d = this.store.data, id = d.byName.get(name), out = new Set<string>();
    if (id === undefined) return [];
    for (let i = 0; i + 1 < d.edges.length; i += 2) if (d.edges[i + end] === id) out.add(d.nodes[d.edges[i + 1 - end]][0]);
    return [...out].sort();
  }
  private relayoutIdle(): Promise<void> {
    return this.layoutChain.then(() => (this.queued ? this.relayoutIdle() : undefined));
  }
}

/**
 * What a search word also means: an op searched by what it computes finds the fused op that does it
 * (`softmax` finds `scaled_dot_product_attention` in SDPA models, `gelu` a fused GELU, …).
 */
export const SEARCH_ALIASES: Record<string, string[]> = {
  softmax: ['scaled_dot_product_attention', 'sdpa', 'flash_attention', 'efficient_attention', 'attention'],
  attention: ['scaled_dot_product_attention', 'sdpa', 'attn', 'multi_head_attention'],
  sdpa: ['scaled_dot_product_attention'],
  matmul: ['mm', 'bmm', 'addmm', 'linear', 'baddbmm', 'einsum', 'batchmatmul'],
  layernorm: ['layer_norm', 'native_layer_norm', 'rms_norm'],
  layer_norm: ['layernorm', 'native_layer_norm', 'rms_norm'],
  dropout: ['native_dropout', 'dropout_'],
  relu: ['relu_', 'threshold'],
  gelu: ['gelu_', 'fast_gelu'],
  loss: ['cross_entropy', 'nll_loss', 'mse_loss', 'l1_loss', 'binary_cross_entropy'],
  embedding: ['embedding', 'gather']
};

/**
 * Indices of the nodes that match `query` (case-insensitive): in the name, the label or the op type, or an
 * alias of the word (see `SEARCH_ALIASES`); direct matches first, at most `limit`.
 */
export function searchNodes(nodes: string[][] | any[], query: string, limit = 50): number[] {
  const q = query.trim().toLowerCase();
  if (!q) return [];
  const words = [q, ...(SEARCH_ALIASES[q] ?? [])];
  const hit = (r: any[], ws: string[]) => {
    const name = String(r[0]).toLowerCase(), label = String(r[1] ?? '').toLowerCase(), op = String(r[4] ?? '').toLowerCase();
    return ws.some(w => name.includes(w) || label.includes(w) || op.includes(w));
  };
  const out: number[] = [];
  for (let i = 0; i < nodes.length && out.length < limit; i++) if (hit(nodes[i], [q])) out.push(i);
  if (words.length > 1) {
    const seen = new Set(out);
    for (let i = 0; i < nodes.length && out.length < limit; i++) if (!seen.has(i) && hit(nodes[i], words.slice(1))) out.push(i);
  }
  return out;
}

export function renderGraph(model: WidgetModel, el: HTMLElement): () => void {
  const v = new GraphView(model, el);
  return () => v.destroy();
}
