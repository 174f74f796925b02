"""Rich tables that stay readable in an 80-column terminal (an SSH session on a Jetson, a CI log).

Rules: no borders but the header rule, two spaces between columns; identifiers (layer, device and output
names) are not cut or broken unless nothing else makes the table fit, and then they are broken after a
separator (``layers.0.self_attn.`` / ``q_proj``) rather than cut; numbers never wrap; free text wraps at word
boundaries in the width that is left; headers break at ``\\n`` where they are wider than their data. Print a
table through ``Fit``; give identifier cells as ``Ident``. ``Grid`` also says, once above the table, the
values that every row shares where the table would not fit otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

KEY_MIN = 12  # an identifier column is never folded narrower than this


_MAJOR = re.compile(r"(?<=[./:])")  # break after these first
_MINOR = re.compile(r"(?<=[_\-])")  # then after these


def _pack(pieces: list[str], width: int) -> list[str]:
    lines = [""]
    for piece in pieces:
        if lines[-1] and cell_len(lines[-1] + piece) > width:
            lines.append("")
        lines[-1] += piece
    return lines


def wrap_ident(name: str, width: int) -> list[str]:
    """``name`` in lines of at most ``width`` cells, broken after ``.``, ``/`` or ``:`` where possible, else
    after ``_`` or ``-``, else anywhere (a piece wider than ``width``)."""
    width = max(1, width)
    out: list[str] = []
    for line in _pack([p for p in _MAJOR.split(name) if p], width):
        for part in ([line] if cell_len(line) <= width else _pack([p for p in _MINOR.split(line) if p], width)):
            while cell_len(part) > width:  # one piece is still too wide: fold it
                out.append(part[:width])
                part = part[width:]
            out.append(part)
    return out


class Ident:
    """An identifier cell: whole where its column is wide enough, else broken by ``wrap_ident``."""

    def __init__(self, text):
        self.text = str(text)

    def __str__(self) -> str:
        return self.text

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        n = cell_len(self.text)
        return Measurement(n, n)

    def __rich_console__(self, console: Console, options: ConsoleOptions):
        for line in wrap_ident(self.text, options.max_width):
            yield Text(line, no_wrap=True)


def grouped_notes(notes: list[tuple[str, str]], every: int | None = None) -> list[str]:
    """``(name, note)`` pairs as lines, one per distinct note in first-seen order: ``name: note`` for one
    name, ``N layers (first ... last): note`` for several (``every layer: note`` when they are all ``every``
    layers of the table)."""
    by_note: dict[str, list[str]] = {}
    for name, note in notes:
        by_note.setdefault(note, []).append(name)
    lines = []
    for note, names in by_note.items():
        if len(names) == 1:
            who = names[0]
        elif every is not None and len(names) == every:
            who = "every layer"
        else:
            who = f"{len(names)} layers ({names[0]}{', ' if len(names) == 2 else ' ... '}{names[-1]})"
        lines.append(f"{who}: {note}")
    return lines


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


@dataclass
class _Spec:
    header: str
    kind: str  # key | num | text
    justify: str
    shared: bool  # may be said once above the table when every row has the same value


class Grid:
    """A table built at render time: where it is wider than the terminal, ``shared`` columns that hold one
    value in every row leave it, in column order until it fits (or none is left), and are said once on a
    line under the title; then ``Fit``."""

    def __init__(self, title: str):
        self.title, self.specs, self.rows = title, [], []

    def key(self, header: str) -> None:
        self.specs.append(_Spec(header, "key", "left", False))

    def num(self, header: str, justify: str = "right", shared: bool = True) -> None:
        self.specs.append(_Spec(header, "num", justify, shared))

    def text(self, header: str, shared: bool = True) -> None:
        self.specs.append(_Spec(header, "text", "left", shared))

    def add_row(self, *cells: str) -> None:
        if len(cells) != len(self.specs):
            raise ValueError(f"{len(cells)} cells for {len(self.specs)} columns")
        self.rows.append([str(c) for c in cells])

    def shared(self) -> list[int]:
        """Columns that may leave the table: shared ones with one value in every row (two rows or more)."""
        if len(self.rows) < 2:
            return []
        return [i for i, s in enumerate(self.specs) if s.shared and len({r[i] for r in self.rows}) == 1]

    def table(self, drop: tuple[int, ...] = (), title: str | None = None) -> Table:
        keep = [i for i in range(len(self.specs)) if i not in drop]
        t = compact_table(title)
        for i in keep:
            s = self.specs[i]
            if s.kind == "key":
                key_column(t, s.header, [r[i] for r in self.rows])
            elif s.kind == "num":
                num_column(t, s.header, s.justify)
            else:
                text_column(t, s.header)
        for r in self.rows:
            t.add_row(*(Ident(r[i]) if self.specs[i].kind == "key" else Text(r[i]) for i in keep))  # not markup
        return t

    def __rich_console__(self, console: Console, options: ConsoleOptions):
        drop: tuple[int, ...] = ()
        for i in self.shared():  # leave out as few as make it fit, in column order
            if natural_width(console, options, self.table(drop))[1] <= options.max_width:
                break
            drop += (i,)
        if not drop:
            yield Fit(self.table(title=self.title), keys=self._keys(()))
            return
        said = ", ".join(f"{self.specs[i].header.replace(chr(10), ' ')} {self.rows[0][i]}" for i in drop)
        yield Text(self.title)
        yield Padding(Text(f"every row: {said}"), (0, 0, 0, 2))
        yield Fit(self.table(drop), keys=self._keys(drop))

    def _keys(self, drop: tuple[int, ...]) -> tuple[int, ...]:
        keep = [i for i in range(len(self.specs)) if i not in drop]
        return tuple(j for j, i in enumerate(keep) if self.specs[i].kind == "key")
