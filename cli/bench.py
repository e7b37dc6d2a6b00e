"""``nnrp-gateway bench``: measured figures with goals, never timed in CI."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gateway.compiled import build
from gateway.tools.bench import SCENARIO_NAMES

from ._app import GatewayTyper, UserError, source
from ._settings import check_host_port, check_http_url, check_output_dir

if TYPE_CHECKING:
    from gateway.tools.bench.profile import Profile
    from gateway.tools.bench.soak import SoakReport
    from gateway.tools.bench.stats import Figure

bench_app = GatewayTyper(help="Benchmarks: the codec, the wire, the gateway against direct "
                              "HTTP, a real vLLM, a soak. Figures, never timed in CI.")

Quick = Annotated[bool, typer.Option("--quick", help="Short runs (CI proves the command works).")]
AsJson = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
Out = Annotated[Path | None, typer.Option(
    "--out", metavar="DIR", help="Also write the results (JSON) into this directory.")]


def _quiet_logs() -> None:
    from gateway.observe import configure_logging

    configure_logging(level="warning", to_stderr=True)


#: How the printed report says each verdict; the JSON results carry ``Figure.status``.
SAID = {"met": "met", "not met": "NOT MET", "not measurable": "not measurable here",
        None: ""}


def _report(scenario: str, figures: list[Figure], as_json: bool, out: Path | None, *,
            whole: bool = True, notes: tuple[str, ...] = (),
            details: dict[str, Any] | None = None) -> None:
    """``figures`` as a table (or, with ``as_json``, a document), opened by the yardstick's
    line and ended by the verdict's unless ``whole`` is False (a section of ``bench
    run``'s report, which prints both once); ``notes`` are printed above the table,
    ``details`` (the raw samples) go into the document only."""
    from gateway.tools.bench import wake
    from gateway.tools.bench.stats import tally, verdict

    document: dict[str, Any] = {"scenario": scenario, "machine": _machine(),
                                "wake": wake.described(figures),
                                "figures": [figure.as_dict() for figure in figures],
                                "verdict": {**tally(figures), "line": verdict(figures)}}
    if notes:
        document["notes"] = list(notes)
    if details:
        document["details"] = details
    if _written(document, out, f"{scenario}.json", as_json):
        return
    if whole:
        typer.echo(wake.line(figures))
    for note in notes:
        typer.echo(note)
    typer.echo(f"{'figure':<80} {'value':>13} {'wake-ups':>9}  {'goal':>10}  "
               f"{'verdict':<19}  baseline")
    for figure in figures:
        goal = "" if figure.goal is None else f"{figure.goal:g}"
        status = figure.status
        in_wakes = figure.in_wakes
        if status == "not measurable":  # no value to read as a result (stats rule 2)
            assert figure.noise is not None
            value, in_wakes, beside = "", "", figure.noise.raw(figure.unit)
        else:
            value = f"{figure.value:>9.2f} {figure.unit:<3}"
            beside = (f"{figure.baseline:.2f} ({figure.baseline_name}, ratio "
                      f"{figure.ratio:.2f})" if figure.baseline else "")
        typer.echo(f"{figure.name:<80} {value:>13} {in_wakes:>9}  {goal:>10}  "
                   f"{SAID[status]:<19}  {beside}".rstrip())
        if figure.noise is not None and status != "not measurable":
            typer.echo(f"{'':<4}{figure.noise.raw(figure.unit, figure.margin)} "
                       f"({figure.noise.how})")
        if figure.spread:
            typer.echo(f"{'':<4}{figure.spread}")
    if whole:
        typer.echo(verdict(figures))


def _machine() -> dict[str, object]:
    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform(), "build": build()}


@bench_app.command("codec")
def codec(quick: Quick = False, as_json: AsJson = False, out: Out = None) -> None:
    """Encode/decode cost per PARTIAL_RESULT and FRAME_SUBMIT, against nnrp-py's codec."""
    from gateway.tools.bench import wake
    from gateway.tools.bench.codec import run_codec_bench
    from gateway.tools.bench.stats import against_wake

    if out is not None:
        check_output_dir(out, "--out")
    _report("codec", against_wake(run_codec_bench(quick), wake.measure(quick)), as_json, out)


@bench_app.command("wire")
def wire(quick: Quick = False, as_json: AsJson = False, out: Out = None) -> None:
    """Round trips/s, events/s to one client, memory per idle session and connection
    (real sockets; TCP, and QUIC beside it with the TCP figure as its baseline)."""
    import trio

    from gateway.tools.bench import wake
    from gateway.tools.bench.stats import against_wake
    from gateway.tools.bench.wire import run_wire_bench

    if out is not None:
        check_output_dir(out, "--out")
    _quiet_logs()
    _report("wire", against_wake(trio.run(run_wire_bench, quick), wake.measure(quick)),
            as_json, out)


