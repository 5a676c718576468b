/**
 * nbdebug for JupyterLab: training-control commands (palette, notebook toolbar, shortcuts) and a
 * status-bar item with the active debugger's state, step and hit count, live from the kernel.
 *
 * Toolbar buttons and shortcuts are declared in schema/plugin.json (`jupyter.lab.toolbars`,
 * `jupyter.lab.shortcuts`), so users can move or rebind them in the settings editor.
 */

import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  ISessionContext,
  Notification
} from '@jupyterlab/apputils';
import { IConsoleTracker } from '@jupyterlab/console';
import { INotebookTracker } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import {
  LabIcon,
  pauseIcon,
  stepIntoIcon,
  stepOverIcon
} from '@jupyterlab/ui-components';
import { Signal } from '@lumino/signaling';

import { DebuggerState, KernelChannel } from './channel';
import { continueIcon, terminateIcon } from './icons';
import { watchForStalePanels } from './stale';
import { StatusItem } from './status';



export { COMM_TARGET, KernelChannel, IStatus } from './channel';
export { describe } from './status';
export { markStale, BANNER_TEXT, STALE_CLASS } from './stale';

const PLUGIN_ID = 'nbdebug:plugin';

/** One training-control command: `nbdebug:<name>` runs `nbdebug.lab.command(name)`. */
export interface ICommandSpec {
  name: string;
  label: string;
  caption: string;
  icon: LabIcon;
  /** The states in which the command applies (it is disabled in the others). */
  states: DebuggerState[];
}

export const COMMANDS: ICommandSpec[] = [
  {
    name: 'continue',
    label: 'Continue Training',
    caption: 'nbdebug: continue training until the next watchpoint hit or the end',
    icon: continueIcon,
    states: ['paused']
  },
  {
    name: 'step',
    label: 'Run One Training Step',
    caption: 'nbdebug: run one more training step, then pause',
    icon: stepOverIcon,
    states: ['paused']
  },
  {
    name: 'next-node',
    label: 'Run to the Next Node',
    caption: 'nbdebug: execute one more node, then pause',
    icon: stepIntoIcon,
    states: ['paused']
  },
  {
    name: 'pause',
    label: 'Pause Training',
    caption: 'nbdebug: pause training at the next node',
    icon: pauseIcon,
    states: ['running']
  },
  {
    name: 'terminate',
    label: 'Terminate Training',
    caption: 'nbdebug: stop training cleanly (the model stays consistent)',
    icon: terminateIcon,
    states: ['running', 'paused']
  }
];

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'nbdebug training controls: continue/step/pause/terminate/next-node commands and a live status item',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, IStatusBar, IConsoleTracker],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    palette: ICommandPalette | null,
    statusBar: IStatusBar | null,
    consoles: IConsoleTracker | null
  ) => {
    const channels = new Map<Kernel.IKernelConnection, KernelChannel>();
    const activeChanged = new Signal<object, void>(plugin);
    const item = new StatusItem();

    const channelFor = (
      kernel: Kernel.IKernelConnection | null | undefined
    ): KernelChannel | null => {
      if (!kernel || kernel.isDisposed) {
        return null;
      }
      let channel = channels.get(kernel);
      if (!channel) {
        channel = new KernelChannel(kernel);
        channels.set(kernel, channel);
        channel.statusChanged.connect(refresh);
        kernel.disposed.connect(() => {
          channels.delete(kernel);
          refresh();
        });
      }
      return channel;
    };

    // Every kernel connection JupyterLab opens for a notebook or console gets the comm target, so
    // none of them rejects (closes) the kernel's status comm.
    const track = (sessionContext: ISessionContext) => {
      channelFor(sessionContext.session?.kernel);
      sessionContext.kernelChanged.connect((_, change) => {
        channelFor(change.newValue);
        refresh();
      });
    };
    notebooks.forEach(panel => {
      track(panel.sessionContext);
      watchForStalePanels(panel.sessionContext, panel.node);
    });
    notebooks.widgetAdded.connect((_, panel) => {
      track(panel.sessionContext);
      watchForStalePanels(panel.sessionContext, panel.node);
    });
    if (consoles) {
      consoles.forEach(panel => track(panel.sessionContext));
      consoles.widgetAdded.connect((_, panel) => track(panel.sessionContext));
    }

    /** The channel of the current notebook's kernel. */
    const current = (): KernelChannel | null =>
      channelFor(notebooks.currentWidget?.sessionContext.session?.kernel);

    const currentState = (): DebuggerState =>
      current()?.status?.state ?? 'none';

    function refresh(): void {
      item.setStatus(current()?.status ?? null);
      activeChanged.emit();
      for (const spec of COMMANDS) {
        app.commands.notifyCommandChanged(`nbdebug:${spec.name}`);
      }
    }
    notebooks.currentChanged.connect(refresh);

    for (const spec of COMMANDS) {
      const id = `nbdebug:${spec.name}`;
      app.commands.addCommand(id, {
        label: args => (args.toolbar ? '' : spec.label),
        caption: spec.caption,
        icon: spec.icon,
        // Toolbar buttons show only in notebooks whose kernel has a debugger; the palette always
        // lists the commands (disabled when they do not apply).
        isVisible: args => !args.toolbar || currentState() !== 'none',
        isEnabled: () => spec.states.includes(currentState()),
        execute: async () => {
          const channel = current();
          if (!channel || !spec.states.includes(currentState())) {
            return;
          }
          const result = await channel.run(spec.name);
          if (!result.ok) {
            Notification.error(`nbdebug ${spec.name}: ${result.message}`, {
              autoClose: 6000
            });
          }
        }
      });
      palette?.addItem({ command: id, category: 'nbdebug' });
    }

    if (statusBar) {
      statusBar.registerStatusItem(PLUGIN_ID, {
        item,
        align: 'left',
        rank: 4,
        isActive: () => currentState() !== 'none',
        activeStateChanged: activeChanged
      });
    }
    refresh();
  }
};

export default plugin;
