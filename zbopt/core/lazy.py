"""Public names of a package loaded on first use (PEP 562), so that importing the package is cheap.

`import zbopt` must not load numpy, OR-Tools or matplotlib (`zbopt --help` and a small simulation
start in a few tenths of a second), yet `zbopt.solve` and `zbopt.solvers.solve` are one attribute
away. A package lists its names and their modules once; this makes its `__getattr__`, `__dir__` and
`__all__` from that list.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable


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