def _write_out(out: Path, results: dict[str, list[Figure]], command: str) -> None:
    from gateway.tools.bench import wake
    from gateway.tools.bench.stats import printed, tally, verdict

    out.mkdir(parents=True, exist_ok=True)
    machine = _machine()
    every = [figure for figures in results.values() for figure in figures]
    document = {"command": command, "machine": machine, "wake": wake.described(every),
                "scenarios": {name: [f.as_dict() for f in figures]
                              for name, figures in results.items()},
                "verdict": {**tally(every), "line": verdict(every)}}
    (out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    lines = [f"# nnrp-gateway bench results\n\n`{command}` on {machine}\n\n"
             f"{wake.line(every)}\n"]
    for name, figures in results.items():
        lines.append(f"\n## {name}\n\n| figure | value | wake-ups | goal | verdict | baseline "
                     "| spread |\n|---|---:|---:|---:|---|---:|---|")
        for f in figures:
            goal = "" if f.goal is None else f"{f.goal:g}"
            status = f.status
            said = {"not met": "**not met**"}.get(status or "", SAID[status])
            value = f"{f.value:.2f} {f.unit}"
            wakes = f.in_wakes
            if f.noise is not None:
                value = (f.noise.raw(f.unit) if status == "not measurable" else
                         f"{value} (this run's noise {printed(f.noise.floor)} "
                         f"{f.noise.unit or f.unit})")
                wakes = "" if status == "not measurable" else wakes
            base = f"{f.baseline:.1f} ({f.baseline_name})" if f.baseline else ""
            lines.append(f"| {f.name} | {value} | {wakes} | {goal} | {said} | {base} "
                         f"| {f.spread} |")
    lines.append(f"\n{verdict(every)}")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    _plots(out, results)


def _plots(out: Path, results: dict[str, list[Figure]]) -> None:
    """PNG plots when matplotlib (the 'plots' extra) is installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    if "latency" in results:
        figures = [f for f in results["latency"] if f.baseline is not None]
        fig, ax = plt.subplots(figsize=(7, 3.5))
        labels = [f.name.replace("added event latency ", "") for f in figures]
        direct = [f.baseline or 0 for f in figures]
        gateway = [(f.baseline or 0) + f.value for f in figures]
        positions = range(len(figures))
        ax.bar([p - 0.2 for p in positions], direct, 0.4, label="direct HTTP/SSE")
        ax.bar([p + 0.2 for p in positions], gateway, 0.4, label="through the gateway")
        ax.set_xticks(list(positions), labels, fontsize=8)
        ax.set_ylabel("emit -> receive (us)")
        ax.set_yscale("log")
        ax.legend()
        ax.set_title("Streaming event latency percentiles")
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=120)
        plt.close(fig)
    if "throughput" in results:
        figures = results["throughput"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([f.name.split(", ")[-1] for f in figures], [f.value for f in figures], "o-")
        ax.axhline(50_000, linestyle="--", color="grey", label="goal 50,000/s")
        ax.set_ylabel("events/s")
        ax.set_title("Throughput by concurrency")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=120)
        plt.close(fig)
    if "cost" in results:
        _plot_cost(plt, out, results["cost"])
    if "workers" in results:
        _plot_workers(plt, out, results["workers"])


def _plot_cost(plt: Any, out: Path, figures: list[Figure]) -> None:
    """CPU per event by concurrency, paced against coalesced upstream reads."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for shape in ("paced", "coalesced"):
        points = [f for f in figures
                  if f.name.startswith("gateway CPU per event") and f.name.endswith(shape)]
        ax.plot([f.name.split(", ")[1] for f in points], [f.value for f in points], "o-",
                label=f"{shape} reads")
    ax.axhline(10, linestyle="--", color="grey", label="goal 10 us (256 paced)")
    ax.set_ylabel("gateway CPU per event (us)")
    ax.set_yscale("log")
    ax.set_title("What an event costs the gateway")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "cost.png", dpi=120)
    plt.close(fig)


