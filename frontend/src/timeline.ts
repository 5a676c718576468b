/**
 * The run timeline (`view = "timeline"`): a heatmap of rows (modules, following the module tree) × steps
 * and a line chart of the selected row with its band and hit markers, drawn with plotly.js.
 * Data: the `timeline` message of ../PROTOCOL.md (JSON + int32/float32 buffers, decimated by the kernel).
 *
 * plotly.js (the cartesian dist, ~1.5 MB) is not in this bundle: it is loaded once per page, on the first
 * timeline drawn, from (in this order) a page that already has `Plotly`, an inlined copy
 * (`#nbdebug-plotly-src`, export_html), the file next to this module (the labextension's static folder),
 * or the labextension URL from the page's config.
 */
import { WidgetModel, Msg } from './model';
import { SPECIAL } from './heatmap-colour';

export interface TimelineMsg extends Msg {
  field: string;
  fields: string[];
  empty?: string;
  steps: [number, number] | null;
  range?: [number, number];
  shape: [number, number];
  rows: [string, string, number, boolean, boolean][];
  selected?: string | null;
  selected_label?: string;
  hits?: [number, number, string, string][];
  left_band?: number | null;
  band: string;
  window: number;
  k: number;
  step: number | null;
  note: string;
  log?: boolean;
  /** rows (index `shape[0]`: the line) with a NaN/±Inf the model computed; their flags are buffer 8 */
  nonfinite?: number[];
}

/** bits of the non-finite flags (a series absent at a step has none: a gap) */
export const NAN = 1, POS_INF = 2, NEG_INF = 4;
// the tensor heatmap's colours of NaN / +Inf / −Inf (none of them is on Viridis)
const NONFINITE_COLOR: Record<number, string> = {
  [NAN]: SPECIAL.nan.css, [POS_INF]: SPECIAL.pos_inf.css, [NEG_INF]: SPECIAL.neg_inf.css
};

const NONFINITE_CELLS = 'NaN / ±Inf cells';

export function nonfiniteText(f: number): string {
  return [f & NAN ? 'NaN' : '', f & POS_INF ? '+Inf' : '', f & NEG_INF ? '-Inf' : ''].filter(Boolean).join(' ');
}

/** Per row (and the line, index `shape[0]`) the flags of each column: NaN | +Inf | -Inf bits. */
export function nonfiniteFlags(m: TimelineMsg, bufs: unknown[]): Map<number, Uint8Array> {
  const out = new Map<number, Uint8Array>();
  const rows = m.nonfinite ?? [];
  if (!rows.length || bufs[8] === undefined) return out;
  const all = new Uint8Array(view(bufs[8]));
  const ncols = m.shape[1];
  rows.forEach((r, i) => out.set(r, all.subarray(i * ncols, (i + 1) * ncols)));
  return out;
}

function flagColor(f: number): string {
  return NONFINITE_COLOR[f & NAN ? NAN : f & POS_INF ? POS_INF : NEG_INF];
}

const PLOTLY_FILE = 'plotly-cartesian.min.js';
let plotly: Promise<any> | null = null;

function evalUmd(text: string): any {
  const module = { exports: {} as any };
  // the UMD wrapper takes `module.exports` when it sees CommonJS: no global, no AMD `define` involved
  new Function('module', 'exports', 'define', text)(module, module.exports, undefined);
  return module.exports;
}

function plotlyUrls(): string[] {
  const out: string[] = [];
  try {
    const here = new URL(PLOTLY_FILE, import.meta.url);
    if (here.protocol === 'http:' || here.protocol === 'https:') out.push(here.href);
  } catch (e) { /* a blob: or data: module has no siblings */ }
  try {
    const cfg = JSON.parse(document.getElementById('jupyter-config-data')?.textContent ?? '{}');
    const base = cfg.fullLabextensionsUrl || (cfg.baseUrl || '/') + 'lab/extensions';
    out.push(new URL(String(base).replace(/\/$/, '') + '/nbdebug/static/' + PLOTLY_FILE, location.href).href);
  } catch (e) { /* no Jupyter page */ }
  return [...new Set(out)];
}

