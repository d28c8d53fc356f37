"""How far `python -m bench` is: one bar over parts times runs (rate, time left) on a terminal, drawn by
`export.progress`; nothing is drawn when stderr is not one, where the `part …` and `round …` log lines say it.

A part whose `run` takes `progress` reports each of its rounds with `progress.advance()` (a round's end, never a
request: the bar stays out of the measured loops). The units of a part that reports none, that ran fewer rounds
(quick mode) or that failed are counted when it ends, so the bar is exact at every part's end.
"""

from __future__ import annotations

from tqdm import tqdm


class PartProgress:
    """One part's share of the run's bar: `runs` units."""

    def __init__(self, bar: tqdm, runs: int) -> None:
        self.bar, self.runs, self.done = bar, runs, 0

    def advance(self) -> None:
        """One more of the part's rounds is done; rounds beyond `runs` move nothing."""
        if self.done < self.runs:
            self.done += 1
            self.bar.update(1)

    def finish(self) -> None:
        """The part ended: count the units it did not report."""
        self.bar.update(self.runs - self.done)
        self.done = self.runs
