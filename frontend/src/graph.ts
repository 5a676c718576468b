import { WidgetModel } from './model';

/** Placeholder: the graph view is being written (see ../PROTOCOL.md). */
export function renderGraph(model: WidgetModel, el: HTMLElement): () => void {
  el.textContent = 'nbdebug graph view';
  return () => { el.textContent = ''; };
}
