"""Run from the repository: ``.venv/bin/python docs/bench/issue25-final/profile_10ms.py``.

Issue 25, row 1 is measured at the latency scenario's pace (one stream, 10 ms between
events), where ``bench profile``'s one-stream load runs at 1 ms: the same profile at
10 ms, 2,000 events, into docs/bench/profile/final-10ms (``phases.py`` reads it)."""
import json
import sys
from pathlib import Path

import trio

sys.path.insert(0, ".")
from gateway.tools.bench.profile import Load, profile  # noqa: E402

LOAD = Load("paced-1-10ms", 1, 2000, 10_000,
            "one stream x 100 events/s (10 ms apart), the latency scenario's pace")
out = Path("docs/bench/profile/final-10ms")
profiles = trio.run(lambda: profile(out, False, print, loads=(LOAD,)))
(out / "profile.json").write_text(json.dumps(
    {"command": "docs/bench/issue25-final/profile_10ms.py",
     "profiles": [p.as_dict() for p in profiles]}, indent=2) + "\n")
for p in profiles:
    print(f"{p.events} events, {p.cpu_per_event_us:.1f} us an event, "
          f"{p.events_per_read or 0:.2f} events a read, {p.samples} samples")