def _plot_workers(plt: Any, out: Path, figures: list[Figure]) -> None:
    """Events/s delivered and the p99 tail, one worker against two, by load."""
    fig, (rate, tail) = plt.subplots(1, 2, figsize=(9, 3.5))
    loads = sorted({f.name.split(", ")[1] for f in figures
                    if f.name.startswith("events/s delivered")},
                   key=lambda load: int(load.split()[0]))
    for count in ("1 worker(s)", "2 worker(s)"):
        def value(prefix: str, load: str, count: str = count) -> float:
            (figure,) = [f for f in figures if f.name == f"{prefix}, {load}, {count}"]
            return figure.value
        rate.plot(loads, [value("events/s delivered", load) for load in loads], "o-",
                  label=count.replace("(s)", "s" if count[0] != "1" else ""))
        tail.plot(loads, [value("event latency p99", load) / 1000 for load in loads], "o-",
                  label=count.replace("(s)", "s" if count[0] != "1" else ""))
    rate.set_ylabel("events/s delivered")
    rate.set_title("Carried load (100 events/s offered a stream)")
    tail.set_ylabel("event latency p99 (ms)")
    tail.set_yscale("log")
    tail.set_title("Tail latency")
    for ax in (rate, tail):
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "workers.png", dpi=120)
    plt.close(fig)


def _with_progress(work: Callable[[Callable[[str], None]], dict[str, list[Figure]]],
                   as_json: bool) -> dict[str, list[Figure]]:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if as_json:
        return work(lambda _: None)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  transient=True) as bar:
        task = bar.add_task("starting", total=None)
        return work(lambda text: bar.update(task, description=text))


@bench_app.command("run")
def run_scenarios_command(
    quick: Quick = False, as_json: AsJson = False, out: Out = None,
    scenario: Annotated[list[str] | None, typer.Option(
        help=f"Scenarios to run (default all): {', '.join(SCENARIO_NAMES)}.")] = None,
) -> None:
    """Latency, throughput, non-streaming, cancellation, a 30 s pause, scale, workers,
    resume (cut connections resumed; what a detached stream holds)."""
    import trio

    from gateway.tools.bench import wake
    from gateway.tools.bench.scenarios import run_scenarios
    from gateway.tools.bench.stats import verdict

    names = scenario or list(SCENARIO_NAMES)
    unknown = set(names) - set(SCENARIO_NAMES)
    if unknown:
        raise UserError(f"unknown scenario(s) {', '.join(sorted(unknown))} (one of "
                        f"{', '.join(SCENARIO_NAMES)})", "--scenario")
    if out is not None:
        check_output_dir(out, "--out")
    _quiet_logs()
    results = _with_progress(lambda p: trio.run(run_scenarios, names, quick, p), as_json)
    command = "nnrp-gateway bench run" + (" --quick" if quick else "") + "".join(
        f" --scenario {name}" for name in scenario or ())
    if out is not None:
        _write_out(out, results, command)
    if as_json:
        typer.echo(json.dumps({name: [f.as_dict() for f in figures]
                               for name, figures in results.items()}, indent=2))
        return
    every = [f for figures in results.values() for f in figures]
    typer.echo(wake.line(every))
    for name, figures in results.items():
        typer.echo(f"\n== {name}")
        _report(name, figures, False, None, whole=False)
    typer.echo(f"\n{verdict(every)}")


