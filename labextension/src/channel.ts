/**
 * One kernel's link to nbdebug: the `nbdebug.status` comm the kernel opens (status in), and
 * command execution (commands out).
 *
 * Status: the kernel side (`nbdebug.lab.channel`) opens a comm with target `nbdebug.status` when a
 * Debugger is created and sends `{status: {...}}` whenever the state, step or hit count changes.
 * A page opened later finds the comm with `comm_info_request` and asks for the status.
 *
 * Commands: `__import__("nbdebug.lab").lab.command(name)` is executed silently (no history, no
 * output) on a kernel subshell of its own when the kernel supports subshells (JEP 91, ipykernel 7),
 * so a command arrives even while the main shell is busy; otherwise on the main shell, which is
 * free while `dbg.run(...)` trains in its worker thread.
 */

import { Kernel, KernelMessage } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

export const COMM_TARGET = 'nbdebug.status';

/** The states of `nbdebug.control.State`, plus `none` when the kernel has no live debugger. */
export type DebuggerState =
  | 'none'
  | 'idle'
  | 'running'
  | 'paused'
  | 'finished'
  | 'terminated'
  | 'failed';

/** What `nbdebug.lab.status()` returns in the kernel. */
export interface IStatus {
  state: DebuggerState;
  step: number | null;
  /** The step whose data the panel shows (hits, pause reason); null before any. */
  shown_step?: number | null;
  hits: number;
  current_node: string | null;
  reason: string;
  framework: string | null;
  /** Every process of the job when several are connected to one listener (ranks): key = rank or host:pid. */
  processes?: IProcessStatus[];
}

/** One process of a job in the status. */
export interface IProcessStatus {
  key: string;
  state: string;
  step: number | null;
  /** the step whose data is shown (the panel header's Step); absent from older kernels */
  shown_step?: number | null;
  hits: number;
}

/** The outcome of one command: ok, or the kernel's error message. */
export interface ICommandResult {
  ok: boolean;
  message: string;
}

export class KernelChannel implements IDisposable {
  constructor(kernel: Kernel.IKernelConnection) {
    this.kernel = kernel;
    this._onCommOpen = (comm, msg) => {
      this._attach(comm, msg.content.data as any);
    };
    kernel.registerCommTarget(COMM_TARGET, this._onCommOpen);
    kernel.connectionStatusChanged.connect(this._onConnection, this);
    kernel.statusChanged.connect(this._onKernelStatus, this);
    kernel.disposed.connect(() => this.dispose());
    if (kernel.connectionStatus === 'connected') {
      void this._discover();
    }
  }

  readonly kernel: Kernel.IKernelConnection;

  /** The latest status; null until the kernel announced a debugger. */
  get status(): IStatus | null {
    return this._status;
  }

  get statusChanged(): ISignal<this, IStatus | null> {
    return this._statusChanged;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    if (!this.kernel.isDisposed) {
      this.kernel.removeCommTarget(COMM_TARGET, this._onCommOpen);
      this.kernel.connectionStatusChanged.disconnect(this._onConnection, this);
      this.kernel.statusChanged.disconnect(this._onKernelStatus, this);
    }
    Signal.clearData(this);
  }

  /** Run `nbdebug.lab.command(name)` in the kernel. */
  async run(name: string): Promise<ICommandResult> {
    const code = `__import__("nbdebug.lab").lab.command(${JSON.stringify(name)})`;
    let subshell = await this._subshell();
    let reply = await this._execute(code, subshell);
    if (
      subshell !== null &&
      reply.content.status === 'error' &&
      (reply.content as any).ename === 'UnknownSubshellError'
    ) {
      // The subshell went away (kernel restarted under us): make a new one, try once more.
      this._subshellId = null;
      subshell = await this._subshell();
      reply = await this._execute(code, subshell);
    }
    if (reply.content.status === 'ok') {
      return { ok: true, message: '' };
    }
    const content = reply.content as any;
    return {
      ok: false,
      message: content.evalue ? String(content.evalue) : String(content.status)
    };
  }

  /** Whether commands go to a subshell of their own (resolves once kernel info is known). */
  async usesSubshell(): Promise<boolean> {
    return (await this._subshell()) !== null;
  }

  private async _execute(
    code: string,
    subshellId: string | null
  ): Promise<KernelMessage.IExecuteReplyMsg> {
    const content: KernelMessage.IExecuteRequestMsg['content'] = {
      code,
      silent: true,
      store_history: false,
      user_expressions: {},
      allow_stdin: false,
      stop_on_error: false
    };
    if (subshellId === null) {
      const future = this.kernel.requestExecute(content, true);
      return (await future.done) as KernelMessage.IExecuteReplyMsg;
    }
    const msg = KernelMessage.createMessage<KernelMessage.IExecuteRequestMsg>({
      msgType: 'execute_request',
      channel: 'shell',
      username: this.kernel.username,
      session: this.kernel.clientId,
      subshellId,
      content
    });
    const future = this.kernel.sendShellMessage(msg, true, true);
    return (await future.done) as KernelMessage.IExecuteReplyMsg;
  }

  private async _subshell(): Promise<string | null> {
    await this.kernel.info;
    if (!this.kernel.supportsSubshells) {
      return null;
    }
    if (this._subshellId === null) {
      this._subshellId = this.kernel
        .requestCreateSubshell({})
        .done.then(reply => reply.content.subshell_id)
        .catch(reason => {
          console.warn('nbdebug: no kernel subshell, commands use the main shell', reason);
          return null;
        });
    }
    return this._subshellId;
  }

  private _attach(comm: Kernel.IComm, data: any): void {
    this._comms.add(comm.commId);
    comm.onMsg = msg => {
      const status = (msg.content.data as any)?.status;
      if (status) {
        this._setStatus(status as IStatus);
      }
    };
    comm.onClose = () => {
      this._comms.delete(comm.commId);
      if (this._comms.size === 0) {
        this._setStatus(null);
      }
    };
    if (data?.status) {
      this._setStatus(data.status as IStatus);
    }
  }

  /** Attach to a comm the kernel opened before this page connected (a reload) and ask for status. */
  private async _discover(): Promise<void> {
    let reply: KernelMessage.ICommInfoReplyMsg;
    try {
      reply = await this.kernel.requestCommInfo({ target_name: COMM_TARGET });
    } catch (reason) {
      return; // kernel gone or restarting; the next connection retries
    }
    if (this._isDisposed || reply.content.status !== 'ok') {
      return;
    }
    for (const commId of Object.keys(reply.content.comms)) {
      if (this.kernel.hasComm(commId)) {
        continue;
      }
      const comm = this.kernel.createComm(COMM_TARGET, commId);
      this._attach(comm, null);
      comm.send({ request: 'status' });
    }
  }

  private _onConnection(_: Kernel.IKernelConnection, status: Kernel.ConnectionStatus): void {
    if (status === 'connected') {
      void this._discover();
    }
  }

  private _onKernelStatus(_: Kernel.IKernelConnection, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._comms.clear();
      this._subshellId = null;
      this._setStatus(null);
    }
  }

  private _setStatus(status: IStatus | null): void {
    this._status = status;
    this._statusChanged.emit(status);
  }

  private _onCommOpen: (comm: Kernel.IComm, msg: KernelMessage.ICommOpenMsg) => void;
  private _status: IStatus | null = null;
  private _statusChanged = new Signal<this, IStatus | null>(this);
  private _comms = new Set<string>();
  private _subshellId: Promise<string | null> | null = null;
  private _isDisposed = false;
}
