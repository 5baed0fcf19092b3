"""The overview's throughput chart, laid out in Python and drawn by a template as inline SVG.

No JavaScript and no external assets: `throughput_chart` turns the per-minute counts of
`throughput_by_minute` into bars with their coordinates; ``_chart.html`` draws them, each
column with a ``<title>`` tooltip, next to a table of the same numbers.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from ..queue import ThroughputMinute

#: The chart's drawing area, in SVG user units (it scales with the page).
WIDTH = 640
HEIGHT = 150
_LEFT = 40  # room for the scale's numbers
_TOP = 8
_BOTTOM = 20  # room for the first and last minute
_PLOT_HEIGHT = HEIGHT - _TOP - _BOTTOM


@dataclasses.dataclass(frozen=True)
class Bar:
    """One minute's column: its slot (``x``, ``width``), and the heights of its stacked
    parts, succeeded at the bottom, failed on top (zero heights when none)."""

    minute: ThroughputMinute
    label: str
    x: float
    width: float
    succeeded_y: float
    succeeded_height: float
    failed_y: float
    failed_height: float


@dataclasses.dataclass(frozen=True)
class ThroughputChart:
    """What ``_chart.html`` draws: the bars, the scale's top value and where the plot is."""

    bars: list[Bar]
    scale: int
    succeeded: int
    failed: int
    timezone: str
    left: int = _LEFT
    top: int = _TOP
    bottom: int = HEIGHT - _BOTTOM
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def summary(self) -> str:
        """One sentence for the SVG's ``<title>``: the span and the totals."""
        if not self.bars:
            return "Jobs finished per minute: no minutes to show"
        first, last = self.bars[0].label, self.bars[-1].label
        return (
            f"Jobs finished per minute, {first} to {last} ({self.timezone}): "
            f"{self.succeeded} succeeded, {self.failed} failed"
        )


def nice_scale(peak: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, … that is at least ``peak``: the scale's top.

    Examples:
        >>> [nice_scale(n) for n in (0, 1, 3, 7, 10, 11, 480)]
        [1, 1, 5, 10, 10, 20, 500]
    """
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= peak:
                return step * factor
        step *= 10


def throughput_chart(minutes: Sequence[ThroughputMinute]) -> ThroughputChart:
    """Lay out one bar per minute, oldest on the left, scaled to `nice_scale` of the peak.

    Examples:
        >>> t0 = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
        >>> chart = throughput_chart([ThroughputMinute(t0, 3, 1),
        ...                           ThroughputMinute(t0 + dt.timedelta(minutes=1), 0, 0)])
        >>> chart.scale, chart.summary
        (5, 'Jobs finished per minute, 12:00 to 12:01 (UTC): 3 succeeded, 1 failed')
        >>> [(b.label, b.succeeded_height, b.failed_height) for b in chart.bars]
        [('12:00', 73.2, 24.4), ('12:01', 0.0, 0.0)]
    """
    scale = nice_scale(max((m.finished for m in minutes), default=0))
    slot = (WIDTH - _LEFT) / max(len(minutes), 1)
    bottom = HEIGHT - _BOTTOM
    bars = []
    for i, m in enumerate(minutes):
        succeeded = round(_PLOT_HEIGHT * m.succeeded / scale, 1)
        failed = round(_PLOT_HEIGHT * m.failed / scale, 1)
        bars.append(
            Bar(
                minute=m,
                label=m.minute.strftime("%H:%M"),
                x=round(_LEFT + i * slot + slot * 0.1, 1),
                width=round(slot * 0.8, 1),
                succeeded_y=round(bottom - succeeded, 1),
                succeeded_height=succeeded,
                failed_y=round(bottom - succeeded - failed, 1),
                failed_height=failed,
            )
        )
    return ThroughputChart(
        bars=bars,
        scale=scale,
        succeeded=sum(m.succeeded for m in minutes),
        failed=sum(m.failed for m in minutes),
        timezone=_zone(minutes[-1].minute) if minutes else "",
    )


def _zone(when: dt.datetime) -> str:
    return when.tzname() or when.strftime("%z")