/** plotly.js, loaded once per page. */
export function loadPlotly(): Promise<any> {
  const g = globalThis as any;
  if (g.Plotly) return Promise.resolve(g.Plotly);
  if (!plotly) {
    plotly = (async () => {
      const inline = document.getElementById('nbdebug-plotly-src');
      if (inline) {
        const raw = (inline.textContent ?? '').trim();
        const text = (inline as HTMLElement).dataset.encoding === 'base64'
          ? new TextDecoder().decode(Uint8Array.from(atob(raw), c => c.charCodeAt(0))) : raw;
        return (g.Plotly = evalUmd(text));
      }
      const errors: string[] = [];
      for (const url of plotlyUrls()) {
        try {
          const res = await fetch(url);
          if (!res.ok) throw new Error(`HTTP ${res.status}`);
          return (g.Plotly = evalUmd(await res.text()));
        } catch (e) {
          errors.push(`${url}: ${e}`);
        }
      }
      throw new Error(`plotly.js did not load (${errors.join('; ') || 'no URL to load it from'})`);
    })();
    plotly.catch(() => (plotly = null));
  }
  return plotly;
}

function view(buf: unknown): ArrayBuffer {
  let bytes: Uint8Array;
  if (buf instanceof ArrayBuffer) bytes = new Uint8Array(buf);
  else if (ArrayBuffer.isView(buf)) bytes = new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
  else throw new Error('timeline: a buffer is missing');
  return bytes.slice().buffer; // aligned copy
}

const f32 = (b: unknown) => Array.from(new Float32Array(view(b)), v => (Number.isNaN(v) ? null : v));
const i32 = (b: unknown) => Array.from(new Int32Array(view(b)));

export function fmt(v: number | null): string {
  if (v === null || v === undefined) return '–';
  const a = Math.abs(v);
  return a !== 0 && (a >= 1e5 || a < 1e-3) ? v.toExponential(3) : String(Number(v.toPrecision(5)));
}