@bench_app.command("live")
def live_command(
    ctx: typer.Context,
    vllm_url: Annotated[str, typer.Option(
        metavar="URL", help="A real vLLM (the CPU build here, a GPU elsewhere).")],
    endpoint: Annotated[str | None, typer.Option(
        metavar="URL", help="An existing gateway in front of that vLLM (default: start one).")
    ] = None,
    model: Annotated[str, typer.Option(help="Served model name.")] = "tiny",
    streams: Annotated[int | None, typer.Option(
        min=1, max=1024, metavar="N",
        help="Also N concurrent streams through the gateway, then direct: the gateway's CPU "
             "per event against vLLM's API-server CPU per SSE chunk (both on this machine: "
             "the kernel's per-process clocks), their ratio, events against chunks.")
    ] = None,
    quick: Quick = False, as_json: AsJson = False, out: Out = None,
) -> None:
    """TTFT and time per output token through the gateway vs direct HTTP (goal: within 3%);
    with --streams N, the CPU each side spends per token at N concurrent streams."""
    import httpx
    import trio

    from gateway.tools.bench import wake
    from gateway.tools.bench.live_cost import LiveCostUnavailable, local_port, owners
    from gateway.tools.bench.scenarios import live
    from gateway.tools.bench.stats import against_wake
    from gateway.tools.client import ClientError

    from .ops import check_endpoint, connection_failure

    check_http_url(vllm_url, source(ctx, "vllm_url"))
    if endpoint is not None:
        check_endpoint(endpoint, source(ctx, "endpoint"))
    if out is not None:
        check_output_dir(out, "--out")
    try:
        if streams is not None:  # its API server's CPU clock is read here
            local_port(vllm_url, "vLLM")
    except LiveCostUnavailable as exc:
        raise UserError(f"--streams cannot measure vLLM: {exc}", vllm_url) from None
    try:  # before a gateway is started in front of it: is anybody there?
        httpx.get(f"{vllm_url.rstrip('/')}/version", timeout=5, trust_env=False)
    except httpx.HTTPError as exc:
        raise UserError(f"vLLM did not answer ({exc or type(exc).__name__})", vllm_url,
                        code=1) from None
    if streams is not None:  # before the TTFT rounds: can its API server be found here?
        try:
            owners(local_port(vllm_url, "vLLM"), f"vLLM's API server at {vllm_url}")
        except LiveCostUnavailable as exc:
            raise UserError(f"--streams cannot measure vLLM: {exc}", vllm_url,
                            code=1) from None
    _quiet_logs()
    wake_us = wake.measure(quick)
    try:
        results = _with_progress(
            lambda p: {"live": against_wake(
                trio.run(live, vllm_url, endpoint, model, quick, p, streams), wake_us)},
            as_json)
    except LiveCostUnavailable as exc:
        raise UserError(f"--streams cannot measure the gateway: {exc}",
                        endpoint or "the gateway", code=1) from None
    except httpx.HTTPError as exc:
        raise UserError(f"vLLM did not answer ({exc or type(exc).__name__})", vllm_url,
                        code=1) from None
    except (ClientError, OSError, trio.TooSlowError) as exc:
        raise connection_failure(exc, endpoint or "the gateway bench live started") from None
    if out is not None:
        _write_out(out, results, f"nnrp-gateway bench live --vllm-url {vllm_url}"
                   + ("" if streams is None else f" --streams {streams}")
                   + (" --quick" if quick else ""))
    _report("live", results["live"], as_json, None)


@bench_app.command("profile")
def profile_command(
    out: Annotated[Path, typer.Option(
        "--out", metavar="DIR", help="Where the flame graphs (NAME.svg), the collapsed "
                                     "stacks (NAME.collapsed, to diff) and profile.md go.")],
    quick: Quick = False, as_json: AsJson = False,
    rate: Annotated[int, typer.Option(min=1, max=1000, metavar="HZ",
                                      help="py-spy's samples a second.")] = 250,
    load_names: Annotated[list[str] | None, typer.Option(
        "--load", metavar="NAME",
        help="Loads to profile (default all): paced-256, paced-1, coalesced-256, "
             "requests-16, unary-1. [repeatable]")] = None,
) -> None:
    """Flame graphs of the gateway process (py-spy, the 'profile' extra) under 256 paced
    streams, one paced stream, 256 coalesced streams, short streamed requests and
    non-streaming requests, with its CPU per event (or per request) over the same window
    and the frames with the most self time."""
    import trio

    from gateway.tools.bench.profile import (
        LOADS_BY_NAME,
        LoadIncomplete,
        ProfilerUnavailable,
        profile,
    )

    unknown = sorted(set(load_names or ()) - set(LOADS_BY_NAME))
    if unknown:
        raise UserError(f"unknown load(s) {', '.join(unknown)} (one of "
                        f"{', '.join(LOADS_BY_NAME)})", "--load")
    check_output_dir(out, "--out")
    loads = tuple(LOADS_BY_NAME[name] for name in dict.fromkeys(load_names or LOADS_BY_NAME))
    _quiet_logs()
    profiles: list[Profile] = []

    def work(progress: Callable[[str], None]) -> dict[str, list[Figure]]:
        profiles.extend(trio.run(lambda: profile(out, quick, progress, rate=rate,
                                                 loads=loads)))
        return {}

    try:
        _with_progress(work, as_json)
    except ProfilerUnavailable as exc:
        raise UserError(f"cannot profile the gateway: {exc}", "py-spy", code=1) from None
    except LoadIncomplete as exc:
        raise UserError(f"the profiled load did not complete: {exc}", "--rate",
                        code=1) from None
    command = ("nnrp-gateway bench profile" + (" --quick" if quick else "")
               + f" --rate {rate}")
    if load_names:
        command += "".join(f" --load {load.name}" for load in loads)
    document = {"command": command, "machine": _machine(),
                "profiles": [p.as_dict() for p in profiles]}
    (out / "profile.json").write_text(json.dumps(document, indent=2) + "\n")
    text = _profile_markdown(command, profiles)
    (out / "profile.md").write_text(text)
    typer.echo(json.dumps(document, indent=2) if as_json else text, nl=False)


