/**
 * Canvas 2D drawing of a laid-out scene (layout.ts): scope frames, edges with arrowheads, nodes
 * coloured by `cls`, collapsed scope boxes, marks (badges, paused ring, error, path, selection) and
 * level-of-detail labels. A label is drawn only when its font is readable at the current zoom and its
 * screen box collides with no label drawn before it (outer scopes and marked nodes first), so labels
 * never overlap; names appear as you zoom in. Only what intersects the viewport is drawn.
 */
import { GraphData } from './graph-data';
import { Scene, Item, Rect, HEADER, NODE_FONT, BOX_FONT, textWidth, countText } from './layout';

export interface Camera { k: number; tx: number; ty: number }

export const CLS_COLORS: Record<string, [string, string]> = {
  op: ['#e3edfc', '#4a78c2'],
  module: ['#fff1dc', '#c27c1e'],
  parameter: ['#e2f4e6', '#2f8a4c'],
  gradient: ['#fbe6f1', '#b0407f'],
  optimizer: ['#efe7fa', '#7450b0'],
  input: ['#ececec', '#5f6368']
};
const SECTION_FILL: Record<string, string> = { forward: '#f6f8fb', backward: '#fbf6f8', optimizer: '#f8f6fc' };
const SECTION_EDGE: Record<string, string> = { forward: '#9fb3cf', backward: '#cf9fb8', optimizer: '#b3a3d6' };

export interface DrawInput {
  scene: Scene;
  data: GraphData;
  cam: Camera;
  W: number;
  H: number;
  dpr: number;
  selected: number;
  hover: Item | null;
}
export interface DrawOutput {
  labels: (Rect & { text: string })[];
  badges: (Rect & { text: string; ref: string })[];
  ms: number;
}

/** The item that stands for node `id`: itself, or the collapsed scope box holding it. */
export function representative(scene: Scene, data: GraphData, id: number): Item | null {
  if (id < 0 || id >= data.nodes.length) return null;
  const it = scene.byRef.get(`n${id}`);
  if (it) return it;
  const own = data.moduleOf.get(id); // a module call: its scope, closed or open, stands for it
  if (own !== undefined && scene.byRef.get(`s${own}`)) return scene.byRef.get(`s${own}`)!;
  for (const k of data.chain(data.scopeOf(id))) {
    const b = scene.byRef.get(`s${k}`);
    if (b) return b.kind === 'box' ? b : null;
  }
  return null;
}

export function refOf(it: Item): string {
  return it.kind === 'node' ? `n${it.id}` : it.kind === 'port' ? it.key : `s${it.key}`;
}

class LabelGrid {
  private cells = new Map<number, Rect[]>();
  boxes: (Rect & { text: string })[] = [];
  private static S = 64;
  private keys(r: Rect): number[] {
    const S = LabelGrid.S, out: number[] = [];
    for (let gx = Math.floor(r.x / S); gx <= Math.floor((r.x + r.w) / S); gx++)
      for (let gy = Math.floor(r.y / S); gy <= Math.floor((r.y + r.h) / S); gy++) out.push(gx * 100003 + gy);
    return out;
  }
  tryAdd(r: Rect, text: string): boolean {
    const ks = this.keys(r);
    for (const k of ks) for (const o of this.cells.get(k) ?? [])
      if (r.x < o.x + o.w && o.x < r.x + r.w && r.y < o.y + o.h && o.y < r.y + r.h) return false;
    for (const k of ks) {
      let c = this.cells.get(k);
      if (!c) this.cells.set(k, (c = []));
      c.push(r);
    }
    this.boxes.push({ ...r, text });
    return true;
  }
}

/** `text` cut to fit `avail` px at `font` scaled by `k` (null when not even 3 characters fit). */
function fit(text: string, font: string, k: number, avail: number): [string, number] | null {
  const tw = textWidth(text, font) * k;
  if (tw <= avail) return [text, tw];
  const n = Math.floor((text.length * avail) / tw) - 1;
  if (n < 3) return null;
  // dotted / slashed paths keep their tail (the informative end: "…attn.c_attn.weight")
  const t = /[./]/.test(text.slice(0, -1)) ? '…' + text.slice(text.length - n) : text.slice(0, n) + '…';
  return [t, Math.min(avail, textWidth(t, font) * k)];
}

