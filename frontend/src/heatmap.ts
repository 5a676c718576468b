import { WidgetModel } from './model';

/** Placeholder: the heatmap view is being written (see ../PROTOCOL.md). */
export function renderHeatmap(model: WidgetModel, el: HTMLElement): () => void {
  el.textContent = 'nbdebug heatmap view';
  return () => { el.textContent = ''; };
}
