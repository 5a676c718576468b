/**
 * nbdebug's front end: one ES module for every interactive picture of the panel.
 * See ../PROTOCOL.md for the traits and messages.
 */
import { renderGraph } from './graph';
import { renderHeatmap } from './heatmap';
import { renderHits } from './hits';
import { renderRelations } from './relations';
import { renderTimeline } from './timeline';
import { StaticModel, WidgetModel, Msg } from './model';

type Cleanup = () => void;
type Renderer = (model: WidgetModel, el: HTMLElement) => Cleanup | void;

const RENDERERS: Record<string, Renderer> = {
  graph: renderGraph,
  heatmap: renderHeatmap,
  hits: renderHits,
  relations: renderRelations,
  timeline: renderTimeline
};

export function render({ model, el }: { model: WidgetModel; el: HTMLElement }): Cleanup | void {
  const view = String(model.get('view') ?? 'graph');
  const r = RENDERERS[view];
  if (!r) {
    el.textContent = `nbdebug: unknown view ${JSON.stringify(view)}`;
    return;
  }
  el.classList.add('nbdebug-ui', `nbdebug-ui-${view}`);
  return r(model, el);
}

/** Draw a recorded widget (traits + messages) with no kernel: export_html and notebook snapshots. */
export function renderStatic(el: HTMLElement, data: { state: Record<string, any>; messages: Msg[] }): Cleanup | void {
  return render({ model: new StaticModel({ ...data.state, status: data.state.status ?? 'offline' }, data.messages), el });
}

export const version = '0.1.0';
export default { render };