export function draw(ctx: CanvasRenderingContext2D, inp: DrawInput): DrawOutput {
  const t0 = performance.now();
  const { scene, data, cam, W, H, dpr } = inp;
  const { k, tx, ty } = cam;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, W, H);
  ctx.fillStyle = '#ffffff';
  ctx.fillRect(0, 0, W, H);
  // the viewport in graph coordinates
  const vx0 = -tx / k, vy0 = -ty / k, vx1 = (W - tx) / k, vy1 = (H - ty) / k;
  const visible = (r: Rect) => r.x < vx1 && r.x + r.w > vx0 && r.y < vy1 && r.y + r.h > vy0;
  const world = () => ctx.setTransform(dpr * k, 0, 0, dpr * k, dpr * tx, dpr * ty);
  const screen = () => ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  const marks = data.marks;

  // marks by the item that shows them
  const badgeOf = new Map<Item, string[]>();
  for (const [id, text] of marks.badges) {
    const r = representative(scene, data, id);
    if (r) { const l = badgeOf.get(r) ?? []; l.push(text); badgeOf.set(r, l); }
  }
  const paused = representative(scene, data, marks.paused);
  const error = representative(scene, data, marks.error);
  const selected = representative(scene, data, inp.selected);
  const pathItems = new Set<Item>();
  const pathPairs = new Set<string>();
  let prev: Item | null = null;
  for (const id of marks.path) {
    const r = representative(scene, data, id);
    if (r) pathItems.add(r);
    if (r && prev && r !== prev) { pathPairs.add(`${refOf(prev)}>${refOf(r)}`); pathPairs.add(`${refOf(r)}>${refOf(prev)}`); }
    if (r) prev = r;
  }

  world();
  // 1. scope frames, outermost first
  const frames = scene.items.filter(it => it.kind === 'frame' && visible(it));
  for (const f of frames) {
    const sec = data.sectionOf(f.key);
    ctx.fillStyle = f.depth === 0 ? SECTION_FILL[sec] ?? '#f6f8fa' : 'rgba(80,100,140,0.045)';
    ctx.strokeStyle = SECTION_EDGE[sec] ?? '#b0b8c4';
    ctx.lineWidth = (f.depth === 0 ? 1.5 : 1) / k;
    ctx.beginPath();
    ctx.roundRect(f.x, f.y, f.w, f.h, 8);
    ctx.fill();
    ctx.stroke();
    if (f.depth > 0) {
      ctx.fillStyle = 'rgba(80,100,140,0.07)';
      ctx.beginPath();
      ctx.roundRect(f.x, f.y, f.w, HEADER, [8, 8, 0, 0]);
      ctx.fill();
    }
  }

  // 2. edges (one path for the plain ones, one for the highlighted path)
  const plain = new Path2D(), hot = new Path2D();
  const heads: [number, number, number, number, boolean][] = [];
  for (const e of scene.edges) {
    if (e.maxX < vx0 || e.minX > vx1 || e.maxY < vy0 || e.minY > vy1) continue;
    const isHot = pathPairs.has(`${e.a}>${e.b}`);
    const p = isHot ? hot : plain;
    const q = e.pts;
    p.moveTo(q[0], q[1]);
    for (let i = 2; i < q.length; i += 2) p.lineTo(q[i], q[i + 1]);
    if (!e.b.startsWith('out:')) heads.push([q[q.length - 4], q[q.length - 3], q[q.length - 2], q[q.length - 1], isHot]);
  }
  ctx.lineJoin = 'round';
  ctx.strokeStyle = '#8c959f';
  ctx.lineWidth = Math.max(1 / k, 0.6);
  ctx.stroke(plain);
  ctx.strokeStyle = '#f77f00';
  ctx.lineWidth = 3 / k;
  ctx.stroke(hot);
  if (k > 0.25) {
    const a = new Path2D(), ah = new Path2D();
    const s = 6;
    for (const [x0, y0, x1, y1, isHot] of heads) {
      const d = Math.hypot(x1 - x0, y1 - y0) || 1;
      const ux = (x1 - x0) / d, uy = (y1 - y0) / d;
      const p = isHot ? ah : a;
      p.moveTo(x1, y1);
      p.lineTo(x1 - ux * s - uy * s * 0.5, y1 - uy * s + ux * s * 0.5);
      p.lineTo(x1 - ux * s + uy * s * 0.5, y1 - uy * s - ux * s * 0.5);
      p.closePath();
    }
    ctx.fillStyle = '#8c959f';
    ctx.fill(a);
    ctx.fillStyle = '#f77f00';
    ctx.fill(ah);
  }

  // 3. nodes, batched by class; collapsed boxes; ports
  const leaves = scene.items.filter(it => it.kind !== 'frame' && visible(it));
  const byCls = new Map<string, Item[]>();
  for (const it of leaves) {
    const c = it.kind === 'node' ? data.nodes[it.id][2] : it.kind;
    let l = byCls.get(c);
    if (!l) byCls.set(c, (l = []));
    l.push(it);
  }
  const round = k * 4 > 1.5;
  for (const [c, list] of byCls) {
    if (c === 'port') {
      ctx.fillStyle = '#8c959f';
      const p = new Path2D();
      for (const it of list) {
        const cx = it.x + it.w / 2;
        if (it.key.startsWith('in:')) { p.moveTo(cx - it.w / 2, it.y); p.lineTo(cx + it.w / 2, it.y); p.lineTo(cx, it.y + it.h); }
        else { p.moveTo(cx, it.y); p.lineTo(cx + it.w / 2, it.y + it.h); p.lineTo(cx - it.w / 2, it.y + it.h); }
        p.closePath();
      }
      ctx.fill(p);
      continue;
    }
    const p = new Path2D();
    for (const it of list) {
      if (round) p.roundRect(it.x, it.y, it.w, it.h, c === 'box' ? 6 : 5);
      else p.rect(it.x, it.y, it.w, it.h);
    }
    if (c === 'box') {
      ctx.fillStyle = '#ffffff';
      ctx.fill(p);
      ctx.strokeStyle = '#57606a';
      ctx.lineWidth = Math.max(1.6 / k, 1);
      ctx.stroke(p);
      // a second outline: a box holds more inside
      if (k > 0.3) {
        const q = new Path2D();
        for (const it of list) q.rect(it.x + 3, it.y + it.h + 1, it.w - 6, 2);
        ctx.fillStyle = '#8c959f';
        ctx.fill(q);
      }
    } else {
      const [fill, stroke] = CLS_COLORS[c] ?? CLS_COLORS.op;
      ctx.fillStyle = fill;
      ctx.fill(p);
      ctx.strokeStyle = stroke;
      ctx.lineWidth = Math.max(1 / k, 0.5);
      ctx.stroke(p);
    }
  }

  // 4. overlays: path, error, paused, selection, hover
  const ring = (it: Item | null, color: string, px: number, gap: number, dash: number[] = []) => {
    if (!it || !visible(it)) return;
    ctx.strokeStyle = color;
    ctx.lineWidth = px / k;
    ctx.setLineDash(dash.map(d => d / k));
    ctx.beginPath();
    const g = gap / k;
    ctx.roundRect(it.x - g, it.y - g, it.w + 2 * g, it.h + 2 * g, 6 + g);
    ctx.stroke();
    ctx.setLineDash([]);
  };
  for (const it of pathItems) ring(it, '#f77f00', 2.5, 2);
  if (error && visible(error)) {
    ctx.fillStyle = 'rgba(207,34,46,0.18)';
    ctx.fillRect(error.x, error.y, error.w, error.h);
    ring(error, '#8b0000', 3, 3, [5, 3]);
  }
  ring(paused, '#e5202e', 3.5, 4);
  ring(selected, '#0969da', 3, paused === selected ? 8 : 3);
  if (inp.hover && inp.hover.kind !== 'frame') ring(inp.hover, 'rgba(9,105,218,0.45)', 2, 1);

  // 5. labels (screen space), outer scopes first, then marked / selected nodes, then the rest
  screen();
  ctx.textBaseline = 'middle';
  const grid = new LabelGrid();
  const sectionTitles: Rect[] = [];
  const sx = (x: number) => x * k + tx, sy = (y: number) => y * k + ty;
  for (const f of frames) {
    const row = data.scopes.get(f.key);
    const isSection = f.depth === 0;
    const label = isSection ? (row?.[2] ?? f.key).toUpperCase() : row?.[2] ?? f.key;
    if (isSection) {
      const fs = 13;
      const font = `bold ${fs}px sans-serif`;
      const t: [string, number] = [label, textWidth(label, font)];
      const r = { x: sx(f.x) + 2, y: sy(f.y) - fs - 6, w: t[1], h: fs + 2 };
      if (!grid.tryAdd(r, t[0])) continue;
      sectionTitles.push(r);
      ctx.font = font;
      ctx.fillStyle = SECTION_EDGE[data.sectionOf(f.key)] ? '#57606a' : '#57606a';
      ctx.fillText(t[0], r.x, r.y + r.h / 2);
    } else {
      const fs = Math.max(12 * k, 9);
      if (HEADER * k < fs + 2) continue;
      const toggle = '− ';
      const tw = textWidth(toggle, BOX_FONT) * fs / 12;
      const l = fit(label, BOX_FONT, fs / 12, f.w * k - 12 - tw);
      if (!l) continue;
      const t: [string, number] = [toggle + l[0], l[1] + tw];
      const r = { x: sx(f.x) + 8, y: sy(f.y + HEADER / 2) - fs / 2 - 1, w: t[1], h: fs + 2 };
      if (!grid.tryAdd(r, t[0])) continue;
      ctx.font = `bold ${fs}px sans-serif`;
      ctx.fillStyle = '#24292f';
      ctx.fillText(t[0], r.x, r.y + r.h / 2);
    }
  }
  const priority = (it: Item) => (it === selected || it === paused || it === error || badgeOf.has(it) ? 0 : it.kind === 'box' ? 1 : 2);
  const ordered = leaves.filter(it => it.kind !== 'port').sort((a, b) => priority(a) - priority(b));
  for (const it of ordered) {
    if (it.kind === 'box') {
      const fs = Math.max(12 * k, 9);
      const hk = it.h * k;
      if (hk < fs * 1.3) continue;
      const two = hk >= fs * 2.7;
      const row = data.scopes.get(it.key);
      const t = fit(row?.[2] ?? it.key, BOX_FONT, fs / 12, it.w * k - 10);
      if (!t) continue;
      const r = { x: sx(it.x + it.w / 2) - t[1] / 2, y: sy(it.y + it.h * (two ? 0.36 : 0.5)) - fs / 2 - 1, w: t[1], h: fs + 2 };
      if (!grid.tryAdd(r, t[0])) continue;
      ctx.font = `bold ${fs}px sans-serif`;
      ctx.fillStyle = '#24292f';
      ctx.fillText(t[0], r.x, r.y + r.h / 2);
      const cs = Math.max(10 * k, 8);
      if (two) {
        const ct = `+ ${countText(row?.[5] ?? 0)}`;
        const c = fit(ct, '10px sans-serif', cs / 10, it.w * k - 10);
        if (c) {
          const rc = { x: sx(it.x + it.w / 2) - c[1] / 2, y: sy(it.y + it.h * 0.72) - cs / 2 - 1, w: c[1], h: cs + 2 };
          if (grid.tryAdd(rc, c[0])) {
            ctx.font = `${cs}px sans-serif`;
            ctx.fillStyle = '#57606a';
            ctx.fillText(c[0], rc.x, rc.y + rc.h / 2);
          }
        }
      }
    } else {
      const fs = Math.max(11 * k, 8);
      if (it.h * k < fs + 2) continue;
      const t = fit(data.nodes[it.id][1], NODE_FONT, fs / 11, it.w * k - 8);
      if (!t) continue;
      const r = { x: sx(it.x + it.w / 2) - t[1] / 2, y: sy(it.y + it.h / 2) - fs / 2 - 1, w: t[1], h: fs + 2 };
      if (!grid.tryAdd(r, t[0])) continue;
      ctx.font = `${fs}px sans-serif`;
      ctx.fillStyle = '#1f2328';
      ctx.fillText(t[0], r.x, r.y + r.h / 2);
    }
  }

  // 6. badges: condition abbreviations, top-right of the item, readable at any zoom. They never cover one
  // another nor a section's title: a badge that would is folded into the one it meets ("TO +3": three more
  // marked items there; zoom in to see each), marked / selected items placed first, then in graph order.
  const badges: DrawOutput['badges'] = [];
  ctx.font = 'bold 10px sans-serif';
  const SUFFIX = ctx.measureText(' +999').width; // room kept for the "+n" of folded badges
  const placed: { it: Item; text: string; x: number; y: number; w: number; h: number; more: number }[] = [];
  const first = (it: Item) => (it === selected || it === paused || it === error ? 0 : 1);
  const meets = (a: Rect, b: Rect) => a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
  const badgeItems = [...badgeOf.keys()].filter(visible)
    .sort((a, b) => first(a) - first(b) || a.y - b.y || a.x - b.x);
  for (const it of badgeItems) {
    const texts = badgeOf.get(it)!;
    const text = texts.length > 1 && it.kind === 'box' ? `${texts[0]} +${texts.length - 1}` : texts.join(' ');
    const w = ctx.measureText(text).width + 8, h = 14;
    let x = Math.min(sx(it.x + it.w) - w / 2, W - w - SUFFIX), y = sy(it.y) - h / 2;
    const title = sectionTitles.find(r => meets({ x, y, w: w + SUFFIX, h }, r));
    if (title) y = title.y + title.h + 1;
    const room = { x, y, w: w + SUFFIX, h };
    const other = placed.find(p => meets(room, { x: p.x, y: p.y, w: p.w + SUFFIX, h: p.h }));
    if (other) { other.more += 1; continue; }
    placed.push({ it, text, x, y, w, h, more: 0 });
  }
  for (const p of placed) {
    const text = p.more ? `${p.text} +${p.more}` : p.text;
    const w = ctx.measureText(text).width + 8;
    ctx.fillStyle = '#cf222e';
    ctx.beginPath();
    ctx.roundRect(p.x, p.y, w, p.h, 7);
    ctx.fill();
    ctx.fillStyle = '#ffffff';
    ctx.fillText(text, p.x + 4, p.y + p.h / 2 + 0.5);
    badges.push({ x: p.x, y: p.y, w, h: p.h, text, ref: refOf(p.it) });
  }
  return { labels: grid.boxes, badges, ms: performance.now() - t0 };
}
