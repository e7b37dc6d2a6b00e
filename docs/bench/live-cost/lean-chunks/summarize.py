"""The cost scenario's per-event figures of each ``bench run --scenario cost`` output
given, one line a run (summary.txt): ``python summarize.py A-*.txt B-*.txt``."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def figure(text: str, name: str) -> float:
    found = re.search(re.escape(name) + r"\s+([\d,.]+) us", text)
    return float(found.group(1).replace(",", "")) if found else float("nan")


def summary(path: Path) -> str:
    text = path.read_text()
    paced_wake = figure(text, "bare trio wake-up CPU on this machine, paced 1 ms")
    back_to_back = figure(text, "bare trio wake-up CPU on this machine, back to back")
    paced = {n: figure(text, f"gateway CPU per event, {n} stream(s), paced")
             for n in (1, 16, 256)}
    coalesced = figure(text, "gateway CPU per event, 256 stream(s), coalesced")
    return (f"{path.name:10} p1 {paced[1]:6.1f} p16 {paced[16]:6.1f} p256 {paced[256]:5.1f} "
            f"c256 {coalesced:5.2f} | wake1ms {paced_wake:6.1f} b2b {back_to_back:5.1f} | "
            f"p256/1ms {paced[256] / paced_wake:.2f} c256/b2b {coalesced / back_to_back:.2f}")


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(summary(Path(name)))
