"""``bench flap``: the project's ``chat`` command over a flapping WAN path.

A replay vLLM and a gateway run as processes; between ``chat`` and the gateway sits a
loopback proxy that holds every byte ``rtt / 2`` each way (``gateway.tools.cut``) and
resets every connection through it at random, every ``reset_min`` to ``reset_max``
seconds, for as long as a run lasts: a client on a mobile link whose NAT or radio keeps
dropping it. Each run is ``nnrp-gateway chat PROMPT --max-tokens N`` as a user types it;
it passes when it exits 0 and prints exactly what a run on a quiet path prints (every
word once, in order). A first run without resets gives that reference.

What it shows: the client keeps recovering through refused and reset connections and
cut attempts (gateway/tools/client/_client.py, recovery rules 1-5), and the gateway gives each
resumed stream what it missed, once (gateway/nnrp/_resumption.py).
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from gateway.tools.cut import StreamCutProxy

from ._stack import Stack

PROMPT = "Tell me about NNRP."
#: A run that has not ended by then has failed (it would otherwise hang the bench).
RUN_TIMEOUT = 180


@attrs.define
class FlapRun:
    exit_code: int
    whole: bool
    seconds: float
    resets: int
    error: str = ""
    #: What it printed (kept for the reference run only).
    output: str = attrs.field(default="", repr=False)


@attrs.define
class FlapReport:
    runs: int
    rtt_ms: float
    reset_min: float
    reset_max: float
    tokens: int
    reference_seconds: float = 0.0
    results: list[FlapRun] = attrs.field(factory=list)

    @property
    def passed(self) -> int:
        return sum(1 for run in self.results if run.exit_code == 0 and run.whole)

    @property
    def ok(self) -> bool:
        return self.passed == self.runs

    def as_dict(self) -> dict[str, Any]:
        document = attrs.asdict(self, filter=lambda field, _: field.name != "output")
        document.update(passed=self.passed, ok=self.ok)
        return document


async def flap(runs: int = 20, *, rtt_ms: float = 80.0, reset_min: float = 0.15,
               reset_max: float = 0.6, tokens: int = 300, seed: int = 34,
               log_dir: Path | None = None,
               progress: Callable[[str], None] = lambda _: None) -> FlapReport:
    report = FlapReport(runs, rtt_ms, reset_min, reset_max, tokens)
    rng = random.Random(seed)
    async with Stack(gateway_args=("--resume-window", "60", "--log-level", "info"),
                     log_dir=log_dir, residence=False) as stack, trio.open_nursery() as nursery:
        proxy = StreamCutProxy(("127.0.0.1", stack.nnrp_port), delay=rtt_ms / 2000)
        endpoint = "tcp://" + await nursery.start(proxy.serve)
        command = [stack.exe, "chat", PROMPT, "--endpoint", endpoint, "--max-tokens",
                   str(tokens), "--no-usage", "--reconnect-for", "60"]
        reference = await _run(command, None, rng, 0, 0)
        if reference.exit_code != 0:
            raise RuntimeError(f"the reference run failed: {reference.error}")
        expected = reference.output
        report.reference_seconds = reference.seconds
        for number in range(1, runs + 1):
            result = await _run(command, proxy, rng, reset_min, reset_max, expected)
            report.results.append(result)
            progress(f"flap: run {number}/{runs}: exit {result.exit_code}, "
                     f"{'whole' if result.whole else 'NOT whole'}, {result.resets} resets, "
                     f"{result.seconds:.1f} s")
        nursery.cancel_scope.cancel()
    return report


async def _run(command: list[str], proxy: StreamCutProxy | None, rng: random.Random,
               reset_min: float, reset_max: float, expected: str | None = None) -> FlapRun:
    """One ``chat`` process, the proxy resetting it meanwhile (none for the reference)."""
    start = time.perf_counter()
    resets = 0
    async with trio.open_nursery() as nursery:

        async def resetter() -> None:
            nonlocal resets
            assert proxy is not None
            while True:
                await trio.sleep(rng.uniform(reset_min, reset_max))
                proxy.cut()
                resets += 1

        if proxy is not None:
            nursery.start_soon(resetter)
        done: subprocess.CompletedProcess[bytes] | None = None
        with trio.move_on_after(RUN_TIMEOUT):
            done = await trio.run_process(command, capture_stdout=True, capture_stderr=True,
                                          check=False)
        nursery.cancel_scope.cancel()
    seconds = time.perf_counter() - start
    if done is None:
        return FlapRun(-1, False, seconds, resets, f"did not end within {RUN_TIMEOUT} s")
    output = done.stdout.decode(errors="replace")
    if expected is None:
        return FlapRun(done.returncode, True, seconds, resets, output=output)
    whole = output == expected
    error = "" if done.returncode == 0 and whole else (
        done.stderr.decode(errors="replace").strip()[-400:] or "the output differs")
    return FlapRun(done.returncode, whole, seconds, resets, error)


