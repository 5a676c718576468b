/**
 * The status-bar item: the active debugger's state, step and hit count, e.g.
 * `nbdebug: paused · step 3 · step 4 next · 2 hits`. Its `data-state` attribute carries the raw state.
 *
 * Steps follow the panel header's convention: paused at a step boundary (after the watchpoints fired on
 * the step that just ended) it names the step whose data is shown — the step of the hits and of the
 * pause reason — and then the step that runs next; otherwise the step in progress.
 */

import { Widget } from '@lumino/widgets';

import { IStatus } from './channel';

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
    const state = status?.state ?? 'none';
    this.node.dataset.state = state;
    this._text.textContent = describe(status);
    this.node.title = tooltip(status);
  }

  private _dot: HTMLSpanElement;
  private _text: HTMLSpanElement;
}

/** The item's text. */
export function describe(status: IStatus | null): string {
  if (status === null || status.state === 'none') {
    return 'nbdebug: no debugger';
  }
  const parts = [`nbdebug: ${status.state}`];
  if (status.step !== null && status.step !== undefined) {
    const shown = status.shown_step;
    if (status.state === 'paused' && shown !== undefined && shown !== status.step) {
      if (shown !== null) {
        parts.push(`step ${shown}`);
      }
      parts.push(`step ${status.step} next`);
    } else {
      parts.push(`step ${status.step}`);
    }
  }
  parts.push(`${status.hits} hit${status.hits === 1 ? '' : 's'}`);
  return parts.join(' · ');
}

function tooltip(status: IStatus | null): string {
  if (status === null || status.state === 'none') {
    return 'nbdebug: no live Debugger in this kernel';
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
