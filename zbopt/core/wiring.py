"""Where the floors meet without an import running upwards: names loaded on first use, a
result's views filled in from above, and loaders an upper floor leaves for a lower one.

- `lazy_names`: a package's public names load on first use (PEP 562), so `import zbopt` does not
  load numpy, OR-Tools or matplotlib (`zbopt --help` and a small simulation start in a few tenths of
  a second), yet `zbopt.solve` and `zbopt.solvers.solve` are one attribute away.
- `Shown`: results (`Simulation`, `SolveResult`, `Comparison`, `Frontier`) live on the ground and
  planning floors and know nothing of tables or charts; their `print()` text and Jupyter view are
  whatever the presentation floor registered with `register_views` (`zbopt.presentation.display`
  does, when `zbopt` is imported); until one has, a result prints as its repr.
- `defer`: where a floor above adds to what a lower one holds (the schedules built from blocks, in
  the schedule registry), the root `zbopt/__init__` leaves a loader under the lower module's name,
  and that module runs it (`load_deferred`) before its first lookup or listing; kept apart from the
  registry so that `import zbopt` stays cheap (importing the registry loads every schedule family).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable

from zbopt.core.errors import ZboptError

__all__ = ["Shown", "dataframe", "defer", "lazy_names", "load_deferred", "register_views"]


def lazy_names(package: str, public: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]],
                                                                list[str]]:
    """The `__getattr__`, `__dir__` and `__all__` of `package`, whose name `public` maps to its module.

    A name not in `public` that is one of the package's modules loads as that module, as
    `import package.name` would have made it an attribute.

    Examples
    --------
    >>> import zbopt.solvers
    >>> zbopt.solvers.lower_bounds.__module__
    'zbopt.solvers.bounds'
    """

    def __getattr__(name: str) -> object:
        module = public.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(public))

    return __getattr__, __dir__, sorted(public)


_VIEWS: dict[str, Callable[[object], str]] = {}


def register_views(*, text: Callable[[object], str], html: Callable[[object], str]) -> None:
    """Make `text(result)` what `print(result)` shows and `html(result)` what Jupyter shows."""
    _VIEWS.update(text=text, html=html)


class Shown:
    """A result that prints as the registered text view and shows in Jupyter as the HTML view."""

    def __str__(self) -> str:
        view = _VIEWS.get("text")
        return repr(self) if view is None else view(self)

    def _repr_html_(self) -> str | None:
        view = _VIEWS.get("html")
        return None if view is None else view(self)


def dataframe(rows: list[dict]):
    """`rows` as a pandas DataFrame; pandas is optional (a ZboptError says how to get it)."""
    try:
        import pandas
    except ImportError:
        raise ZboptError("to_dataframe() needs pandas: pip install pandas") from None
    return pandas.DataFrame(rows)


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
