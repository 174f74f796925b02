"""Rich tables that stay readable in an 80-column terminal (an SSH session on a Jetson, a CI log).

Rules: no borders but the header rule, two spaces between columns; identifiers (layer, device and output
names) are not cut or broken unless nothing else makes the table fit, and then they are folded onto more
lines rather than cut; numbers never wrap; free text wraps at word boundaries in the width that is left;
headers break at ``\\n`` where they are wider than their data. Print a table through ``Fit``.
"""

from __future__ import annotations

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions
from rich.measure import Measurement
from rich.table import Table

KEY_MIN = 12  # an identifier column is never folded narrower than this


def compact_table(title: str | None = None) -> Table:
    """A table with a left-aligned title and only a rule under its header."""
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                 padding=(0, 1), collapse_padding=True)


def key_column(t: Table, header: str, values) -> None:
    """An identifier column, as wide as its widest value."""
    width = max([cell_len(str(v)) for v in values] + [cell_len(h) for h in header.split("\n")])
    t.add_column(header, no_wrap=True, overflow="fold", min_width=width)


def num_column(t: Table, header: str, justify: str = "right") -> None:
    """A short value (number, yes/no, shape, dtype): never wrapped."""
    t.add_column(header, justify=justify, no_wrap=True)


def text_column(t: Table, header: str) -> None:
    """Free text: wraps at word boundaries (long words are folded)."""
    t.add_column(header, overflow="fold")


def natural_width(console: Console, options: ConsoleOptions, renderable) -> tuple[int, int]:
    """(narrowest, widest) width of ``renderable`` without the console's limit."""
    m = Measurement.get(console, options.update_width(1 << 16), renderable)
    return m.minimum, m.maximum


class Fit:
    """``table`` within the console's width: where it does not fit even with its text wrapped, its
    identifier columns (``keys``, column indices) are folded, down to ``KEY_MIN``, before rich would cut
    numbers short."""

    def __init__(self, table: Table, keys: tuple[int, ...] = (0,)):
        self.table, self.keys = table, keys

    def __rich_console__(self, console: Console, options: ConsoleOptions):
        excess = natural_width(console, options, self.table)[0] - options.max_width
        for i in self.keys:
            c = self.table.columns[i]
            cut = min(excess, (c.min_width or 0) - KEY_MIN)
            if cut > 0:
                c.width = c.min_width = c.min_width - cut
                c.no_wrap = False
                excess -= cut
        yield self.table
