"""``bench media``: what an image costs on its way to vLLM, as binary NNRP frames against
base64 in JSON, per MiB of media (docs/media.md says how the gateway handles it).

Processes: the replay vLLM as a sink (``_media_load.MediaSink``: it stamps each
request's last byte with ``time.monotonic_ns()``, one clock for the host), two gateways
(``nnrp-gateway serve``: one delivering media as data URIs, one writing them to
``--media-dir``), the measuring client here, and, for the stall, a load process
(``_media_load.send_load``). Per size (1, 16 and 63 MiB: a packet may not exceed 64
MiB, ``PROTOCOL_MAX_PACKET``), rounds of the same image each way, the ways' order
rotating from round to round (a drift over the run falls on every way alike):

* **direct**: base64 in a JSON POST straight to vLLM;
* **data URI** and **media dir**: binary frames through the gateway (``nnrp:frame/1``);
* **base64 envelope**: the frozen profile's way, base64 inside the envelope over NNRP
  (only while it fits a packet: base64 is a third larger, so 47 MiB of media at most);
* a text-only request to each gateway, whose CPU is taken off the media requests'.

Measured:

1. **bytes on the client's link** per byte of media: the FRAME_SUBMIT packet, the HTTP
   request (head and body), the envelope's packet;
2. **gateway CPU per MiB**: the gateway process's own CPU clock (``_procs``) from the
   submit to its result, less a text-only request's, over the media's MiB (p50 of the
   rounds);
3. **added latency**: from the client's call to vLLM holding the whole request (for the
   media dir, its files there too), through the gateway less straight to vLLM, p50; the
   run's noise is how far one way's p50 moved between the two halves of its rounds, and
   a difference at or below it is "not measurable here" (``stats`` rules 1-2);
4. **the stall other streams see**: the inter-event gap p99 of ``STREAMS`` paced text
   streams through one gateway while big submits arrive back to back on another
   connection (the load process), against the same streams without them, in the order
   without, with, with, without; the ratio's goal is ``STALL_GOAL``. A control runs the
   same with the load sent to the *other* gateway (another process on the same machine):
   what the machine's contention alone costs the streams (the load client, the kernel's
   copies and the other gateway share its cores), which no gateway can remove.

The client's own encoding (base64 and JSON for the POST, packing for NNRP) is done
before the clock starts: both sides are timed from a ready request.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from gateway import nnrp
from gateway.tools.client import ClientSession, connect

from . import _media_load as load
from ._procs import process_cpu_seconds, until_http_ready
from ._stack import envelope, fan_out, free_port, open_sessions
from .stats import Figure, Noise, percentile

Progress = Callable[[str], None]
MIB = load.MIB
SIZES_MIB = (1, 16, 63)
QUICK_SIZES_MIB = (1, 4)
#: Rounds per size: fewer for the big ones, whose every request is long already.
ROUNDS = {1: 16, 16: 8, 63: 6}
QUICK_ROUNDS = 4
#: The largest media whose base64 envelope fits one packet (``PROTOCOL_MAX_PACKET``
#: less a KiB for the header and the JSON around it, times 3/4), in whole MiB.
ENVELOPE_MAX_MIB = (nnrp.PROTOCOL_MAX_PACKET - 1024) * 3 // 4 // MIB
#: The gateways' limits: the protocol's largest packet, an envelope and media as large.
GATEWAY_LIMITS = ("--max-frame-bytes", str(nnrp.PROTOCOL_MAX_PACKET),
                  "--max-envelope-bytes", str(nnrp.PROTOCOL_MAX_PACKET),
                  "--max-media-bytes", str(nnrp.PROTOCOL_MAX_PACKET))
STREAMS = 32
STREAM_TOKENS, QUICK_STREAM_TOKENS = 800, 80
INTERVAL_US = 10_000
STALL_GOAL = 1.25
WAYS = {"direct": "base64 JSON POST straight to vLLM", "data_uri": "NNRP frames, data URI",
        "media_dir": "NNRP frames, media dir", "envelope": "NNRP, base64 in the envelope"}
NOTES = (f"A packet may not exceed {nnrp.PROTOCOL_MAX_PACKET >> 20} MiB "
         "(PROTOCOL_MAX_PACKET): 63 MiB is the largest image one FRAME_SUBMIT carries, and "
         f"{ENVELOPE_MAX_MIB} MiB the largest whose base64 envelope fits.",
         "vLLM 0.33 caps HTTP bodies at 32 MiB (VLLM_HTTP_MAX_REQUEST_BODY_SIZE): past "
         "24 MiB of media a data URI (direct or from the gateway) needs that raised; the "
         "media dir does not. The sink here (the replay vLLM) takes any size.")


# --------------------------------------------------------------------------- processes


@attrs.define
class MediaStack:
    """The sink and the two gateways, as processes on free loopback ports."""

    log_dir: Path | None = None
    sink_url: str = ""
    #: By delivery mode ("data_uri", "media_dir"): the NNRP endpoint and the process.
    endpoints: dict[str, str] = attrs.field(factory=dict)
    pids: dict[str, int] = attrs.field(factory=dict)
    processes: list[subprocess.Popen[bytes]] = attrs.field(factory=list)
    _logs: list[Any] = attrs.field(factory=list)

    def _output(self, name: str) -> Any:
        if self.log_dir is None:
            return subprocess.DEVNULL
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._logs.append((self.log_dir / name).open("wb"))
        return self._logs[-1]

    def _start(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = self._output(log_name)
        self.processes.append(subprocess.Popen(args, stdout=log, stderr=log))
        return self.processes[-1]

    async def start(self, media_dir: Path) -> None:
        port = free_port()
        self.sink_url = f"http://127.0.0.1:{port}"
        sink = self._start([sys.executable, "-m", load.__name__, "sink", str(port)],
                           "sink.log")
        await until_http_ready(f"{self.sink_url}/health", sink, "sink")
        exe = _gateway_exe()
        for mode, extra in (("data_uri", ()), ("media_dir", ("--media-dir", str(media_dir)))):
            listen, admin = free_port(), free_port()
            self.endpoints[mode] = f"tcp://127.0.0.1:{listen}"
            gateway = self._start(
                [exe, "serve",
                 "--listen", self.endpoints[mode], "--vllm-url", self.sink_url,
                 "--admin-listen", f"127.0.0.1:{admin}", "--log-level", "warning",
                 *GATEWAY_LIMITS, *extra], f"gateway-{mode}.log")
            self.pids[mode] = gateway.pid
            await until_http_ready(f"http://127.0.0.1:{admin}/readyz", gateway, f"gateway ({mode})")

    async def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                await trio.to_thread.run_sync(process.wait, 15)
            except subprocess.TimeoutExpired:
                process.kill()
        for log_file in self._logs:
            log_file.close()

    async def arrivals(self) -> dict[str, dict[str, Any]]:
        """What the sink received since the last call, by request id."""
        async with httpx.AsyncClient(trust_env=False) as client:
            listed = (await client.get(f"{self.sink_url}{load.ARRIVALS_PATH}")).json()
        return {arrival["request_id"]: arrival for arrival in listed}


def _gateway_exe() -> str:
    exe = Path(sys.executable).parent / "nnrp-gateway"
    return str(exe) if exe.exists() else "nnrp-gateway"


@contextlib.asynccontextmanager
async def media_stack(log_dir: Path | None) -> AsyncIterator[MediaStack]:
    stack = MediaStack(log_dir)
    with tempfile.TemporaryDirectory(prefix="nnrp-bench-media-") as media_dir:
        try:
            await stack.start(Path(media_dir))
            yield stack
        finally:
            with trio.CancelScope(shield=True):
                await stack.stop()


def _peak_rss_reset(pid: int) -> int:
    """Reset ``pid``'s peak RSS to its RSS now (proc(5), clear_refs 5); its RSS now."""
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")
    return _status_bytes(pid, "VmRSS")


