"""The bench's report: rows of figures printed as they come and written as bench/RESULTS.md's
table, and the formats and percentiles its figures use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Report:
    """Rows of (section, figure, value, ratio or target), printed as they come."""

    rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, section: str, figure: str, value: str, versus: str = "") -> None:
        self.rows.append((section, figure, value, versus))
        print(f"  {section:<18} {figure:<52} {value:>14}  {versus}", flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}", flush=True)

    def markdown(self, title: str) -> str:
        lines = [f"# {title}", "", "| section | figure | value | ratio / target |", "|---|---|---:|---|"]
        lines += [f"| {s} | {f} | {v} | {r} |" for s, f, v, r in self.rows]
        if self.notes:
            lines += ["", *(f"- {n}" for n in self.notes)]
        return "\n".join(lines) + "\n"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"
