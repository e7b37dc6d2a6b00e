"""Run from the repository: ``.venv/bin/python docs/bench/issue25-final/phases.py DIR``
(DIR: a ``bench profile --out`` directory; default docs/bench/profile/final).

Issue 25, row by row: each sample of each load's collapsed stacks goes to one phase of
an event's (or a request's) way through the gateway, and each phase's share times the
load's CPU per event (or per request) is what that phase costs. The first rule that
matches a sample decides; the rules read the innermost frame first (where the CPU was:
a system call's wrapper, trio's run loop), then the gateway frame nearest to it."""
import json
import sys
from pathlib import Path

# (phase, test on the innermost frame) - where the CPU itself was.
SELF_RULES = [
    ("the upstream socket's recv", lambda f: f.startswith("receive_some (gateway/_sockio.py")),
    ("the client socket's send", lambda f: f.startswith("send_now (gateway/_sockio.py")),
    ("epoll: waiting and waking", lambda f: "_io_epoll.py" in f),
    ("trio's scheduler: task switches, cancel scopes, timers",
     lambda f: "trio/" in f or "outcome/" in f or "trio._core" in f or "outcome._impl" in f),
]
# (phase, frame names any of which on the stack decides, nearest to the innermost first).
STACK_RULES = [
    ("per request: the observation record, metrics, log line", ("Gateway._observe",)),
    ("HTTP body de-chunking", ("BodyDecoder.",)),
    ("SSE framing", ("SSEDecoder.",)),
    ("chunk parse and checks", ("parse_chunk", "ChunkParser.", "_parse_in_general",
                                "_plain_text_chunk", "_plain_from_match", "check_chunk")),
    ("translate and encode the event", ("Translator.", "encode_event", "token_count",
                                        "encode_text_delta")),
    ("emit: sequence, state, codec, outbox", ("Operation.emit", "Operation.flush",
                                              "_Port.flush", "Outbox.")),
    ("per request: upstream request and response head",
     ("VllmClient.chunks", "VllmClient.completion", "VllmClient._response",
      "LoopbackTransport.", "BodyChunks.read_trailer", "_RequestTemplate")),
    ("per request: submit read and decoded", ("Connection._reader", "ServerConnection.",
                                              "Connection._handle")),
    ("per request: terminal and operation lifecycle",
     ("ChatPipeline._complete", "Operation.close", "Operation.run", "Session.",
      "ChatPipeline.__call__")),
    ("the stream's read loop", ("ChunkStream.", "ChatPipeline._stream")),
]


def phase_of(stack: list[str]) -> str:
    inner = stack[-1]
    for phase, test in SELF_RULES:
        if test(inner):
            return phase
    for frame in reversed(stack):
        for phase, names in STACK_RULES:
            if any(frame.startswith(name) for name in names):
                return phase
    return "other (the residence probe, prometheus, logging set-up, ...)"


def main(directory: Path) -> None:
    document = json.loads((directory / "profile.json").read_text())
    for profile in document["profiles"]:
        name = profile["load"]["name"]
        per_request = profile["load"].get("requests", 1) > 1
        unit = profile["cpu_per_request_us"] if per_request else profile["cpu_per_event_us"]
        phases: dict[str, int] = {}
        total = 0
        for line in (directory / f"{name}.collapsed").read_text().splitlines():
            frames, _, count = line.rpartition(" ")
            n = int(count)
            total += n
            phase = phase_of(frames.split(";"))
            phases[phase] = phases.get(phase, 0) + n
        what = "a request" if per_request else "an event"
        print(f"\n### {name}: {unit:.1f} us of gateway CPU {what} ({total} samples)\n")
        print(f"| phase | share | us {what} |\n|---|---:|---:|")
        for phase, n in sorted(phases.items(), key=lambda item: -item[1]):
            print(f"| {phase} | {n / total * 100:.1f} % | {n / total * unit:.1f} |")


main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/bench/profile/final"))
