/**
 * One graph per widget model, shared by every view of it: the data (graph-data.ts), the per-scope
 * layout cache (layout.ts) and the last hover cards. A second view of the same model draws at once.
 *
 * Views each listen to `msg:custom` (anywidget removes a view's listeners with the view); a message
 * object is applied once however many views hear it.
 */
import { GraphData } from './graph-data';
import { Layouts } from './layout';
import { WidgetModel } from './model';

export interface StoreListener {
  onData(kind: 'graph' | 'marks' | 'card' | 'command', msg: any): void;
}

export class GraphStore {
  data = new GraphData();
  layouts = new Layouts(this.data);
  cards = new Map<string, [string, string][]>();
  views = new Set<StoreListener>();
  private seen = new WeakSet<object>();

  /** Handle one kernel message; `model` is the one to answer a rev gap on. */
  receive(model: WidgetModel, msg: any): void {
    if (!msg || typeof msg !== 'object') return;
    if (this.seen.has(msg)) return;
    this.seen.add(msg);
    switch (msg.type) {
      case 'graph':
        // applied again even at the same rev (a kernel may start counting anew); scopes whose contents
        // did not change keep their cached layouts (graph-data.ts versions)
        this.data.setGraph(msg);
        this.notify('graph', msg);
        break;
      case 'delta':
        if (!this.data.applyDelta(msg)) {
          model.send({ type: 'hello', rev: this.data.rev });
          return;
        }
        this.notify('graph', msg);
        break;
      case 'marks':
        this.data.setMarks(msg);
        this.notify('marks', msg);
        break;
      case 'card':
        this.cards.set(String(msg.name), (msg.rows ?? []).map((r: any) => [String(r[0]), String(r[1])]));
        this.notify('card', msg);
        break;
      case 'command':
        this.notify('command', msg);
        break;
    }
  }

  private notify(kind: 'graph' | 'marks' | 'card' | 'command', msg: any): void {
    for (const v of [...this.views]) v.onData(kind, msg);
  }
}

const byModel = new WeakMap<object, GraphStore>();
const byUid = new Map<string, GraphStore>();

/**
 * The store of `model`. anywidget hands each view its own proxy of the model, so where the model has
 * a `uid` trait (a string unique per widget) the store is found by it; otherwise by the model object.
 */
export function storeFor(model: WidgetModel): GraphStore {
  let uid: unknown;
  try { uid = model.get('uid'); } catch { uid = undefined; }
  if (typeof uid === 'string' && uid) {
    let s = byUid.get(uid);
    if (!s) byUid.set(uid, (s = new GraphStore()));
    return s;
  }
  let s = byModel.get(model);
  if (!s) byModel.set(model, (s = new GraphStore()));
  return s;
}
