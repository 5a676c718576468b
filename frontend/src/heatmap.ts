/**
 * The tensor heatmap (canvas): one 2-D selection of a tensor, labelled with its original indices.
 * Data: the `heatmap` message of ../PROTOCOL.md (JSON + one float32/float64 buffer, row-major).
 */
import { WidgetModel, Msg } from './model';
import { Scale, SPECIAL, cellColour, fmtValue, makeScale } from './heatmap-colour';

export interface HeatmapMsg extends Msg {
  title: string;
  step: string;
  empty?: string;
  selection?: string;
  dtype?: 'float32' | 'float64';
  tensor_dtype?: string;
  shape?: [number, number];
  rows?: number[] | null;
  cols?: number[] | null;
  row_axis?: number | null;
  col_axis?: number | null;
  index?: (number | null)[];
  scale?: 'diverging' | 'sequential';
  vmin?: number | null;
  vmax?: number | null;
  counts?: { nan: number; pos_inf: number; neg_inf: number };
  note?: string;
  reveal?: boolean;
}

const LEFT = 58, TOP = 6, BOTTOM = 38, RIGHT = 100, BAR = 14, MAX_H = 360;

/** Float values of a buffer as the kernel sent it (any ArrayBuffer / view, any alignment). */
export function decodeValues(buf: unknown, dtype: string): Float32Array | Float64Array {
  let bytes: Uint8Array;
  if (buf instanceof ArrayBuffer) bytes = new Uint8Array(buf);
  else if (ArrayBuffer.isView(buf)) bytes = new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
  else throw new Error('heatmap: no value buffer');
  const copy = bytes.slice().buffer; // aligned
  return dtype === 'float64' ? new Float64Array(copy) : new Float32Array(copy);
}

/** Positions (cell indices) to label so labels are at least `minPx` apart: every 1, 2, 5, 10, 20… cells. */
export function tickPositions(n: number, cellPx: number, minPx: number): number[] {
  let k = 1;
  const steps = [1, 2, 5];
  for (let m = 1; k * cellPx < minPx; m *= 10) {
    for (const s of steps) {
      k = s * m;
      if (k * cellPx >= minPx) break;
    }
  }
  const out: number[] = [];
  for (let i = 0; i < n; i += k) out.push(i);
  return out;
}

function div(cls: string, parent: HTMLElement, style = ''): HTMLDivElement {
  const d = document.createElement('div');
  d.className = cls;
  if (style) d.style.cssText = style;
  parent.appendChild(d);
  return d;
}

