"""Tables that fit the terminal without cutting the values people type next.

`fitted(width, columns, rows)`: a rich `Table` where every `keep` column (run ids, cluster names,
costs) is shown whole on one line; when the table is wider than `width`, the columns with a `drop`
rank go first (highest rank first), and what is left wraps inside its column (folding long words
instead of ending them with "…").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from rich.console import JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text


SQUEEZE = 10  # the narrowest a wrapping column is made before a column is dropped


@dataclass(frozen=True)
class Col:
    header: str
    keep: bool = False  # shown whole, never wrapped or cut (what the user types next)
    drop: int | None = None  # may go when the table does not fit: the highest rank goes first
    justify: JustifyMethod = "left"


def _cell_width(value: object) -> int:
    text = value.plain if isinstance(value, Text) else str(value)
    return max((len(line) for line in text.splitlines()), default=0)


def fitted(width: int, columns: Sequence[Col], rows: Sequence[Sequence[RenderableType]], *, edge: bool = False,
           **table_kw: Any) -> Table:  # Any: rich's Table keyword arguments
    """The table for a console `width` columns wide (see the module's docstring)."""
    natural = [max([len(c.header), *(_cell_width(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    # what a column may be squeezed to before one goes: its whole width if kept, else ~10 (it wraps)
    least = [n if c.keep else min(n, max(SQUEEZE, *(len(w) for w in c.header.split())))
             for n, c in zip(natural, columns)]
    shown = list(range(len(columns)))

    def total(idx: list[int]) -> int:
        # rich: one space of padding each side of a cell, one rule between columns, two with edges
        return sum(least[i] + 2 for i in idx) + len(idx) - 1 + (2 if edge else 0)

    droppable = [i for _, i in sorted((-c.drop, i) for i, c in enumerate(columns) if c.drop is not None)]
    for i in droppable:
        if total(shown) <= width:
            break
        shown.remove(i)
    table = Table(show_edge=edge, **table_kw)
    for i in shown:
        c = columns[i]
        if c.keep:
            table.add_column(c.header, justify=c.justify, no_wrap=True, min_width=natural[i])
        else:
            table.add_column(c.header, justify=c.justify, overflow="fold")
    for r in rows:
        table.add_row(*(r[i] for i in shown))
    return table
