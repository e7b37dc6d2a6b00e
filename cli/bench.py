"""``nnrp-gateway bench``: measured figures with goals, never timed in CI."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Annotated

import trio
import typer

from gateway.bench import Figure, run_codec_bench, run_wire_bench
from gateway.observe import configure_logging

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: codec cost and wire throughput.")

Quick = Annotated[bool, typer.Option("--quick", help="Short runs (CI proves the command works).")]
AsJson = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
Out = Annotated[Path | None, typer.Option("--out", help="Also write results JSON here.")]


def _quiet_logs() -> None:
    configure_logging(level="warning", to_stderr=True)


def _report(scenario: str, figures: list[Figure], as_json: bool, out: Path | None) -> None:
    document = {"scenario": scenario, "machine": _machine(),
                "figures": [figure.as_dict() for figure in figures]}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{scenario}.json").write_text(json.dumps(document, indent=2) + "\n")
    if as_json:
        typer.echo(json.dumps(document, indent=2))
        return
    typer.echo(f"{'figure':<68} {'value':>12}  {'goal':>10}  {'met':>4}  baseline")
    for figure in figures:
        goal = "" if figure.goal is None else f"{figure.goal:g}"
        met = {True: "yes", False: "NO", None: ""}[figure.goal_met]
        baseline = (f"{figure.baseline:.2f} ({figure.baseline_name}, ratio {figure.ratio:.2f})"
                    if figure.baseline else "")
        typer.echo(f"{figure.name:<68} {figure.value:>9.2f} {figure.unit:<3} {goal:>10}  "
                   f"{met:>4}  {baseline}")
        if figure.spread:
            typer.echo(f"{'':<4}{figure.spread}")


def _machine() -> dict[str, object]:
    import os

    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform()}


@bench_app.command("codec")
def codec(quick: Quick = False, as_json: AsJson = False, out: Out = None) -> None:
    """Encode/decode cost per PARTIAL_RESULT and FRAME_SUBMIT, against nnrp-py's codec."""
    _report("codec", run_codec_bench(quick), as_json, out)


@bench_app.command("wire")
def wire(quick: Quick = False, as_json: AsJson = False, out: Out = None) -> None:
    """Round trips/s, events/s to one client, memory per idle session (real sockets)."""
    _quiet_logs()
    _report("wire", trio.run(run_wire_bench, quick), as_json, out)