def _status_bytes(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return 0


# --------------------------------------------------------------------------- per size


@attrs.define
class SizeResult:
    """One size's rounds: per way, each round's latency to the sink (ms) and gateway
    CPU (ms), the link bytes of one request, and each gateway's peak RSS growth."""

    mib: float
    rounds: int
    latency_ms: dict[str, list[float]] = attrs.field(factory=dict)
    cpu_ms: dict[str, list[float]] = attrs.field(factory=dict)
    link_bytes: dict[str, int] = attrs.field(factory=dict)
    peak_rss_growth: dict[str, int] = attrs.field(factory=dict)

    @property
    def media_bytes(self) -> int:
        return int(self.mib * MIB)

    def cpu_per_mib(self, way: str) -> float:
        """Gateway CPU ms per MiB of media: p50 of the way's rounds less a text-only
        request's to the same gateway."""
        text = statistics.median(self.cpu_ms[f"text_{_mode(way)}"])
        return (statistics.median(self.cpu_ms[way]) - text) / self.mib

    def added(self, way: str) -> tuple[float, Noise]:
        """p50 latency through the gateway less straight to vLLM (ms), and its noise: how
        far either way's p50 moved between the two halves of its rounds."""
        ours, direct = self.latency_ms[way], self.latency_ms["direct"]
        half = len(ours) // 2
        spreads = [abs(statistics.median(samples[:half]) - statistics.median(samples[half:]))
                   for samples in (ours, direct)] if half else [math.nan]
        first, second = statistics.median(ours), statistics.median(direct)
        return first - second, Noise(
            first, second, max(spreads), (f"{WAYS[way]} p50", "direct p50"),
            how="the larger move of a way's p50 between the two halves of its rounds",
            unit="ms")

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


async def _nnrp_request(session: ClientSession, request: load.MediaRequest, typed_body: bytes,
                        number: int, pid: int) -> tuple[int, float]:
    """One submit; when it was made (monotonic ns) and the gateway's CPU meanwhile (ms)."""
    cpu = process_cpu_seconds(pid)
    sent = time.monotonic_ns()
    operation = await session.submit_frame(request.meta(number), typed_body, frame_id=number)
    terminal = None
    async for event in operation.events():
        terminal = event
    cpu = process_cpu_seconds(pid) - cpu
    if not isinstance(terminal, nnrp.ResultReceived) or terminal.meta.status_code != 200:
        raise RuntimeError(f"{request.tag}: the gateway answered {terminal!r:.300}")
    return sent, cpu * 1000


async def _direct_request(client: httpx.AsyncClient, url: str, tag: str, body: bytes) -> int:
    sent = time.monotonic_ns()
    reply = await client.post(url, content=body, headers=_direct_headers(tag))
    if reply.status_code != 200:
        raise RuntimeError(f"{tag}: vLLM answered {reply.status_code}: {reply.text[:300]}")
    return sent


def _direct_headers(tag: str) -> dict[str, str]:
    return {"content-type": "application/json", "x-request-id": load.request_id(tag)}


def _http_request_bytes(client: httpx.AsyncClient, url: str, tag: str, body: bytes) -> int:
    """The POST's bytes on the link: its request line, headers and body, as sent."""
    request = client.build_request("POST", url, content=body, headers=_direct_headers(tag))
    head = f"POST {request.url.raw_path.decode()} HTTP/1.1\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in request.headers.items()) + "\r\n"
    return len(head.encode()) + len(body)


async def measure_size(stack: MediaStack, mib: float, rounds: int, run: str,
                       progress: Progress) -> SizeResult:
    result = SizeResult(mib, rounds)
    data = load.image(mib)
    ways = ["direct", "data_uri", "media_dir",
            *(["envelope"] if mib <= ENVELOPE_MAX_MIB else [])]
    #: Each NNRP way (and a text-only request to each gateway): its request, its gateway.
    nnrp_ways = {"data_uri": (load.MediaRequest("", data), "data_uri"),
                 "media_dir": (load.MediaRequest("", data), "media_dir"),
                 "envelope": (load.MediaRequest("", data, inline=True), "data_uri"),
                 "text_data_uri": (load.MediaRequest(""), "data_uri"),
                 "text_media_dir": (load.MediaRequest(""), "media_dir")}
    if "envelope" not in ways:
        del nnrp_ways["envelope"]
    url = f"{stack.sink_url}/v1/chat/completions"
    for way in [*ways[1:], "text_data_uri", "text_media_dir"]:
        result.cpu_ms[way] = []
    for way in ways:
        result.latency_ms[way] = []
    async with contextlib.AsyncExitStack() as exits:
        sessions = {}
        for mode, endpoint in stack.endpoints.items():
            client = await exits.enter_async_context(connect(endpoint))
            sessions[mode] = await client.open_session()
        http = await exits.enter_async_context(httpx.AsyncClient(
            trust_env=False, timeout=httpx.Timeout(120, connect=5)))
        result.link_bytes["direct"] = _http_request_bytes(
            http, url, "direct", load.direct_body("direct", data))
        for way in ways[1:]:
            request = nnrp_ways[way][0]
            result.link_bytes[way] = load.packet_bytes(request, request.typed_body)
        rss_before = {mode: _peak_rss_reset(pid) for mode, pid in stack.pids.items()}
        number = 0
        for round_ in range(rounds):
            progress(f"{mib:g} MiB: round {round_ + 1} of {rounds}, each way")
            turn = round_ % len(ways)
            sent: dict[str, int] = {}
            for way in [*ways[turn:], *ways[:turn], "text_data_uri", "text_media_dir"]:
                number += 1
                tag = f"{run}-{mib:g}-{round_}-{way}"
                if way == "direct":
                    sent[way] = await _direct_request(http, url, tag,
                                                      load.direct_body(tag, data))
                    continue
                request, mode = nnrp_ways[way]
                request = attrs.evolve(request, tag=tag)
                sent[way], cpu = await _nnrp_request(sessions[mode], request,
                                                     request.typed_body, number,
                                                     stack.pids[mode])
                result.cpu_ms[way].append(cpu)
            arrivals = await stack.arrivals()
            for way in ways:
                arrival = arrivals[load.request_id(f"{run}-{mib:g}-{round_}-{way}")]
                _check_whole(way, arrival, result.media_bytes)
                result.latency_ms[way].append((arrival["at_ns"] - sent[way]) / 1e6)
        for mode, pid in stack.pids.items():
            result.peak_rss_growth[mode] = _status_bytes(pid, "VmHWM") - rss_before[mode]
    return result


def _check_whole(way: str, arrival: dict[str, Any], media: int) -> None:
    """vLLM got the whole image: base64 in the body, or the file beside it."""
    whole = (arrival["file_bytes"] == media if way == "media_dir"
             else arrival["bytes"] >= media * 4 // 3)
    if not whole:
        raise RuntimeError(f"{way}: vLLM got {arrival} for {media} bytes of media")


# --------------------------------------------------------------------------- the stall


@attrs.define
class StallResult:
    """One load beside the paced streams: each round's gaps (ms) between two events of a
    stream as the client received them, and each event's delay from the sink's write to
    the client (ms), with and without the load; and what the load did."""

    name: str
    load_way: str
    load_mib: float
    streams: int
    gaps: dict[str, list[list[float]]] = attrs.field(
        factory=lambda: {"without": [], "with": []})
    delays: dict[str, list[list[float]]] = attrs.field(
        factory=lambda: {"without": [], "with": []})
    submits: list[int] = attrs.field(factory=list)
    submit_seconds: list[float] = attrs.field(factory=list)

    def p99(self, condition: str, which: str = "gaps") -> float:
        rounds = (self.gaps if which == "gaps" else self.delays)[condition]
        return percentile([value for samples in rounds for value in samples], 0.99)

    def round_p99s(self, condition: str) -> list[float]:
        return [percentile(samples, 0.99) for samples in self.gaps[condition]]

    @property
    def ratio(self) -> float:
        return self.p99("with") / self.p99("without")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "load_way": self.load_way, "load_mib": self.load_mib,
                "streams": self.streams, "submits": self.submits,
                "submit_seconds": [round(s, 4) for s in self.submit_seconds],
                **{f"gap_p99_ms_{c}": self.p99(c) for c in ("without", "with")},
                **{f"gap_p99_ms_{c}_by_round": self.round_p99s(c) for c in ("without", "with")},
                **{f"delay_p99_ms_{c}": self.p99(c, "delays") for c in ("without", "with")},
                "ratio": self.ratio}


async def _paced_stream(sessions: list[ClientSession], prefix: str, gaps: list[float],
                        delays: list[float], index: int) -> None:
    """One paced stream; the gaps between its text events as received, and each event's
    delay from the sink's write (the token is its ``time.monotonic_ns()``)."""
    operation = await sessions[index].submit(envelope(f"{prefix}-{index}"))
    last = 0
    async for event in operation.events():
        if isinstance(event, nnrp.PartialReceived):
            now = time.monotonic_ns()
            payload = json.loads(event.body)
            if payload["type"] != "response.output_text.delta":
                continue
            delays.append((now - int(payload["delta"])) / 1e6)
            if last:
                gaps.append((now - last) / 1e6)
            last = now


@contextlib.asynccontextmanager
async def _load(endpoint: str, way: str, mib: float, result: StallResult
                ) -> AsyncIterator[None]:
    """The load process submitting back to back while the body runs (module docstring
    of ``_media_load``); what it did goes into ``result``."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", load.__name__, "load", endpoint, way, f"{mib:g}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None
    assert process.stdout is not None
    output = b""
    try:
        with trio.fail_after(60):
            while load.READY.encode() not in output:
                chunk = await process.stdout.receive_some()
                if not chunk:
                    raise RuntimeError(f"the load process exited ({await process.wait()}) "
                                       "before it was ready")
                output += chunk
        yield
        await process.stdin.aclose()  # the streams have ended: stop after this submit
        with trio.fail_after(120):
            while chunk := await process.stdout.receive_some():
                output += chunk
            await process.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    summary = json.loads(output.decode().strip().splitlines()[-1])
    if summary["failures"]:
        raise RuntimeError(f"the load's submits failed: {summary['failures'][:2]}")
    result.submits.append(summary["submits"])
    result.submit_seconds += summary["seconds"]


async def measure_stall(stack: MediaStack, name: str, mode: str, load_way: str,
                        load_mib: float, *, quick: bool, run: str,
                        progress: Progress, load_mode: str | None = None) -> StallResult:
    """The streams through the ``mode`` gateway; the load to the ``load_mode`` one (the
    same by default; another for the control, rule 4)."""
    streams = 8 if quick else STREAMS
    tokens = QUICK_STREAM_TOKENS if quick else STREAM_TOKENS
    result = StallResult(name, load_way, load_mib, streams)
    order = ("without", "with") if quick else ("without", "with", "with", "without")
    async with open_sessions(stack.endpoints[mode], streams) as sessions:
        for number, condition in enumerate(order):
            progress(f"stall, {name}: {streams} paced streams {condition} {load_mib:g} MiB "
                     f"submits ({number + 1} of {len(order)})")
            gaps: list[float] = []
            delays: list[float] = []
            prefix = f"replay:timestamped:{tokens}:{INTERVAL_US}:{run}-{mode}-{number}"

            async def paced_streams() -> None:
                await fan_out(streams, lambda index: _paced_stream(
                    sessions, prefix, gaps, delays, index))  # noqa: B023 - awaited here

            if condition == "with":
                async with _load(stack.endpoints[load_mode or mode], load_way, load_mib,
                                 result):
                    await paced_streams()
            else:
                await paced_streams()
            result.gaps[condition].append(gaps)
            result.delays[condition].append(delays)
    await stack.arrivals()  # forget the load's
    return result


# --------------------------------------------------------------------------- figures


def size_figures(result: SizeResult) -> list[Figure]:
    figures = []
    size = f"{result.mib:g} MiB"
    media = result.media_bytes
    direct = result.link_bytes["direct"] / media
    for way in ("data_uri", "envelope"):
        if way in result.link_bytes:
            figures.append(Figure(
                f"bytes on the client's link per media byte, {WAYS[way]}, {size}",
                result.link_bytes[way] / media, "x", baseline=direct,
                baseline_name=WAYS["direct"],
                spread=f"{result.link_bytes[way]:,} bytes against {result.link_bytes['direct']:,}"
                       f" for {media:,} bytes of media"))
    for way in ("data_uri", "media_dir", "envelope"):
        if way not in result.cpu_ms:
            continue
        cpu = result.cpu_ms[way]
        text = result.cpu_ms[f"text_{_mode(way)}"]
        figures.append(Figure(
            f"gateway CPU per MiB, {WAYS[way]}, {size}", result.cpu_per_mib(way), "ms",
            spread=f"per submit p50 {statistics.median(cpu):.2f} ms (min {min(cpu):.2f}, max "
                   f"{max(cpu):.2f}), a text-only request {statistics.median(text):.2f} ms; "
                   f"{len(cpu)} rounds"))
    for way in ("data_uri", "media_dir", "envelope"):
        if way not in result.latency_ms:
            continue
        added, noise = result.added(way)
        per_mib = Noise(noise.first * 1000 / result.mib, noise.second * 1000 / result.mib,
                        noise.floor * 1000 / result.mib, noise.names, noise.how, unit="us")
        ours, direct_ms = result.latency_ms[way], result.latency_ms["direct"]
        figures.append(Figure(
            f"added latency per MiB, {WAYS[way]}, {size}", added * 1000 / result.mib, "us",
            baseline=noise.second * 1000 / result.mib, baseline_name="straight to vLLM",
            spread=f"submit -> vLLM has it, p50 {statistics.median(ours):.2f} ms (spread "
                   f"{min(ours):.2f}-{max(ours):.2f}) against straight to vLLM "
                   f"{statistics.median(direct_ms):.2f} ms ({min(direct_ms):.2f}-"
                   f"{max(direct_ms):.2f}); {len(ours)} rounds", noise=per_mib))
    for mode, growth in result.peak_rss_growth.items():
        figures.append(Figure(
            f"gateway peak RSS growth over the image's size, {WAYS[mode]}, {size}",
            growth / media, "x",
            spread=f"peak RSS {growth / MIB:.1f} MiB over the RSS before this size's rounds "
                   f"(every way to this gateway); the image {media / MIB:g} MiB"))
    return figures


def stall_figures(result: StallResult) -> list[Figure]:
    """The ratio against its goal, a path's figure over its control's (``stats`` rules 3
    and 4): the run must tell the goal's bound from the gap p99 without the load by more
    than its noise (how far the gap p99 moved between two rounds of the same condition),
    else the figure is "not measurable here", never met; and it is met only with a margin
    under the bound above that noise."""
    without, with_load = result.round_p99s("without"), result.round_p99s("with")
    spreads = [max(p99s) - min(p99s) for p99s in (without, with_load) if len(p99s) > 1]
    floor = max(spreads) if len(spreads) == 2 else math.nan
    baseline = result.p99("without")
    noise = Noise(result.p99("with"), baseline, floor,
                  ("the gap p99 with", "the gap p99 without"),
                  how="the larger move of the gap p99 between two rounds of the same "
                      "condition", combine="ratio", unit="ms")
    seconds = sorted(result.submit_seconds)
    gaps = {condition: [gap for samples in result.gaps[condition] for gap in samples]
            for condition in ("without", "with")}
    longest = {condition: max(values, default=math.nan) for condition, values in gaps.items()}
    # The p99 sees a stall only when the submits' holds touch 1 % of the gaps: a submit
    # the gateway takes long over (a slow host) may hold the loop for long and still be
    # too rare for it. The longest gap says what one hold costs a stream.
    return [Figure(
        f"longest stream gap with {result.load_mib:g} MiB submits / without, {result.name}, "
        f"{result.streams} streams", longest["with"] / longest["without"], "x",
        spread=f"{longest['with']:.0f} ms against {longest['without']:.0f} ms"), Figure(
        f"stream gap p99 with {result.load_mib:g} MiB submits / without, {result.name}, "
        f"{result.streams} streams", result.ratio, "x", goal=STALL_GOAL, noise=noise,
        spread=f"gap p99 with {result.p99('with'):.2f} ms (by round "
               f"{', '.join(f'{v:.2f}' for v in with_load)}), without {baseline:.2f} ms "
               f"({', '.join(f'{v:.2f}' for v in without)}); {len(gaps['with'])} gaps "
               f"with, {len(gaps['without'])} without; paced "
               f"{INTERVAL_US // 1000} ms; sink write -> client p99 "
               f"{result.p99('with', 'delays'):.2f} ms with, "
               f"{result.p99('without', 'delays'):.2f} without; {sum(result.submits)} "
               f"submits arrived meanwhile, each {percentile(seconds, 0.5) * 1000:.0f} ms p50 "
               f"from submit to result")]


def _mode(way: str) -> str:
    """The gateway (delivery mode) a way's requests go to."""
    return "media_dir" if way == "media_dir" else "data_uri"


# --------------------------------------------------------------------------- the run


@attrs.define
class MediaReport:
    sizes: list[SizeResult] = attrs.field(factory=list)
    stalls: list[StallResult] = attrs.field(factory=list)

    @property
    def figures(self) -> list[Figure]:
        return ([figure for size in self.sizes for figure in size_figures(size)]
                + [figure for stall in self.stalls for figure in stall_figures(stall)])

    def as_dict(self) -> dict[str, Any]:
        return {"sizes": [size.as_dict() for size in self.sizes],
                "stalls": [stall.as_dict() for stall in self.stalls]}


async def run_media_bench(quick: bool, progress: Progress, log_dir: Path | None = None
                          ) -> MediaReport:
    report = MediaReport()
    run = f"r{time.monotonic_ns()}"
    sizes = QUICK_SIZES_MIB if quick else SIZES_MIB
    biggest = sizes[-1]
    async with media_stack(log_dir) as stack:
        for mib in sizes:
            rounds = QUICK_ROUNDS if quick else ROUNDS[mib]
            report.sizes.append(await measure_size(stack, mib, rounds, run, progress))
        stalls: list[tuple[str, str, str, float, str | None]] = [
            ("data URI", "data_uri", "frames", biggest, None),
            ("media dir", "media_dir", "frames", biggest, None),
            ("base64 envelope", "data_uri", "envelope", min(biggest, ENVELOPE_MAX_MIB), None)]
        if not quick:  # the control (rule 4): the same load, sent to the other gateway
            stalls.append(("control, load to the other gateway", "data_uri", "frames",
                           biggest, "media_dir"))
        for name, mode, way, load_mib, load_mode in stalls:
            report.stalls.append(await measure_stall(stack, name, mode, way, load_mib,
                                                     quick=quick,
                                                     run=run, progress=progress,
                                                     load_mode=load_mode))
    return report
