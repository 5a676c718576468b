import { WidgetModel } from './model';

/** Placeholder: the relations view is being written (see ../PROTOCOL.md). */
export function renderRelations(model: WidgetModel, el: HTMLElement): () => void {
  el.textContent = 'nbdebug relations view';
  return () => { el.textContent = ''; };
}
