"""What a floor above adds to a lower one, loaded when the lower one is first asked.

A floor never names the floors above it. Where one of them adds to what a lower one holds (the
schedules built from blocks, in the schedule registry), the root `zbopt/__init__`, which wires the
floors, leaves a loader here under the lower module's name (`defer`), and that module runs it
(`load_deferred`) before its first lookup or listing. It is kept apart from the registry so that
`import zbopt` stays cheap: importing the registry loads every schedule family.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_LOADERS: dict[str, list[Callable[[], object]]] = {}
_LOADING = threading.RLock()  # threads asking at once wait for the loader, not past it


def defer(module: str, loader: Callable[[], object]) -> None:
    """Have the module named `module` call `loader()` once, before it first answers."""
    _LOADERS.setdefault(module, []).append(loader)


def load_deferred(module: str) -> None:
    """Run the loaders left for `module`, each once: each is taken off before it runs, so a loader
    that asks `module` itself does not run again; one that fails is put back, to fail again (with
    its reason) at the next lookup rather than leave the module silently short."""
    if module not in _LOADERS:
        return
    with _LOADING:
        pending = _LOADERS[module]
        while pending:
            loader = pending.pop(0)
            try:
                loader()
            except BaseException:
                pending.insert(0, loader)
                raise
