/**
 * The hit list's page of groups (node · condition) and its pager, drawn from one `hits` message
 * (nbdebug/ui/hits.py): one widget model for the whole list instead of a few widgets per row, so a panel
 * with thousands of hits opens as fast as one without. Titles and details arrive as escaped HTML from the
 * kernel. A click on a row's button or the pager sends `{type: "hit-click", action, group, row, rev}`;
 * the kernel acts on the page it sent as `rev` (a click on an older page is dropped).
 */
import { WidgetModel, Msg } from './model';

/** [select label, tooltip, detail html] */
export type HitRowData = [string, string, string];
export interface HitsMsg extends Msg {
  rev: number;
  groups: { title: string; rows: HitRowData[] }[];
  empty: string;
  /** null when every group fits on one page */
  pager: { label: string; prev: boolean; next: boolean } | null;
}

const BUTTON = 'jupyter-widgets jupyter-button widget-button';

function button(text: string, cls: string, title: string, data: Record<string, string>): HTMLButtonElement {
  const b = document.createElement('button');
  b.className = `${BUTTON} ${cls}`;
  b.textContent = text;
  b.title = title;
  Object.assign(b.dataset, data);
  return b;
}

function drawGroups(list: HTMLElement, msg: HitsMsg): void {
  const frag = document.createDocumentFragment();
  msg.groups.forEach((g, gi) => {
    const box = document.createElement('div');
    box.className = 'nbdebug-hit-group';
    box.style.cssText = 'flex:0 0 auto;border-left:3px solid #cf222e;padding:0 0 0 4px;margin:0 0 4px 0';
    const head = document.createElement('div');
    head.className = 'nbdebug-hit-group-title';
    head.innerHTML = g.title;
    box.appendChild(head);
    g.rows.forEach(([label, tip, detail], ri) => {
      const row = document.createElement('div');
      row.className = 'nbdebug-hit-row nbdebug-hit-hit';
      row.style.cssText = 'display:flex;flex:0 0 auto;flex-flow:row wrap;align-items:center';
      const at = { group: String(gi), row: String(ri) };
      const sel = button(label, 'nbdebug-hit-select', tip, { ...at, action: 'select' });
      sel.style.cssText = 'width:auto;max-width:min(420px, calc(100% - 64px))';
      const view = button('View', 'nbdebug-hit-view', 'open the tensor view', { ...at, action: 'view' });
      view.style.width = '52px';
      const det = document.createElement('div');
      det.className = 'nbdebug-hit-detail';
      det.innerHTML = detail;
      row.append(sel, view, det);
      box.appendChild(row);
    });
    frag.appendChild(box);
  });
  if (!msg.groups.length) {
    const none = document.createElement('div');
    none.innerHTML = msg.empty;
    frag.appendChild(none);
  }
  list.replaceChildren(frag);
}

export function renderHits(model: WidgetModel, el: HTMLElement): () => void {
  el.innerHTML = '';
  const list = document.createElement('div');
  list.className = 'nbdebug-hit-list';
  list.style.cssText = 'overflow:auto;display:flex;flex-direction:column';
  list.style.maxHeight = `${Number(model.get('height')) || 260}px`;
  const pager = document.createElement('div');
  pager.className = 'nbdebug-hit-pager';
  pager.style.cssText = 'display:none;align-items:center';
  const prev = button('‹', '', 'previous page', { action: 'prev' });
  const next = button('›', '', 'next page', { action: 'next' });
  prev.style.width = next.style.width = '32px';
  const label = document.createElement('span');
  label.style.margin = '0 4px';
  pager.append(prev, label, next);
  el.append(list, pager);
  let rev = -1;

  const onMsg = (msg: Msg) => {
    if (!msg || msg.type !== 'hits') return;
    const m = msg as HitsMsg;
    rev = m.rev;
    drawGroups(list, m);
    pager.style.display = m.pager ? 'flex' : 'none';
    label.innerHTML = m.pager ? m.pager.label : '';
    prev.disabled = !m.pager?.prev;
    next.disabled = !m.pager?.next;
  };
  const onClick = (ev: Event) => {
    const b = (ev.target as HTMLElement).closest?.('button[data-action]') as HTMLButtonElement | null;
    if (!b || b.disabled || !el.contains(b)) return;
    const d = b.dataset;
    model.send({ type: 'hit-click', action: d.action ?? '', group: Number(d.group ?? -1), row: Number(d.row ?? -1),
                 rev });
  };
  el.addEventListener('click', onClick);
  model.on('msg:custom', onMsg);
  model.send({ type: 'hello' });
  return () => {
    model.off('msg:custom', onMsg);
    el.removeEventListener('click', onClick);
  };
}
