/**
 * Stale panels: when a notebook's kernel restarts or shuts down, every nbdebug panel already in that
 * notebook belongs to a kernel that is gone (its widgets talk to nothing, its state is frozen). Each
 * `.nbdebug-panel` in the notebook gets the class `nbdebug-stale` and a banner
 * (`.nbdebug-stale-banner`) saying so; the CSS greys the rest and makes it inert. Panels created after
 * the restart are live and untouched.
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { Kernel } from '@jupyterlab/services';

export const STALE_CLASS = 'nbdebug-stale';
export const BANNER_CLASS = 'nbdebug-stale-banner';
export const BANNER_TEXT =
  'kernel restarted — this panel is no longer live; run the cell again';

/** Mark every live nbdebug panel under `root` stale; returns how many were marked. */
export function markStale(root: HTMLElement, text: string = BANNER_TEXT): number {
  let n = 0;
  root.querySelectorAll<HTMLElement>('.nbdebug-panel').forEach(panel => {
    if (panel.classList.contains(STALE_CLASS)) {
      return;
    }
    panel.classList.add(STALE_CLASS);
    const banner = document.createElement('div');
    banner.className = BANNER_CLASS;
    banner.setAttribute('role', 'status');
    banner.textContent = text;
    panel.prepend(banner);
    n += 1;
  });
  return n;
}

/** Watch a notebook's session: on restart, shutdown or kernel change, mark its panels stale. */
export function watchForStalePanels(sessionContext: ISessionContext, root: HTMLElement): void {
  let kernel: Kernel.IKernelConnection | null = sessionContext.session?.kernel ?? null;
  const onStatus = (_: unknown, status: Kernel.Status): void => {
    if (status === 'restarting' || status === 'autorestarting') {
      markStale(root);
    } else if (status === 'dead') {
      markStale(root, 'kernel shut down — this panel is no longer live; start a kernel and run the cell again');
    }
  };
  const follow = (next: Kernel.IKernelConnection | null): void => {
    if (kernel) {
      kernel.statusChanged.disconnect(onStatus);
    }
    kernel = next;
    if (kernel) {
      kernel.statusChanged.connect(onStatus);
    }
  };
  follow(kernel);
  sessionContext.kernelChanged.connect((_, change) => {
    if (change.oldValue) {
      markStale(
        root,
        change.newValue
          ? BANNER_TEXT
          : 'kernel shut down — this panel is no longer live; start a kernel and run the cell again'
      );
    }
    follow(change.newValue ?? null);
  });
}
