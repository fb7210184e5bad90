"""Progress bars that suit where they are written: tqdm's redrawn bar on a terminal; in a log or a
pipe, where each ``\\r`` redraw would be kept, one plain line at every ``LINE_EVERY_PERCENT`` of the
total (and a last line at the end)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sized
from typing import Any, TextIO

LINE_EVERY_PERCENT = 10


def progress_bar(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
                 initial: int = 0, disable: bool = False, file: TextIO | None = None):
    """A tqdm bar where ``file`` (default stderr) is a terminal, else a ``LineProgress``; both take
    the same calls (``update``, ``set_postfix``, ``set_description``, ``reset``, ``write``, ``close``,
    iteration). ``disable``: no output (tqdm's own disabled bar)."""
    from tqdm import tqdm

    stream = file or sys.stderr
    if disable or stream.isatty():
        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, disable=disable, file=stream)
    return LineProgress(iterable, total=total, desc=desc, unit=unit, initial=initial, file=stream)


class LineProgress:
    """tqdm's calls, printed as whole lines: ``desc: n/total unit (p%), s s, postfix`` each time the
    count reaches the next ``every_percent`` of the total (every ``every_percent`` items when the
    total is unknown), never with a carriage return. A line waits for the ``set_postfix`` that
    follows its ``update`` (or the next update, or ``close``), so it shows that item's figures."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
                 initial: int = 0, file: TextIO | None = None, every_percent: int = LINE_EVERY_PERCENT) -> None:
        self.iterable = iterable
        self.total = total if total is not None or not isinstance(iterable, Sized) else len(iterable)
        self.desc, self.unit, self.n, self.file = desc, unit, initial, file
        self.every_percent = every_percent
        self.postfix = ""
        self.started = time.perf_counter()
        self.shown = self._mark(initial)  # the last mark a line was printed at
        self.printed = initial  # the count its last line showed
        self.due = False  # the count reached a mark whose line waits for set_postfix

    def _mark(self, n: int) -> int:
        if self.total:
            return n * 100 // self.total // self.every_percent
        return n // self.every_percent

    def _line(self) -> None:
        done = f"{self.n}/{self.total}" if self.total else str(self.n)
        percent = f" ({self.n * 100 // self.total}%)" if self.total else ""
        print(f"{self.desc}: {done} {self.unit}{percent}, {time.perf_counter() - self.started:.0f} s{self.postfix}",
              file=self.file or sys.stderr, flush=True)
        self.printed, self.due = self.n, False

    def update(self, n: int = 1) -> None:
        if self.due:  # no set_postfix came for the last mark: its line as it is
            self._line()
        self.n += n
        self.due = self._mark(self.n) > self.shown
        self.shown = max(self.shown, self._mark(self.n))

    def set_postfix(self, **values: Any) -> None:
        """The figures of the last update: its line (when one is due) shows them."""
        self.postfix = "".join(f", {key}={value}" for key, value in values.items())
        if self.due:
            self._line()

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def reset(self, total: int | None = None) -> None:
        self.n, self.total, self.shown, self.printed, self.due = 0, total, 0, 0, False
        self.started = time.perf_counter()

    def write(self, text: str, file: TextIO | None = None) -> None:
        print(text, file=file or self.file or sys.stderr, flush=True)

    def close(self) -> None:
        if self.n != self.printed:
            self._line()  # where the count stopped, unless its line is already out

    def __iter__(self) -> Iterator:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()
