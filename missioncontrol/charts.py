"""Bar charts drawn on the server as SVG: the page needs no script to show them."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

# Room left of the bars for the scale, and below them for the days.
LEFT, BOTTOM, TOP = 48, 18, 8


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str  # under the bar, or blank
    title: str  # shown on hover

    @property
    def center(self) -> float:
        return round(self.x + self.width / 2, 2)


@dataclass(frozen=True)
class BarChart:
    width: int
    height: int
    bars: list[Bar]
    peak: str  # the scale's top, as shown
    base_y: float
    left: int = LEFT


def bar_chart(
    points: list[tuple[str, Decimal | int, str]], *, peak_label, width: int = 720, height: int = 160
) -> BarChart:
    """One bar per (label, value, title); bars scale to the largest value, which `peak_label` shows."""
    peak = max((value for _, value, _ in points), default=0)
    base_y = height - BOTTOM
    slot = (width - LEFT) / max(len(points), 1)
    bars = []
    for i, (label, value, title) in enumerate(points):
        bar_height = float(value) / float(peak) * (base_y - TOP) if peak else 0.0
        bars.append(
            Bar(
                x=round(LEFT + i * slot + slot * 0.15, 2),
                y=round(base_y - bar_height, 2),
                width=round(slot * 0.7, 2),
                height=round(bar_height, 2),
                label=label,
                title=title,
            )
        )
    return BarChart(width=width, height=height, bars=bars, peak=peak_label(peak), base_y=base_y)
