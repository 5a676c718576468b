/**
 * The status-bar item: the active debugger's state, step and hit count, e.g.
 * `nbdebug: paused · step 3 · step 4 next · 2 hits`. Its `data-state` attribute carries the raw state.
 * With several processes of one job connected (ranks), it sums them up:
 * `nbdebug: 4 processes · 3 running, 1 paused · steps 5–6 · 1 hit`, and `data-state` is the one that needs
 * the user most (failed, then paused, then running); the tooltip lists every process.
 *
 * Steps follow the panel header's convention (one meaning of "step", see `stepParts`): the step whose
 * data is shown — the header's Step, the step of the hits and of the pause reason — and, when training is
 * at another one, `step N next` (paused) or `step N running`.
 */

import { Widget } from '@lumino/widgets';

import { IProcessStatus, IStatus } from './channel';

export class StatusItem extends Widget {
  constructor() {
    super();
    this.addClass('nbdebug-StatusItem');
    this._dot = document.createElement('span');
    this._dot.className = 'nbdebug-StatusItem-dot';
    this._text = document.createElement('span');
    this._text.className = 'nbdebug-StatusItem-text';
    this.node.append(this._dot, this._text);
    this.setStatus(null);
  }

  /** Show `status` (null: nothing to show; the item is then inactive). */
  setStatus(status: IStatus | null): void {
    const group = processes(status);
    const state = group ? groupState(group) : status?.state ?? 'none';
    this.node.dataset.state = state;
    this._text.textContent = describe(status);
    this.node.title = tooltip(status);
  }

  private _dot: HTMLSpanElement;
  private _text: HTMLSpanElement;
}

/** The processes of a job with several connected, else null. */
function processes(status: IStatus | null): IProcessStatus[] | null {
  const group = status?.processes;
  return group && group.length > 1 ? group : null;
}

const URGENCY = ['failed', 'paused', 'running'];

/** The state of a group: the one that needs the user most. */
function groupState(group: IProcessStatus[]): string {
  for (const s of URGENCY) {
    if (group.some(p => p.state === s)) {
      return s;
    }
  }
  return group[0].state;
}

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

/** The item's text for a job's processes. */
function describeGroup(group: IProcessStatus[]): string {
  const counts = new Map<string, number>();
  for (const p of group) {
    counts.set(p.state, (counts.get(p.state) ?? 0) + 1);
  }
  const states = [...counts].map(([s, n]) => `${n} ${s}`).join(', ');
  const steps = group.map(p => (p.shown_step === undefined ? p.step : p.shown_step))
    .filter((s): s is number => s !== null && s !== undefined);
  const parts = [`nbdebug: ${group.length} processes`, states];
  if (steps.length) {
    const lo = Math.min(...steps);
    const hi = Math.max(...steps);
    parts.push(lo === hi ? `step ${lo}` : `steps ${lo}–${hi}`);
  }
  parts.push(plural(group.reduce((n, p) => n + p.hits, 0), 'hit'));
  return parts.join(' · ');
}

/** The item's text. */
export function describe(status: IStatus | null): string {
  if (status === null || status.state === 'none') {
    return 'nbdebug: no debugger';
  }
  const group = processes(status);
  if (group) {
    return describeGroup(group);
  }
  const parts = [`nbdebug: ${status.state}`, ...stepParts(status.state, status.step, status.shown_step)];
  parts.push(`${status.hits} hit${status.hits === 1 ? '' : 's'}`);
  return parts.join(' · ');
}

/**
 * The step words, with the panel header's one meaning of "step": first the step whose data is shown (the
 * header's Step, the step of the hits and of the pause reason), then — running or paused, when training is
 * at another step — `step N running` / `step N next`. Finished after steps 0–2 it reads `step 2`, as the
 * header does, never the index of a step that did not run.
 */
export function stepParts(state: string, step: number | null | undefined, shown: number | null | undefined): string[] {
  if (step === null || step === undefined) {
    return [];
  }
  if (shown === undefined) {
    return [`step ${step}`]; // an older kernel: only the step index
  }
  const live = state === 'running' || state === 'paused';
  const out = shown === null ? [] : [`step ${shown}`];
  if (live && shown !== step) {
    out.push(`step ${step} ${state === 'paused' ? 'next' : 'running'}`);
  }
  return out;
}

function tooltip(status: IStatus | null): string {
  if (status === null || status.state === 'none') {
    return 'nbdebug: no live Debugger in this kernel';
  }
  const group = processes(status);
  if (group) {
    return [`nbdebug (${status.framework ?? '?'}): ${group.length} processes of one job`]
      .concat(group.map(p => `${p.key}: ${p.state}, step ${p.step ?? '-'}, ${plural(p.hits, 'hit')}`))
      .join('\n');
  }
  const lines = [`nbdebug (${status.framework ?? '?'}): training is ${status.state}`];
  if (status.current_node) {
    lines.push(`at node ${status.current_node}`);
  }
  if (status.reason) {
    lines.push(status.reason);
  }
  return lines.join('\n');
}