def _profile_markdown(command: str, profiles: list[Profile]) -> str:
    from gateway.tools.bench.flame import top_frames_table

    lines = [f"# Where the gateway's CPU goes\n\n`{command}` on {_machine()}\n"]
    for p in profiles:
        each = (f"{p.cpu_per_request_us:.1f} us a request" if p.load.per_request
                else f"{p.cpu_per_event_us:.1f} us an event")
        done = f" ({p.requests} requests)" if p.load.per_request else ""
        lines.append(f"\n## {p.load.what}\n\n{p.events} events{done} in "
                     f"{p.wall_seconds:.1f} s; gateway CPU {p.cpu_seconds:.2f} s ({each}, "
                     f"{p.cpu_seconds / max(p.wall_seconds, 1e-9) * 100:.0f} % of a "
                     f"core); {p.events_per_read or 0:.2f} events per upstream read; "
                     f"{p.samples} samples. Graph: [{p.load.name}.svg]"
                     f"({p.load.name}.svg), stacks: [{p.load.name}.collapsed]"
                     f"({p.load.name}.collapsed).\n\nFrames with the most self time "
                     "(self: the frame was running; total: it was on the stack):\n")
        lines.append(top_frames_table(p.shares))
        lines.append("Self time by where the code lives:\n\n| unit | self |\n|---|---:|\n"
                     + "".join(f"| `{key}` | {share * 100:.1f} % |\n"
                               for key, share in p.areas[:12]))
    return "\n".join(lines)


