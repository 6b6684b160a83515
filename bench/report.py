"""What a bench measured, in the form `make bench` collects (`bench/run.py`).

A bench prints its figures for a person as it always did, and hands each one to `record`: with
`BENCH_RESULTS` naming a file (the runner sets it), the figure is appended there as a JSON line,
with its target and the command that produced it.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    # None: the figure is reported for reference (websockify beside our relay), not held to a target.
    target: float | None = None
    higher_is_better: bool = False

    @property
    def passed(self) -> bool | None:
        if self.target is None:
            return None
        return self.value >= self.target if self.higher_is_better else self.value <= self.target


def record(*figures: Figure) -> None:
    path = os.environ.get("BENCH_RESULTS")
    if not path:
        return
    command = os.environ.get("BENCH_COMMAND") or shlex.join(["python", *sys.argv])
    with open(path, "a") as out:
        for figure in figures:
            out.write(json.dumps({**asdict(figure), "command": command}) + "\n")