export function renderHeatmap(model: WidgetModel, el: HTMLElement): () => void {
  el.innerHTML = '';
  el.style.position = 'relative';
  el.style.fontFamily = 'var(--jp-ui-font-family, sans-serif)';
  el.style.fontSize = '11px';
  const head = div('nbdebug-heat-title', el, 'font-weight:600;margin:2px 0 4px 0');
  const body = div('nbdebug-heat-body', el, 'position:relative');
  const canvas = document.createElement('canvas');
  canvas.className = 'nbdebug-heat-canvas';
  canvas.style.cssText = `position:absolute;left:${LEFT}px;top:${TOP}px;cursor:crosshair`;
  body.appendChild(canvas);
  const bar = document.createElement('canvas');
  bar.className = 'nbdebug-heat-colorbar';
  bar.style.position = 'absolute';
  body.appendChild(bar);
  const labels = div('nbdebug-heat-labels', body);
  const legend = div('nbdebug-heat-legend', el, 'display:flex;flex-wrap:wrap;gap:2px 12px;margin-top:4px;align-items:center');
  const readout = div('nbdebug-heat-readout', el, 'font-family:var(--jp-code-font-family, monospace);min-height:1.4em');

  let msg: HeatmapMsg | null = null;
  let values: Float32Array | Float64Array | null = null;
  let geom = { cw: 1, ch: 1, w: 0, h: 0 };
  let pendingReveal = false;
  let replaying = false;
  let received = 0;

  function indexText(r: number, c: number): string {
    const m = msg!;
    const idx = (m.index ?? []).map((v, axis) => {
      if (v !== null && v !== undefined) return String(v);
      if (axis === m.row_axis && m.rows) return String(m.rows[r]);
      if (axis === m.col_axis && m.cols) return String(m.cols[c]);
      return '?';
    });
    return `[${idx.join(', ')}]`;
  }

  function drawLegend(scale: Scale | null): void {
    legend.innerHTML = '';
    const counts = msg?.counts ?? { nan: 0, pos_inf: 0, neg_inf: 0 };
    for (const key of ['nan', 'pos_inf', 'neg_inf'] as const) {
      const item = div(`nbdebug-heat-legend-item nbdebug-heat-legend-${key}`, legend,
        'display:flex;gap:4px;align-items:center;white-space:nowrap');
      const sw = div('nbdebug-heat-swatch', item,
        `width:14px;height:12px;border:1px solid #666;background:${SPECIAL[key].css}` +
        (key === 'nan' ? ';background-image:repeating-linear-gradient(45deg,transparent 0 3px,#fff 3px 4px)' : ''));
      sw.title = SPECIAL[key].label;
      item.appendChild(document.createTextNode(`${SPECIAL[key].label} ${counts[key]}`));
    }
    if (scale) {
      const s = div('nbdebug-heat-scale', legend, 'color:var(--jp-ui-font-color2,#666)');
      s.textContent = scale.kind === 'diverging' ? 'diverging scale, centred on 0' : 'sequential scale';
    }
  }

  function draw(): void {
    labels.innerHTML = '';
    if (!msg) {
      head.textContent = '';
      body.style.height = '0px';
      legend.innerHTML = '';
      return;
    }
    head.textContent = `${msg.title} · ${msg.step}` + (msg.selection && msg.selection !== '[]' ? ` · ${msg.selection}` : '');
    if (msg.empty !== undefined || !values || !msg.shape) {
      body.style.height = '0px';
      canvas.width = canvas.height = 0;
      bar.width = bar.height = 0;
      legend.innerHTML = '';
      readout.textContent = msg.empty ?? '';
      readout.classList.add('nbdebug-heat-empty');
      return;
    }
    readout.classList.remove('nbdebug-heat-empty');
    const [nr, nc] = msg.shape;
    const width = el.clientWidth || 600;
    const plotW = Math.max(60, width - LEFT - RIGHT);
    const cw = plotW / nc;
    let ch = nr === 1 ? Math.max(18, Math.min(cw, 40)) : Math.min(cw, 40);
    if (ch * nr > MAX_H) ch = MAX_H / nr;
    if (ch * nr < 18) ch = 18 / nr;
    const plotH = ch * nr;
    geom = { cw, ch, w: plotW, h: plotH };
    body.style.height = `${TOP + plotH + BOTTOM}px`;

    // cells: one pixel per cell, scaled up without smoothing
    const scale = makeScale(msg.scale ?? 'sequential', msg.vmin ?? null, msg.vmax ?? null);
    const img = new ImageData(nc, nr);
    for (let i = 0; i < nr * nc; i++) {
      const [r, g, b] = cellColour(scale, values[i]);
      img.data[4 * i] = r; img.data[4 * i + 1] = g; img.data[4 * i + 2] = b; img.data[4 * i + 3] = 255;
    }
    const src = document.createElement('canvas');
    src.width = nc; src.height = nr;
    src.getContext('2d')!.putImageData(img, 0, 0);
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(plotW * dpr);
    canvas.height = Math.round(plotH * dpr);
    canvas.style.width = `${plotW}px`;
    canvas.dataset.rows = String(nr);
    canvas.dataset.cols = String(nc);
    canvas.style.height = `${plotH}px`;
    const ctx = canvas.getContext('2d')!;
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(src, 0, 0, canvas.width, canvas.height);
    // NaN cells hatched (45° lines 8 px apart, none through a cell's centre: that pixel stays the NaN grey)
    if (cw >= 6 && ch >= 6 && (msg.counts?.nan ?? 0) > 0) {
      ctx.save();
      ctx.scale(dpr, dpr);
      ctx.strokeStyle = '#ffffff';
      ctx.lineWidth = 1;
      for (let i = 0; i < nr * nc; i++) {
        if (!Number.isNaN(values[i])) continue;
        const x = (i % nc) * cw, y = Math.floor(i / nc) * ch;
        ctx.save();
        ctx.beginPath();
        ctx.rect(x, y, cw, ch);
        ctx.clip();
        ctx.beginPath();
        const mid = x + cw / 2 + y + ch / 2; // x + y on the centre
        const first = mid + 4 - 8 * Math.ceil((mid + 4 - (x + y)) / 8);
        for (let c = first; c <= x + y + cw + ch; c += 8) { // the line x' + y' = c
          ctx.moveTo(c - y, y);
          ctx.lineTo(c - y - ch, y + ch);
        }
        ctx.stroke();
        ctx.restore();
      }
      ctx.restore();
    }
    ctx.strokeStyle = '#999';
    ctx.strokeRect(0, 0, canvas.width, canvas.height);

    // integer ticks: the original indices
    const cols = msg.cols ?? null, rows = msg.rows ?? null;
    if (cols) {
      const widest = String(Math.max(...cols.map(Math.abs))).length;
      for (const p of tickPositions(nc, cw, Math.max(24, widest * 7 + 10))) {
        const t = div('nbdebug-heat-xtick', labels,
          `position:absolute;top:${TOP + plotH + 2}px;left:${LEFT + (p + 0.5) * cw}px;transform:translateX(-50%);color:var(--jp-ui-font-color1,#333)`);
        t.textContent = String(cols[p]);
      }
      const ax = div('nbdebug-heat-xlabel', labels,
        `position:absolute;top:${TOP + plotH + 18}px;left:${LEFT + plotW / 2}px;transform:translateX(-50%);color:var(--jp-ui-font-color2,#666)`);
      ax.textContent = `dim ${msg.col_axis}`;
    }
    if (rows) {
      for (const p of tickPositions(nr, ch, 14)) {
        const t = div('nbdebug-heat-ytick', labels,
          `position:absolute;right:${width - LEFT + 4}px;top:${TOP + (p + 0.5) * ch}px;transform:translateY(-50%);color:var(--jp-ui-font-color1,#333)`);
        t.textContent = String(rows[p]);
      }
      const ax = div('nbdebug-heat-ylabel', labels,
        `position:absolute;left:0;top:${TOP + plotH / 2}px;transform:translateY(-50%) rotate(-90deg);color:var(--jp-ui-font-color2,#666)`);
      ax.textContent = `dim ${msg.row_axis}`;
    }

    // colour bar
    const barH = Math.max(plotH, 60);
    bar.width = BAR; bar.height = Math.round(barH);
    bar.style.left = `${LEFT + plotW + 8}px`;
    bar.style.top = `${TOP}px`;
    bar.style.width = `${BAR}px`;
    bar.style.height = `${barH}px`;
    const bctx = bar.getContext('2d')!;
    for (let y = 0; y < bar.height; y++) {
      const v = scale.hi - (y / Math.max(1, bar.height - 1)) * (scale.hi - scale.lo);
      const [r, g, b] = scale.colour(v);
      bctx.fillStyle = `rgb(${r | 0},${g | 0},${b | 0})`;
      bctx.fillRect(0, y, BAR, 1);
    }
    body.style.height = `${TOP + Math.max(plotH, barH) + BOTTOM}px`;
    const barTicks: [number, number][] = [[scale.hi, 0], [scale.lo, barH]];
    if (scale.kind === 'diverging') barTicks.push([0, barH / 2]);
    for (const [v, y] of barTicks) {
      const t = div('nbdebug-heat-bartick', labels,
        `position:absolute;left:${LEFT + plotW + 8 + BAR + 4}px;white-space:nowrap;top:${TOP + y}px;transform:translateY(-50%);color:var(--jp-ui-font-color1,#333)`);
      t.textContent = msg.vmin === null && msg.vmax === null ? '–' : fmtValue(v);
    }
    drawLegend(scale);
    if (pendingReveal && el.clientWidth > 0) {
      pendingReveal = false;
      reveal();
    }
  }

  /** Scroll the tensor view holding this heatmap (or the heatmap) into sight if it is not. */
  function reveal(): void {
    const target = (el.closest('.nbdebug-tensor-view') as HTMLElement | null) ?? el;
    const r = target.getBoundingClientRect();
    if (r.top < 0 || r.bottom > window.innerHeight) {
      target.scrollIntoView({ block: r.height > window.innerHeight ? 'start' : 'nearest' });
    }
  }

  function onMove(ev: MouseEvent): void {
    if (!msg || !values || !msg.shape) return;
    const rect = canvas.getBoundingClientRect();
    const c = Math.floor((ev.clientX - rect.left) / geom.cw);
    const r = Math.floor((ev.clientY - rect.top) / geom.ch);
    if (r < 0 || c < 0 || r >= msg.shape[0] || c >= msg.shape[1]) return;
    const idx = (msg.index ?? []).length ? indexText(r, c) : 'value'; // a 0-d tensor has no index
    readout.textContent = `${idx} = ${fmtValue(values[r * msg.shape[1] + c])}`;
  }
  canvas.addEventListener('mousemove', onMove);
  canvas.addEventListener('mouseleave', () => { if (msg && !msg.empty) readout.textContent = ''; });

  function onMsg(content: Msg, buffers?: unknown[]): void {
    if (!content || content.type !== 'heatmap') return;
    const m = content as HeatmapMsg;
    try {
      values = m.empty === undefined ? decodeValues((buffers ?? [])[0], m.dtype ?? 'float32') : null;
    } catch (e) {
      values = null;
      m.empty = String(e);
    }
    if (values && m.shape && values.length === 0) {
      m.empty = `nothing to draw: the selection has ${m.shape[0]}×${m.shape[1]} elements`;
      values = null;
    } else if (values && m.shape && values.length !== m.shape[0] * m.shape[1]) {
      m.empty = `heatmap: ${values.length} values for a ${m.shape[0]}×${m.shape[1]} selection`;
      values = null;
    }
    msg = m;
    readout.textContent = '';
    // a replayed message (a static model, or the kernel's answer to this view's hello) does not scroll
    const replay = replaying || (received === 0 && performance.now() - helloAt < 1000);
    received++;
    if (m.reveal && !replay) pendingReveal = true;
    draw();
  }
  model.on('msg:custom', onMsg);
  // redraw when the width changes (e.g. the tensor view is shown), a frame later: drawing sets the height
  let drawnWidth = -1, frame = 0;
  const ro = typeof ResizeObserver !== 'undefined' ? new ResizeObserver(() => {
    if (el.clientWidth === drawnWidth || frame) return;
    frame = requestAnimationFrame(() => { frame = 0; drawnWidth = el.clientWidth; draw(); });
  }) : null;
  ro?.observe(el);
  replaying = true; // a static model answers hello at once: a replayed view does not scroll the page
  const helloAt = performance.now();
  model.send({ type: 'hello' });
  replaying = false;
  return () => {
    model.off('msg:custom', onMsg);
    ro?.disconnect();
    if (frame) cancelAnimationFrame(frame);
    el.innerHTML = '';
  };
}