@bench_app.command("soak")
def soak_command(
    streams: Annotated[int, typer.Option(min=1, metavar="N", help="Concurrent streams.")
    ] = 200,
    seconds: Annotated[float, typer.Option(min=1, metavar="SECONDS", help="Duration.")
    ] = 30.0,
    sigterm_at: Annotated[float | None, typer.Option(
        metavar="SECONDS",
        help="Send SIGTERM to the gateway after this many seconds (shutdown under load).")
    ] = None,
    token_interval_ms: Annotated[float, typer.Option(
        min=0, metavar="MS", help="Gap between a stream's 40 tokens; offered load is "
                                  "streams * 1000 / interval events/s.")] = 20.0,
    as_json: AsJson = False, out: Out = None,
    max_rss_growth: Annotated[float, typer.Option(
        metavar="FRACTION", help="Fail above this RSS growth after warm-up (0.05: 5%).")
    ] = 0.05,
    client_nice: Annotated[int, typer.Option(
        min=0, max=19, metavar="N",
        help="Lower the load generator's priority by this much (nice) once the gateway and "
             "backend run, so they get the CPU first.")] = 0,
    cut_every: Annotated[float | None, typer.Option(
        min=0.001, metavar="SECONDS",
        help="Resumable streams, each on its own connection through a cut proxy: reset one "
             "connection (a random stream, mid-operation) every this many seconds on "
             "average; the clients resume by themselves.")] = None,
    resume_window: Annotated[float, typer.Option(
        min=0.1, metavar="SECONDS",
        help="With --cut-every: the gateway's --resume-window; after the load the sessions "
             "detach and must all be gone once it has passed.")] = 5.0,
    seed: Annotated[int, typer.Option(
        metavar="N", help="With --cut-every: where and when the cuts fall.")] = 21,
    cut_latency_ms: Annotated[float, typer.Option(
        min=0.0, metavar="MS",
        help="With --cut-every: the round trip each client's path adds (a WAN: half each "
             "way, in order).")] = 0.0,
) -> None:
    """N concurrent streams for T seconds: errors, RSS and open files over time; exit 1 on
    any error, unaccounted operation, or RSS growth above --max-rss-growth after warm-up.
    With --out, the gateway's and the backend's logs are kept in OUT/logs. With
    --cut-every, also on any event lost or duplicated, a cut not resumed, or anything still
    held once the windows have passed (RSS growth is then measured after them)."""
    import trio

    from gateway.tools.bench.soak import soak

    if out is not None:
        check_output_dir(out, "--out")
    _quiet_logs()
    if cut_every is not None and sigterm_at is not None:
        raise typer.BadParameter("--cut-every and --sigterm-at are separate runs")

    holder: list[SoakReport] = []

    def work(progress: Callable[[str], None]) -> dict[str, list[Figure]]:
        holder.append(trio.run(lambda: soak(streams, seconds, sigterm_at=sigterm_at,
                                            token_interval_ms=token_interval_ms,
                                            log_dir=out / "logs" if out else None,
                                            client_nice=client_nice,
                                            progress=progress, cut_every=cut_every,
                                            resume_window=resume_window, seed=seed,
                                            cut_latency_ms=cut_latency_ms)))
        return {}

    _with_progress(work, as_json)
    report = holder[0]
    if not _written(report.as_dict(), out, "soak.json", as_json):
        growth = ("from the first period's windows to the second's" if report.resume
                  else "after warm-up")
        typer.echo(f"{report.started} started, {report.completed} completed, {report.dropped} "
                   f"dropped, {report.refused} refused recoverably, {report.errors} errors; "
                   f"RSS growth {growth} {report.rss_growth * 100:.1f} %; accounted: "
                   f"{report.accounted}")
        stretch = report.stretch(0.5)
        if stretch is not None:
            typer.echo(f"  offered {report.offered_events_per_s:.0f} events/s; an operation "
                       f"took {stretch:.2f}x its nominal time (p50; near 1: carried)")
        delay = report.as_dict()["event_delay_ms"]
        if delay:
            typer.echo(f"  event delay, backend write -> client: p50 {delay['p50']} ms, "
                       f"p99 {delay['p99']} ms, p99.9 {delay['p99.9']} ms")
        for cause, count in sorted(report.error_causes.items()):
            typer.echo(f"  {count} x {cause}")
        if report.resume is not None:
            _echo_resume(report)
        samples = report.samples
        shown = samples[:: max(1, len(samples) // 10)]
        if report.resume is not None:  # and those after each period's load
            shown = [s for s in samples if s in shown or not s["phase"].startswith("load")]
        for sample in shown:
            typer.echo(f"  t={sample['t']:>6}s RSS {sample['rss_mib']:.1f} MiB, "
                       f"{sample['fds']} fds, {sample['completed']} completed"
                       + (f", held {sample['held_mib']:.2f} MiB, {sample['detached']:.0f} "
                          f"detached ({sample['phase']})" if "phase" in sample else ""))
        for line in report.error_samples:
            typer.echo(f"  error: {line}")
    resumed = report.resume is None or (report.resume.ok and report.released)
    ok = (report.errors == 0 and report.accounted and resumed
          and (sigterm_at is not None or report.rss_growth <= max_rss_growth)
          and (sigterm_at is None or report.gateway_exit == 0))
    raise typer.Exit(0 if ok else 1)


@bench_app.command("journal")
def journal_command(
    sessions: Annotated[int, typer.Option(min=1, metavar="N",
                                          help="Detached sessions held.")] = 64,
    events: Annotated[int, typer.Option(min=1, metavar="N",
                                        help="Results each holds.")] = 20_000,
    requests: Annotated[int, typer.Option(
        min=0, metavar="N", help="Requests on one resumable session (0: skip).")] = 160,
    request_mib: Annotated[float, typer.Option(
        min=0.01, metavar="MIB", help="Each request's size.")] = 1.0,
    key_mib: Annotated[float, typer.Option(
        min=0, metavar="MIB", help="The envelope whose key is timed (0: skip).")] = 48.0,
    as_json: AsJson = False,
) -> None:
    """What resume's memory costs: the RSS per byte its journals count (sessions holding
    results while detached), and a gateway's RSS and held bytes after --requests requests
    of --request-mib on one resumable session; and what keying a --key-mib envelope
    costs the event loop, before and now."""
    import trio

    from gateway.tools.bench.journal import journal

    _quiet_logs()
    report = trio.run(lambda: journal(sessions, events, requests=requests,
                                      request_mib=request_mib, key_mib=key_mib))
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=2))
        return
    typer.echo(f"{sessions} detached sessions x {events} results: journals count "
               f"{report.held_bytes / 2**20:.1f} MiB ({report.payload_bytes / 2**20:.1f} MiB "
               f"of result payloads); RSS grew {report.rss_growth_bytes / 2**20:.1f} MiB: "
               f"{report.rss_per_held_byte:.2f} bytes of RSS per byte counted")
    if requests:
        typer.echo(f"{requests} requests of {request_mib:g} MiB on one resumable session: "
                   f"gateway RSS {report.gateway_rss_before_mib} -> "
                   f"{report.gateway_rss_after_mib} MiB, resume_held_bytes "
                   f"{report.gateway_held_bytes / 2**20:.2f} MiB (bound "
                   f"{report.session_bytes / 2**20:g} MiB)")
    if key_mib:
        typer.echo(f"the key of a {key_mib:g} MiB envelope: before, on the event loop "
                   f"{report.key_whole_on_loop_s * 1000:.0f} ms (the loop stalls for all of "
                   f"it; in a thread, its longest gap "
                   f"{report.key_whole_in_thread_gap_s * 1000:.0f} ms); now "
                   f"{report.key_s * 1000:.0f} ms in a thread, the loop's longest gap "
                   f"{report.key_gap_s * 1000:.1f} ms (a thread that only sleeps: "
                   f"{report.key_idle_gap_s * 1000:.1f} ms)")


