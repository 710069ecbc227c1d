"""How a result shows itself, filled in from above.

Results (`Simulation`, `SolveResult`, `Comparison`, `Frontier`) live on the ground and planning
floors and know nothing of tables or charts. They inherit `Shown`, whose `print()` text and
Jupyter view are whatever the presentation floor registered with `register_views` (`zbopt.presentation.display`
does, when `zbopt` is imported); until one has, a result prints as its repr.
"""

from __future__ import annotations

from collections.abc import Callable

from zbopt.core.errors import ZboptError

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
