/**
 * The slice of an anywidget / ipywidgets model the front end uses, and a static stand-in for it
 * (recorded traits + replayed messages) for export_html and saved-notebook snapshots.
 */

export type Msg = { type: string; [key: string]: unknown };
export type Handler = (...args: any[]) => void;

export interface WidgetModel {
  get(key: string): any;
  set(key: string, value: unknown): void;
  save_changes(): void;
  on(event: string, cb: Handler): void;
  off(event?: string, cb?: Handler): void;
  send(content: Msg, callbacks?: unknown, buffers?: ArrayBuffer[] | ArrayBufferView[]): void;
}

/** A model with no kernel behind it: traits from `state`, messages replayed from `messages`. */
export class StaticModel implements WidgetModel {
  private state: Record<string, any>;
  private handlers = new Map<string, Set<Handler>>();
  constructor(state: Record<string, any>, private messages: Msg[] = []) {
    this.state = { ...state };
  }
  get(key: string): any {
    return this.state[key];
  }
  set(key: string, value: unknown): void {
    this.state[key] = value;
    this.emit(`change:${key}`, this, value);
  }
  save_changes(): void {}
  on(event: string, cb: Handler): void {
    let set = this.handlers.get(event);
    if (!set) this.handlers.set(event, (set = new Set()));
    set.add(cb);
  }
  off(event?: string, cb?: Handler): void {
    if (!event) this.handlers.clear();
    else if (!cb) this.handlers.delete(event);
    else this.handlers.get(event)?.delete(cb);
  }
  /** Answers `hello` by replaying the recorded messages (their `buffers_b64` decoded into the buffers
   * argument, as a kernel would send them); everything else has no kernel to go to. */
  send(content: Msg): void {
    if (content.type === 'hello') {
      for (const m of this.messages) {
        const { buffers_b64, ...rest } = m as Msg & { buffers_b64?: string[] };
        this.emit('msg:custom', rest, (buffers_b64 ?? []).map(decodeBase64));
      }
    }
  }
  private emit(event: string, ...args: unknown[]): void {
    for (const cb of [...(this.handlers.get(event) ?? [])]) cb(...args);
  }
}

function decodeBase64(text: string): DataView {
  const bin = atob(text);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return new DataView(bytes.buffer);
}