@bench_app.command("flap")
def flap_command(
    runs: Annotated[int, typer.Option(min=1, metavar="N", help="chat runs.")] = 20,
    rtt_ms: Annotated[float, typer.Option(
        min=0.0, metavar="MS", help="The path's round trip (half each way).")] = 80.0,
    reset_min: Annotated[float, typer.Option(
        min=0.01, metavar="SECONDS", help="Shortest time between two resets.")] = 0.15,
    reset_max: Annotated[float, typer.Option(
        min=0.01, metavar="SECONDS", help="Longest time between two resets.")] = 0.6,
    tokens: Annotated[int, typer.Option(
        min=1, metavar="N", help="Each answer's length (--max-tokens).")] = 300,
    seed: Annotated[int, typer.Option(metavar="N", help="When the resets fall.")] = 34,
    as_json: AsJson = False, out: Out = None,
) -> None:
    """`nnrp-gateway chat` over a flapping WAN path: a proxy adds the round trip and
    resets every connection every --reset-min to --reset-max seconds while each answer
    streams. A run passes when chat exits 0 with exactly a quiet run's output (every word
    once); exit 1 unless every run passes."""
    import trio

    from gateway.tools.bench.flap import flap

    if out is not None:
        check_output_dir(out, "--out")
    if reset_max < reset_min:
        raise typer.BadParameter("--reset-max must be at least --reset-min")
    _quiet_logs()
    holder: list[Any] = []

    def work(progress: Callable[[str], None]) -> dict[str, list[Figure]]:
        holder.append(trio.run(lambda: flap(
            runs, rtt_ms=rtt_ms, reset_min=reset_min, reset_max=reset_max, tokens=tokens,
            seed=seed, log_dir=out / "logs" if out else None, progress=progress)))
        return {}

    _with_progress(work, as_json)
    report = holder[0]
    if not _written(report.as_dict(), out, "flap.json", as_json):
        typer.echo(f"{report.passed}/{report.runs} chat runs whole over a {rtt_ms:g} ms "
                   f"round trip reset every {reset_min:g}-{reset_max:g} s "
                   f"({tokens} tokens each; a quiet run took {report.reference_seconds:.1f} s)")
        for number, run in enumerate(report.results, start=1):
            typer.echo(f"  run {number}: exit {run.exit_code}, "
                       f"{'whole' if run.whole else 'NOT whole'}, {run.resets} resets, "
                       f"{run.seconds:.1f} s" + (f": {run.error}" if run.error else ""))
    raise typer.Exit(0 if report.ok else 1)


@bench_app.command("value")
def value_command(
    ctx: typer.Context,
    vllm_url: Annotated[str, typer.Option(
        metavar="URL", help="A real vLLM's OpenAI server (a CPU build on loopback, or a "
                            "GPU one).")],
    model: Annotated[str, typer.Option(metavar="NAME", help="The served model.")] = "tiny",
    tokens: Annotated[int, typer.Option(
        min=8, metavar="N", help="Each answer's length (max_tokens, ignore_eos).")] = 128,
    answers: Annotated[int, typer.Option(
        min=1, metavar="N", help="Answers at once, each way, at each cut rate.")] = 8,
    cut_rates: Annotated[str, typer.Option(
        metavar="N,N,...", help="Connection cuts per answer, one phase each.")] = "0,1,5",
    fleet_resumes: Annotated[int, typer.Option(
        min=0, metavar="N", help="Resumes timed on the same pod and through another "
                                 "(0: skip the fleet's cost).")] = 20,
    as_json: AsJson = False, out: Out = None,
) -> None:
    """What NNRP's resume saves against HTTP/SSE re-sends on a real vLLM: the same
    answers both ways, their connections cut at each rate; vLLM's own counters say what
    it generated and processed. Writes value.json, value.md and value.png (the plot
    needs the 'plots' extra) to --out."""
    import httpx
    import trio

    from gateway.tools.bench import wake
    from gateway.tools.bench.value import markdown, measure_value, plot

    check_http_url(vllm_url, source(ctx, "vllm_url"))
    try:
        rates = sorted({int(rate) for rate in cut_rates.split(",")})
    except ValueError:
        raise typer.BadParameter("--cut-rates is a list of whole numbers: 0,1,5") from None
    if any(rate < 0 for rate in rates):
        raise typer.BadParameter("--cut-rates cannot be negative")
    if out is not None:
        check_output_dir(out, "--out")
    try:  # before anything is started in front of it: is anybody there?
        httpx.get(f"{vllm_url.rstrip('/')}/version", timeout=5, trust_env=False)
    except httpx.HTTPError as exc:
        raise UserError(f"vLLM did not answer ({exc or type(exc).__name__})", vllm_url,
                        code=1) from None
    _quiet_logs()
    holder: list[Any] = []

    def work(progress: Callable[[str], None]) -> dict[str, list[Figure]]:
        holder.append(trio.run(lambda: measure_value(
            vllm_url, model=model, tokens=tokens, answers=answers, rates=rates,
            fleet_resumes=fleet_resumes, progress=progress,
            log_dir=out / "logs" if out else None)))
        return {}

    _with_progress(work, as_json)
    report = holder[0]
    report.wake_us = wake.measure(quick=False)
    text = markdown(report)
    if out is not None:
        (out / "value.md").write_text(text)
        plot(report, out / "value.png")
    if not _written(report.as_dict(), out, "value.json", as_json):
        typer.echo(text, nl=False)


