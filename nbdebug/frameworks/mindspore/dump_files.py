"""The live kernel dump's files on disk: finding each graph run's new files, deleting old ones.

MindSpore writes a new ``{net}/{graph}/{iteration}`` directory per run of a graph and never removes one, so
after a thousand steps a thousand directories exist. :class:`DumpScanner` lists, on every call, only the
directories MindSpore may still write into: a directory is finished once it has been read and a later
iteration of the same graph exists (a graph's iteration counter only grows; it does not always advance
between runs, so the newest directory of each graph stays open). A finished directory is removed once its
files are gone (``rmdir`` of an empty directory; one still holding files is tried again at the next call),
so what each call lists stays the size of one step, not of the whole run. :class:`FileRemover` deletes files on a
background thread, so a step does not wait for a hundred ``unlink`` calls; ``flush()`` waits for it.
Needs no MindSpore.

>>> import os, tempfile
>>> rank = tempfile.mkdtemp(); d = os.path.join(rank, "Net", "0", "0"); os.makedirs(d)
>>> open(os.path.join(d, "a.npy"), "w").close()
>>> s = DumpScanner(rank); [(it, g, names) for it, g, _p, names in s.new_files()]
[(0, 0, ['a.npy'])]
>>> s.new_files()
[]
>>> e = os.path.join(rank, "Net", "0", "1"); os.makedirs(e); os.remove(os.path.join(d, "a.npy"))
>>> [it for it, _g, _p, _n in s.new_files()], os.path.isdir(d)  # iteration 0 finished, emptied: removed
([], True)
>>> s.new_files(), os.path.isdir(d)
([], False)
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterable

from .kernel_load import graph_dirs


class DumpScanner:
    """New ``.npy`` files of one ``rank_{r}`` directory since the last call (see the module docstring)."""

    def __init__(self, rank_dir: str) -> None:
        self.rank_dir = rank_dir
        #: open directories: path -> (iteration, graph id, names already returned)
        self._open: dict[str, tuple[int, int, set[str]]] = {}
        self._finished: set[str] = set()  # finished directories not removed yet (files left in them)

    def _discover(self) -> None:
        for path in list(self._finished):
            try:
                os.rmdir(path)  # empty once the files read from it are deleted
            except FileNotFoundError:
                pass
            except OSError:  # files left (not deleted yet, or someone else's): kept, never read again
                continue
            self._finished.discard(path)
        for g, gdir in graph_dirs(self.rank_dir):
            try:
                its = os.listdir(gdir)
            except OSError:
                continue
            for it in its:
                path = os.path.join(gdir, it)
                if it.isdigit() and path not in self._open and path not in self._finished and os.path.isdir(path):
                    self._open[path] = (int(it), g, set())

    def new_files(self) -> list[tuple[int, int, str, list[str]]]:
        """``(iteration, graph id, directory, new file names)``, in (iteration, graph) order."""
        self._discover()
        out = []
        newest: dict[int, int] = {}
        for it, g, _ in self._open.values():
            newest[g] = max(newest.get(g, it), it)
        for path, (it, g, done) in sorted(self._open.items(), key=lambda kv: (kv[1][0], kv[1][1])):
            try:
                names = {f for f in os.listdir(path) if f.endswith(".npy")}
            except OSError:
                names = set()
            done &= names  # forget what was deleted
            new = sorted(names - done)
            if new:
                done.update(new)
                out.append((it, g, path, new))
            if it < newest[g]:  # MindSpore has moved on to a later iteration of this graph
                self._finished.add(path)
                del self._open[path]
        return out


class FileRemover:
    """Deletes files on a daemon thread; :meth:`flush` waits until everything queued is gone."""

    def __init__(self) -> None:
        self._queue: queue.Queue[list[str] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def remove(self, paths: Iterable[str]) -> None:
        batch = list(paths)
        if not batch:
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="nbdebug-dump-remover", daemon=True)
                self._thread.start()
        self._queue.put(batch)

    def flush(self) -> None:
        self._queue.join()

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                for p in batch or ():
                    try:
                        os.remove(p)
                    except OSError:
                        pass
            finally:
                self._queue.task_done()