/** The figure of one message: traces and layout (pure, for tests and the static replay). */
export function figure(m: TimelineMsg, bufs: unknown[], width: number): { data: any[]; layout: any } {
  const first = i32(bufs[0]), last = i32(bufs[1]);
  const [nrows, ncols] = m.shape;
  const heat = new Float32Array(view(bufs[2]));
  const lmin = f32(bufs[3]), lmax = f32(bufs[4]);
  const blo = f32(bufs[5]), bmid = f32(bufs[6]), bhi = f32(bufs[7]);
  const x = first.map((a, i) => (a + last[i]) / 2);
  const flags = nonfiniteFlags(m, bufs);
  const bad = { x: [] as number[], y: [] as number[], color: [] as string[], text: [] as string[] };
  const z: (number | null)[][] = [], text: string[][] = [], zbad: (number | null)[][] = [];
  for (let r = 0; r < nrows; r++) {
    const zr: (number | null)[] = [], tr: string[] = [], br: (number | null)[] = [];
    const fr = flags.get(r);
    for (let c = 0; c < ncols; c++) {
      const v = heat[r * ncols + c];
      const ok = Number.isFinite(v) && (!m.log || v > 0);
      zr.push(ok ? (m.log ? Math.log10(v) : v) : null);
      const span = first[c] === last[c] ? `step ${first[c]}` : `steps ${first[c]}–${last[c]}`;
      const f = fr ? fr[c] : 0;
      const shown = Number.isFinite(v) ? fmt(v) : '';
      const value = f ? [shown, nonfiniteText(f)].filter(Boolean).join(' · ') : Number.isNaN(v) ? '–' : fmt(v);
      tr.push(`${m.rows[r][0]}<br>${span}<br>${m.field} ${value}`);
      br.push(f ? (f & NAN ? 0 : f & POS_INF ? 1 : 2) : null);
      if (f) {
        bad.x.push(x[c]); bad.y.push(r); bad.color.push(flagColor(f));
        bad.text.push(`${m.rows[r][0]}<br>${span}<br>${m.field} ${value} (computed)`);
      }
    }
    z.push(zr);
    text.push(tr);
    zbad.push(br);
  }
  const labels = m.rows.map(r => r[0]);
  const ys = m.rows.map((_r, i) => i); // rows by index: paths such as "2.0" are not categories plotly keeps apart
  const hits = m.hits ?? [];
  const colOf = (s: number) => {
    let lo = 0, hi = first.length - 1;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (first[mid] <= s) lo = mid; else hi = mid - 1; }
    return lo;
  };
  const selRow = labels.indexOf(m.selected ?? '');
  const lineFlags = flags.get(nrows);
  const lineBad = lineFlags ? Array.from(lineFlags.keys()).filter(c => lineFlags[c]) : [];
  const finiteMax = lmax.reduce((a: number | null, v) => (v !== null && Number.isFinite(v) && (a === null || v > a) ? v : a), null);
  const lineY = (c: number) => (lmax[c] !== null && Number.isFinite(lmax[c] as number) ? lmax[c]
    : lmin[c] !== null && Number.isFinite(lmin[c] as number) ? lmin[c] : finiteMax ?? (m.log ? 1 : 0));
  const onLine = hits.filter(h => h[1] === selRow || h[1] < 0);
  const data: any[] = [
    { type: 'heatmap', x, y: ys, z, text, hoverinfo: 'text', colorscale: 'Viridis', xaxis: 'x', yaxis: 'y',
      zsmooth: false, hoverongaps: false, name: 'heatmap',
      colorbar: { len: 0.55, y: 1, yanchor: 'top', thickness: 10, title: { text: m.log ? 'log₁₀' : '', side: 'right' } } },
    // the cells whose value the model computed as NaN / +Inf / −Inf, filled in the tensor heatmap's colours
    ...(bad.x.length ? [{ type: 'heatmap', x, y: ys, z: zbad, text, hoverinfo: 'text', xaxis: 'x', yaxis: 'y',
      zsmooth: false, hoverongaps: false, name: NONFINITE_CELLS, showscale: false, zmin: 0, zmax: 2,
      colorscale: [[0, NONFINITE_COLOR[NAN]], [0.5, NONFINITE_COLOR[POS_INF]], [1, NONFINITE_COLOR[NEG_INF]]] }] : []),
    { type: 'scatter', mode: 'markers', x: hits.filter(h => h[1] >= 0).map(h => h[0]),
      y: hits.filter(h => h[1] >= 0).map(h => h[1]), xaxis: 'x', yaxis: 'y', name: 'hits',
      marker: { symbol: 'x-thin', size: 9, line: { width: 2, color: '#cf222e' } },
      text: hits.filter(h => h[1] >= 0).map(h => `${h[2]} ${h[3]} step ${h[0]}`), hoverinfo: 'text' },
    { type: 'scatter', mode: 'lines', x, y: blo, xaxis: 'x', yaxis: 'y2', line: { width: 0 }, hoverinfo: 'skip',
      showlegend: false, connectgaps: false },
    { type: 'scatter', mode: 'lines', x, y: bhi, xaxis: 'x', yaxis: 'y2', fill: 'tonexty',
      fillcolor: 'rgba(84,174,255,0.18)', line: { width: 1, color: 'rgba(84,174,255,0.6)' }, name: bandName(m),
      hovertemplate: 'band %{y:.4g}<extra></extra>' },
    { type: 'scatter', mode: 'lines', x, y: bmid, xaxis: 'x', yaxis: 'y2', name: m.band === 'DRIFT' ? 'mean' : 'median',
      line: { width: 1, dash: 'dot', color: '#0969da' }, hovertemplate: 'baseline %{y:.4g}<extra></extra>' },
    { type: 'scatter', mode: 'lines', x, y: lmin, xaxis: 'x', yaxis: 'y2', line: { width: 0.5, color: '#8250df' },
      hoverinfo: 'skip', showlegend: false },
    { type: 'scatter', mode: 'lines+markers', x, y: lmax, xaxis: 'x', yaxis: 'y2', name: m.selected_label || 'value',
      fill: 'tonexty', fillcolor: 'rgba(130,80,223,0.25)', line: { width: 1.5, color: '#8250df' },
      marker: { size: ncols > 200 ? 0 : 4 },
      customdata: first.map((a, i) => [a, last[i]]),
      hovertemplate: `${m.field} %{y:.5g}<br>%{customdata[0]}–%{customdata[1]}<extra></extra>` },
    { type: 'scatter', mode: 'markers', x: onLine.map(h => h[0]), y: onLine.map(h => lmax[colOf(h[0])]),
      xaxis: 'x', yaxis: 'y2', name: 'hits', showlegend: false,
      marker: { symbol: 'x-thin', size: 11, line: { width: 2, color: '#cf222e' } },
      text: onLine.map(h => `${h[2]} · ${h[3]} · step ${h[0]}`), hoverinfo: 'text' },
    { type: 'scatter', mode: 'markers', x: bad.x, y: bad.y, xaxis: 'x', yaxis: 'y', name: 'NaN / ±Inf',
      marker: { symbol: 'square', size: Math.max(5, Math.min(12, (width - 230) / Math.max(1, ncols))),
                color: bad.color, line: { width: 1, color: '#fff' } },
      text: bad.text, hoverinfo: 'text', showlegend: bad.x.length > 0 || lineBad.length > 0 },
    { type: 'scatter', mode: 'markers+text', x: lineBad.map(c => x[c]), y: lineBad.map(lineY), xaxis: 'x',
      yaxis: 'y2', name: 'NaN / ±Inf (line)', showlegend: false, cliponaxis: false,
      marker: { symbol: 'diamond', size: 9, color: lineBad.map(c => flagColor(lineFlags![c])) },
      textposition: 'top center', textfont: { size: 9, color: lineBad.map(c => flagColor(lineFlags![c])) },
      texttemplate: lineBad.length <= 40 ? '%{text}' : '',
      text: lineBad.map(c => nonfiniteText(lineFlags![c])),
      customdata: lineBad.map(c => first[c] === last[c] ? `step ${first[c]}` : `steps ${first[c]}–${last[c]}`),
      hovertemplate: `${m.field} %{text} (computed)<br>%{customdata}<extra></extra>` }
  ];
  const shapes: any[] = [];
  if (m.step !== null && m.step !== undefined) {
    shapes.push({ type: 'line', xref: 'x', yref: 'paper', x0: m.step, x1: m.step, y0: 0, y1: 1,
                  line: { color: '#cf222e', width: 1.5, dash: 'dash' } });
  }
  if (m.left_band !== null && m.left_band !== undefined) {
    shapes.push({ type: 'line', xref: 'x', yref: 'y2 domain', x0: m.left_band, x1: m.left_band, y0: 0, y1: 1,
                  line: { color: '#9a6700', width: 1, dash: 'dot' } });
  }
  const annotations = m.rows.map((r, i) => ({
    xref: 'paper', yref: 'y', x: 0, y: i, xanchor: 'right', showarrow: false, captureevents: true,
    xshift: -4, font: { size: 11, color: r[0] === m.selected ? '#0969da' : '#1f2328' },
    text: `${'\u2003'.repeat(r[2])}${r[3] ? (r[4] ? '▾ ' : '▸ ') : '\u2002 '}${esc(r[1])}`,
    hovertext: r[3] ? `${r[0]}: click to ${r[4] ? 'close' : 'open'}` : r[0]
  }));
  const range = m.range ?? m.steps ?? [0, 1];
  const pad = range[0] === range[1] ? 0.5 : 0;
  const rowPx = Math.max(10, Math.min(22, 300 / Math.max(1, nrows)));
  const heatPx = Math.max(80, rowPx * nrows);
  const linePx = 170;
  // plotly's mode bar (zoom, pan, reset) shows at the figure's top right on hover: a top margin of its
  // height keeps it off the heatmap, whose top-right cells (the first row's latest steps) it covered —
  // a click meant to scrub to a recent step zoomed the chart instead
  const top = 34;
  const height = heatPx + linePx + 66 + top;
  const layout: any = {
    width, height, margin: { l: 200, r: 30, t: top, b: 40 }, showlegend: true,
    legend: { orientation: 'h', x: 1, xanchor: 'right', y: -0.08, yanchor: 'top', font: { size: 10 } },
    hovermode: 'closest', dragmode: 'zoom', uirevision: m.field,
    xaxis: { range: [range[0] - pad, range[1] + pad], title: { text: 'step', standoff: 4 }, anchor: 'y2',
             showspikes: true, spikemode: 'across', spikethickness: 1, spikecolor: '#8c959f' },
    yaxis: { domain: [linePx / (heatPx + linePx) + 0.06, 1], range: [nrows - 0.5, -0.5], showticklabels: false,
             showgrid: false, zeroline: false, fixedrange: true },
    yaxis2: { domain: [0, linePx / (heatPx + linePx)], type: m.log ? 'log' : 'linear', exponentformat: 'power',
              title: { text: m.field, font: { size: 11 } } },
    shapes, annotations,
    font: { family: 'system-ui, sans-serif', size: 11 }, plot_bgcolor: '#fff'
  };
  return { data, layout };
}