@bench_app.command("media")
def media_command(quick: Quick = False, as_json: AsJson = False, out: Out = None) -> None:
    """Images over NNRP as binary frames against base64 in JSON, per MiB at 1, 16 and 63
    MiB (the largest a 64 MiB packet carries), against the replay vLLM: bytes on the
    client's link, the gateway's CPU and its added latency, for data-URI and media-dir
    delivery; and the stall 32 paced streams see while 63 MiB submits arrive."""
    import trio

    from gateway.tools.bench import wake
    from gateway.tools.bench.media import NOTES, run_media_bench
    from gateway.tools.bench.stats import against_wake

    if out is not None:
        check_output_dir(out, "--out")
    _quiet_logs()
    holder: list[Any] = []

    def work(progress: Callable[[str], None]) -> dict[str, list[Figure]]:
        holder.append(trio.run(lambda: run_media_bench(
            quick, progress, log_dir=out / "logs" if out else None)))
        return {}

    _with_progress(work, as_json)
    report = holder[0]
    _report("media", against_wake(report.figures, wake.measure(quick)), as_json, out,
            notes=NOTES, details=report.as_dict())


def _written(document: dict[str, Any], out: Path | None, name: str, as_json: bool) -> bool:
    """A report kept in ``out`` as ``name`` and, with ``--json``, printed: True when it
    was printed (the caller prints its text form otherwise)."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(json.dumps(document, indent=2) + "\n")
    if as_json:
        typer.echo(json.dumps(document, indent=2))
    return as_json


def _echo_resume(report: SoakReport) -> None:
    tally = report.resume
    assert tally is not None
    typer.echo(f"  resume: {tally.cuts} cuts (one every {report.cut_every:g} s on average, "
               f"{report.cut_latency_ms:g} ms round trip), "
               f"{tally.resumes} resumes ({tally.unexpected_reconnects} unexplained) in "
               f"{tally.attempts} attempts; {tally.whole}/{tally.operations} operations whole: "
               f"{tally.lost} events lost, {tally.duplicated} duplicated, {tally.reordered} "
               f"reordered, {tally.incomplete} incomplete")
    latency = tally.times.summary()
    if latency is not None:
        typer.echo(f"  resume latency, cut -> first result after it: p50 {latency['p50']} ms, "
                   f"p99 {latency['p99']} ms, less the wait for the backend's next token "
                   f"{latency['unpaced_p50']} / {latency['unpaced_p99']} ms "
                   f"(n={latency['n']:.0f}, {tally.untimed} untimed)")
    released = ", ".join("NOT within the window + 30 s" if after is None else f"{after:g} s"
                         for after in report.released_after_s)
    typer.echo(f"  window {report.resume_window:g} s: every session gone and nothing held, "
               f"after each period, {released} after the clients left; RSS idle "
               f"{report.rss_idle_mib} MiB, after the first period's windows "
               f"{report.rss_baseline_mib} MiB, after the second's "
               f"{report.samples[-1]['rss_mib'] if report.samples else '?'} MiB "
               f"({report.rss_growth * 100:+.1f} %)")
    for line in tally.failures:
        typer.echo(f"  resume failure: {line}")


@bench_app.command("relay", hidden=True)
def relay_command(
    listen: Annotated[str, typer.Option(metavar="HOST:PORT", help="Where to accept.")],
    target: Annotated[str, typer.Option(
        metavar="HOST:PORT", help="Where to relay each connection to.")],
) -> None:
    """A null relay (plain TCP bytes, trio) in the gateway's place: `bench run`'s baseline
    for what one more process hop costs on this host."""
    import trio

    from gateway.tools.bench.relay import serve_relay

    trio.run(serve_relay, check_host_port(listen, "--listen"),
             check_host_port(target, "--target"))
