"""Where a handler runs: the model dir as the working directory for a call, the caller's after it.

TorchServe's frontend starts each worker process in its model dir, so handlers open relative
paths (``os.path.isfile("vocab.txt")``) and find them. In a notebook the same handler runs in
the kernel's process, whose working directory is the notebook's: :class:`Directories` moves into
the model dir for a call and back after it, and says so when a handler moved elsewhere
(:class:`handlerkit.service.Service` uses it with ``working_dir="call"``).
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref

from handlerkit._stack import user_stacklevel
from handlerkit.errors import HandlerkitWarning

__all__ = ["Directories"]

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


class Directories:
    """``working_dir="call"``: into the model dir for a call, back to the caller's directory
    after it, and a word when the handler moved elsewhere. Blocks nest: only the outermost moves.

    Both directories are held open, so each move is an ``fchdir`` (no path walked; a third of a
    ``chdir``'s cost here, and this runs around every batch); the caller's is opened again only
    when it changed since the last call. Where ``fchdir`` does not exist, paths are used.
    """

    __slots__ = ("__weakref__", "depth", "fds", "home", "previous", "warned")

    def __init__(self, home: str) -> None:
        self.home = home
        self.depth = 0
        self.previous: str | None = None
        self.fds: list[int | None] = [_open_dir(home), None]  # the model dir's, the caller's
        self.warned: set[str] = set()
        weakref.finalize(self, _close_fds, self.fds)

    def enter(self) -> None:
        if self.depth == 0:
            previous = os.getcwd()
            if previous != self.previous:  # the caller moved since the last call
                _close_fds(self.fds[1:])
                self.previous, self.fds[1] = previous, _open_dir(previous)
            if previous != self.home:
                _change_dir(self.fds[0], self.home)
        self.depth += 1

    def leave(self, label: str) -> None:
        self.depth -= 1
        if self.depth:
            return
        try:
            now = os.getcwd()
        except FileNotFoundError:  # the handler moved into a directory removed since
            now = "(a removed directory)"
        if now != self.home and now not in self.warned:
            self.warned.add(now)
            warnings.warn(
                f"handlerkit: {label} changed the working directory to {now}; TorchServe's worker runs "
                f"in the model dir ({self.home}) and stays wherever a handler moves it, so relative paths "
                f"in later calls would look elsewhere. handlerkit put it back",
                HandlerkitWarning,
                stacklevel=user_stacklevel(),
            )
        if self.previous is not None and now != self.previous:
            _change_dir(self.fds[1], self.previous)

    def close(self) -> None:
        _close_fds(self.fds)
        self.fds[:] = [None, None]
        self.previous = None


def _open_dir(path: str) -> int | None:
    """A descriptor of the directory for ``fchdir``, or None (no ``fchdir`` here, or refused)."""
    if not hasattr(os, "fchdir"):
        return None
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError:
        return None


def _change_dir(fd: int | None, path: str) -> None:
    if fd is not None:
        os.fchdir(fd)
    else:
        os.chdir(path)


def _close_fds(fds: list[int | None]) -> None:
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
