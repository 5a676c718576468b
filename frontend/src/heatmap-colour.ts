/** Colour scales of the heatmap: diverging (RdBu, centred on 0) and sequential (viridis), and the
 * colours of the cells that have no place on a scale (NaN, +Inf, −Inf). */

export type RGB = [number, number, number];

function hex(h: string): RGB {
  return [parseInt(h.slice(1, 3), 16), parseInt(h.slice(3, 5), 16), parseInt(h.slice(5, 7), 16)];
}

/** Negative (blue) → 0 (white) → positive (red): ColorBrewer RdBu. */
const DIVERGING = ['#053061', '#2166ac', '#4393c3', '#92c5de', '#d1e5f0', '#f7f7f7', '#fddbc7', '#f4a582',
  '#d6604d', '#b2182b', '#67001f'].map(hex);
/** Low → high: viridis. */
const SEQUENTIAL = ['#440154', '#472d7b', '#3b528b', '#2c728e', '#21918c', '#28ae80', '#5ec962', '#addc30',
  '#fde725'].map(hex);

/** Cells off the scale; none of these colours is on either scale. */
export const SPECIAL: Record<'nan' | 'pos_inf' | 'neg_inf', { rgb: RGB; css: string; label: string }> = {
  nan: { rgb: [150, 150, 150], css: '#969696', label: 'NaN' },
  pos_inf: { rgb: [255, 0, 255], css: '#ff00ff', label: '+Inf' },
  neg_inf: { rgb: [0, 229, 255], css: '#00e5ff', label: '−Inf' }
};

function ramp(stops: RGB[], t: number): RGB {
  const x = Math.min(1, Math.max(0, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const f = x - i;
  const a = stops[i], b = stops[i + 1];
  return [a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f];
}

export interface Scale {
  kind: 'diverging' | 'sequential';
  lo: number;
  hi: number;
  colour(v: number): RGB;
}

/** The scale for finite values in [vmin, vmax]; a diverging one is symmetric around 0. */
export function makeScale(kind: string, vmin: number | null, vmax: number | null): Scale {
  const lo0 = vmin ?? 0, hi0 = vmax ?? 0;
  if (kind === 'diverging') {
    const m = Math.max(Math.abs(lo0), Math.abs(hi0)) || 1;
    return { kind: 'diverging', lo: -m, hi: m, colour: v => ramp(DIVERGING, (v + m) / (2 * m)) };
  }
  const lo = lo0, hi = hi0 > lo0 ? hi0 : lo0 + 1;
  return { kind: 'sequential', lo, hi: hi0, colour: v => ramp(SEQUENTIAL, (v - lo) / (hi - lo)) };
}

/** The colour of any value: the scale's for finite ones, SPECIAL's for NaN and ±Inf. */
export function cellColour(scale: Scale, v: number): RGB {
  if (Number.isNaN(v)) return SPECIAL.nan.rgb;
  if (v === Infinity) return SPECIAL.pos_inf.rgb;
  if (v === -Infinity) return SPECIAL.neg_inf.rgb;
  return scale.colour(v);
}

/** Python's `{:.6g}`-like text of a value (NaN, +Inf, −Inf spelled out). */
export function fmtValue(v: number): string {
  if (Number.isNaN(v)) return 'NaN';
  if (v === Infinity) return '+Inf';
  if (v === -Infinity) return '−Inf';
  if (Number.isInteger(v) && Math.abs(v) < 1e15) return String(v);
  let s = v.toPrecision(6);
  if (s.includes('e')) {
    const [m, e] = s.split('e');
    s = (m.includes('.') ? m.replace(/0+$/, '').replace(/\.$/, '') : m) + 'e' + (e.startsWith('-') ? e : '+' + e);
    return s;
  }
  return s.includes('.') ? s.replace(/0+$/, '').replace(/\.$/, '') : s;
}