function bandName(m: TimelineMsg): string {
  if (m.band === 'SPIKE') return `SPIKE ${m.k}× median of ${m.window}`;
  if (m.band === 'DRIFT') return `DRIFT mean ± ${m.k}σ of ${m.window}`;
  return 'band';
}

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;');
}

export function renderTimeline(model: WidgetModel, el: HTMLElement): () => void {
  el.innerHTML = '';
  const title = document.createElement('div');
  title.className = 'nbdebug-timeline-title';
  title.style.cssText = 'font: 12px system-ui, sans-serif; margin: 2px 0 4px; color: #1f2328';
  const plot = document.createElement('div');
  plot.className = 'nbdebug-timeline-plot';
  el.append(title, plot);
  let last: { m: TimelineMsg; bufs: unknown[] } | null = null;
  let firstCols: number[] = [], lastCols: number[] = [];
  let P: any = null, bound = false, pending: any = null, gone = false;

  const width = () => Math.max(480, Math.min(2000, (el.clientWidth || plot.clientWidth || 900) - 4));

  function bind(gd: any): void {
    if (bound) return;
    bound = true;
    gd.on('plotly_click', (ev: any) => {
      const p = ev?.points?.[0];
      if (!p || !last) return;
      const tr = p.data?.name === NONFINITE_CELLS ? 'heatmap' : p.data?.name;
      let c: number;
      if (tr === 'heatmap') c = Array.isArray(p.pointIndex) ? p.pointIndex[1] : p.pointNumber?.[1] ?? 0;
      else c = nearestCol(Number(p.x));
      const row = tr === 'heatmap' ? last.m.rows[Number(p.y)]?.[0] ?? null : null;
      const span = { first: firstCols[c] ?? Math.round(Number(p.x)), last: lastCols[c] ?? Math.round(Number(p.x)) };
      model.send({ type: 'scrub', step: span.last, ...span, row });
    });
    gd.on('plotly_clickannotation', (ev: any) => {
      const row = last?.m.rows[ev?.index ?? -1];
      if (!row) return;
      model.send({ type: row[3] ? 'toggle' : 'select', row: row[0] });
      if (row[3]) model.send({ type: 'select', row: row[0] });
    });
    gd.on('plotly_relayout', (ev: any) => {
      if (!ev || !last) return;
      let lo: number | null, hi: number | null;
      if (ev['xaxis.autorange']) [lo, hi] = [null, null];
      else if ('xaxis.range[0]' in ev) [lo, hi] = [Math.floor(ev['xaxis.range[0]']), Math.ceil(ev['xaxis.range[1]'])];
      else if (Array.isArray(ev['xaxis.range'])) [lo, hi] = [Math.floor(ev['xaxis.range'][0]), Math.ceil(ev['xaxis.range'][1])];
      else return;
      clearTimeout(pending);
      pending = setTimeout(() => model.send({ type: 'range', lo, hi, width: width() - 230 }), 150);
    });
  }

  function nearestCol(s: number): number {
    let best = 0;
    for (let i = 0; i < firstCols.length; i++) {
      if (Math.abs((firstCols[i] + lastCols[i]) / 2 - s) < Math.abs((firstCols[best] + lastCols[best]) / 2 - s)) best = i;
    }
    return best;
  }

  async function draw(): Promise<void> {
    if (!last || gone) return;
    const { m, bufs } = last;
    const shown = m.step === null || m.step === undefined ? '' : ` · showing step <b class="nbdebug-timeline-step">${m.step}</b>`;
    if (m.empty !== undefined) {
      title.innerHTML = `<b>${esc(m.field)}</b> · ${esc(m.empty)}`;
      plot.innerHTML = '';
      return;
    }
    const span = m.steps ? `steps ${m.steps[0]}–${m.steps[1]}` : '';
    const sel = m.selected_label ? ` · line: <code>${esc(m.selected_label)}</code>` : '';
    title.innerHTML = `<b>${esc(m.field)}</b> · ${m.shape[0]} rows · ${span}${sel}${shown}` +
      (m.left_band !== null && m.left_band !== undefined ? ` · first out of band at step ${m.left_band}` : '') +
      (m.note ? ` · <span style="color:#9a6700">${esc(m.note)}</span>` : '');
    try {
      P = P ?? (await loadPlotly());
    } catch (e) {
      plot.innerHTML = `<div class="nbdebug-missing" style="color:#cf222e">nbdebug: ${esc(String(e))}</div>`;
      return;
    }
    firstCols = i32(bufs[0]);
    lastCols = i32(bufs[1]);
    const { data, layout } = figure(m, bufs, width());
    await P.react(plot, data, layout, { displaylogo: false, responsive: false, scrollZoom: false,
                                        modeBarButtonsToRemove: ['lasso2d', 'select2d', 'toImage'] });
    bind(plot);
    el.dispatchEvent(new CustomEvent('nbdebug-timeline-drawn', { bubbles: true }));
  }

  function onMsg(content: Msg, buffers?: unknown[]): void {
    if (content.type !== 'timeline') return;
    last = { m: content as TimelineMsg, bufs: buffers ?? [] };
    void draw();
  }
  model.on('msg:custom', onMsg);
  model.send({ type: 'hello' });
  (el as any).nbdebugTimeline = { last: () => last?.m, plot };
  return () => {
    gone = true;
    model.off('msg:custom', onMsg);
    if (P) P.purge(plot);
  };
}
