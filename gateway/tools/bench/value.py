"""``bench value``: what resuming saves against re-sending, on a real vLLM.

The same workload two ways on one vLLM, each answer's connection cut ``rate`` times
through the same kind of cutting proxy (``gateway.tools.cut``), the cuts falling at the
same points of the answer (at 1/(rate+1), 2/(rate+1), ... of its tokens):

* **HTTP/SSE**: each client streams ``POST /v1/chat/completions`` straight to vLLM; cut,
  it re-sends its request, as OpenAI SDKs and agent runtimes do, and vLLM generates the
  answer again from its first token (the cut aborted the first).
* **NNRP**: each client streams through the gateway (``gateway.tools.client`` with
  resume); cut, it resumes its session and gets what it missed, while vLLM's one
  generation never stopped.

From vLLM's own ``/metrics`` counters (deltas over each phase: generation tokens, prompt
tokens, finished requests) and the clients' own accounting (tokens received, answers
whole, wall time): tokens vLLM generated per token a client got, prompt tokens processed
again, and the wall time until every answer was whole.

And the cost a fleet adds: two gateways of one fleet (``--fleet-advertise``) on the same
vLLM; a session opened on one, dropped, and resumed either on the same gateway or on the
other (which forwards it): the time from the new connection to the first result after
the resume, p50 of each, the same run, also in the run's bare trio wake-ups (``stats``
rule 6). No figure here has a goal: the report's verdict line (``stats`` rule 7) says so.

Answers are seeded (temperature 1, one seed) and ``ignore_eos``, so each is exactly
``tokens`` long and a re-sent request gets the same answer: the HTTP client checks it
does. (Greedy decoding of the tiny random-weight model gives no text at all.) vLLM sends
fewer text chunks than tokens (it holds back a token that does not decode to text yet),
so the cut points are placed by text chunks, counted in a first, uncut answer.
"""

from __future__ import annotations

import contextlib
import json
import os
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
from gateway.tools.client import ClientError, connect
from gateway.tools.cut import StreamCutProxy

from ._procs import until_http_ready
from ._stack import free_port
from .stats import verdict

Progress = Callable[[str], None]
PROMPT = "Tell me, at length, what a session protocol for model serving should do."
#: vLLM's counters each phase reads, summed over their labels.
COUNTERS = {"generation_tokens": "vllm:generation_tokens_total",
            "prompt_tokens": "vllm:prompt_tokens_total",
            "prefix_cache_hits": "vllm:prefix_cache_hits_total",
            "finished_requests": "vllm:request_success_total"}
ANSWER_TIMEOUT = 600


@attrs.define
class Phase:
    """One way at one cut rate."""

    way: str  # "http" or "nnrp"
    cuts_per_answer: int
    answers: int
    tokens: int
    #: What the clients got, whole (``answers * tokens`` when every answer was whole).
    tokens_delivered: int = 0
    whole: int = 0
    cuts: int = 0
    #: Requests the clients sent (HTTP: one per attempt; NNRP: one per answer, whatever
    #: the gateway then did).
    attempts: int = 0
    #: HTTP: re-sent answers that differed from what came before the cut (seeded
    #: sampling repeats itself; a batch of another shape may not, on some backends).
    differing_resends: int = 0
    wall_seconds: float = 0.0
    vllm: dict[str, float] = attrs.field(factory=dict)
    prompt_tokens_per_request: int = 0

    @property
    def generated_per_delivered(self) -> float | None:
        generated = self.vllm.get("generation_tokens")
        if not self.tokens_delivered or generated is None:
            return None
        return round(generated / self.tokens_delivered, 3)

    @property
    def prompt_tokens_again(self) -> float | None:
        prompt = self.vllm.get("prompt_tokens")
        if prompt is None:
            return None
        return prompt - self.answers * self.prompt_tokens_per_request

    @property
    def vllm_requests(self) -> float | None:
        """Requests vLLM started, from one source both ways: its prompt tokens over one
        request's (it does not count a request whose client left as finished)."""
        prompt = self.vllm.get("prompt_tokens")
        if prompt is None or not self.prompt_tokens_per_request:
            return None
        return round(prompt / self.prompt_tokens_per_request, 2)

    def as_dict(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "generated_per_delivered": self.generated_per_delivered,
                "prompt_tokens_again": self.prompt_tokens_again,
                "vllm_requests": self.vllm_requests}


@attrs.define
class FleetCost:
    resumes: int
    same_pod_ms: list[float] = attrs.field(factory=list)
    other_pod_ms: list[float] = attrs.field(factory=list)

    def summary(self) -> dict[str, Any]:
        same = statistics.median(self.same_pod_ms) if self.same_pod_ms else None
        other = statistics.median(self.other_pod_ms) if self.other_pod_ms else None
        return {"resumes_each": self.resumes,
                "same_pod_p50_ms": None if same is None else round(same, 2),
                "other_pod_p50_ms": None if other is None else round(other, 2),
                "same_pod_p90_ms": _p90(self.same_pod_ms),
                "other_pod_p90_ms": _p90(self.other_pod_ms),
                "ratio": None if not same or other is None else round(other / same, 2)}


def _p90(samples: list[float]) -> float | None:
    if len(samples) < 10:
        return None
    return round(statistics.quantiles(samples, n=10)[-1], 2)


@attrs.define
class ValueReport:
    vllm_url: str
    model: str
    tokens: int
    answers: int
    phases: list[Phase] = attrs.field(factory=list)
    fleet: FleetCost | None = None
    vllm_version: str = ""
    #: Text chunks of one answer (where the cuts fall).
    text_chunks: int = 0
    #: The run's bare trio wake-up, microseconds (``stats`` rule 6).
    wake_us: float | None = None

    def fleet_summary(self) -> dict[str, Any] | None:
        """The fleet's resume latencies, each also in the run's wake-ups."""
        if self.fleet is None:
            return None
        summary = self.fleet.summary()
        for pod in ("same_pod", "other_pod"):
            p50 = summary[f"{pod}_p50_ms"]
            summary[f"{pod}_p50_wakes"] = (None if p50 is None or not self.wake_us else
                                           round(p50 * 1000 / self.wake_us, 1))
        return summary

    def as_dict(self) -> dict[str, Any]:
        return {"vllm_url": self.vllm_url, "vllm_version": self.vllm_version,
                "model": self.model, "tokens": self.tokens, "answers": self.answers,
                "text_chunks": self.text_chunks, "wake_us": self.wake_us,
                "phases": [phase.as_dict() for phase in self.phases],
                "fleet": self.fleet_summary(),
                "fleet_samples_ms": attrs.asdict(self.fleet) if self.fleet else None}


def chat_body(model: str, tokens: int, *, stream: bool = True) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}],
            "stream": stream, "max_tokens": tokens, "ignore_eos": True, "temperature": 1.0,
            "seed": 7, **({"stream_options": {"include_usage": True}} if stream else {})}


async def vllm_counters(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    return parse_counters((await client.get(f"{url}/metrics", timeout=10)).text)


def parse_counters(text: str) -> dict[str, float]:
    """``COUNTERS`` from a Prometheus text page, each summed over its labels."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for key, counter in COUNTERS.items():
            if name == counter:
                totals[key] += float(line.rsplit(" ", 1)[1])
    return totals


def cut_points(chunks: int, cuts: int) -> list[int]:
    """Where an answer's connection is cut: after these many of its text chunks."""
    return [max(1, chunks * k // (cuts + 1)) for k in range(1, cuts + 1)]


# --------------------------------------------------------------------------- HTTP/SSE


async def http_answer(proxy: StreamCutProxy, model: str, tokens: int, cuts: list[int],
                      phase: Phase) -> None:
    """One answer over HTTP/SSE through ``proxy``: cut at each of ``cuts`` (its position
    in the answer), re-sent from the start each time, until one attempt is whole."""
    body = chat_body(model, tokens)
    pending = list(cuts)
    reference: list[str] | None = None
    async with httpx.AsyncClient(base_url=f"http://{proxy.uri}", timeout=60,
                                 trust_env=False) as client:
        while True:
            phase.attempts += 1
            pieces: list[str] = []
            finished = False
            try:
                async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
                    reply.raise_for_status()
                    async for line in reply.aiter_lines():
                        if line == "data: [DONE]":
                            finished = True
                        if not line.startswith("data: ") or finished:
                            continue
                        chunk = json.loads(line[6:])
                        for choice in chunk.get("choices", []):
                            text = choice.get("delta", {}).get("content")
                            if text:
                                pieces.append(text)
                        if pending and len(pieces) >= pending[0]:
                            pending.pop(0)
                            phase.cuts += 1
                            proxy.cut()
            except (httpx.TransportError, httpx.RemoteProtocolError):
                finished = False
            if not finished:
                if reference is None or len(pieces) > len(reference):
                    reference = pieces  # a re-send is the same greedy answer
                continue
            if reference is not None and pieces[:len(reference)] != reference:
                phase.differing_resends += 1
            phase.whole += 1
            phase.tokens_delivered += tokens  # ignore_eos: exactly max_tokens
            return


# --------------------------------------------------------------------------- NNRP


async def nnrp_answer(proxy: StreamCutProxy, model: str, tokens: int, cuts: list[int],
                      phase: Phase, index: int) -> None:
    """One answer over NNRP through the gateway behind ``proxy``: cut at each of
    ``cuts``; the client resumes its session and the stream goes on."""
    document = {"schema_version": "openai-compatible/1",
                "operation": "chat.completions.create", "request_id": f"value-{index}",
                "body": chat_body(model, tokens)}
    pending = list(cuts)
    async with connect(f"tcp://{proxy.uri}", resume=True) as client:
        session = await client.open_session(resume=True)
        operation = await session.submit(json.dumps(document).encode())
        sequences: list[int] = []
        text_events = 0
        final: nnrp.ResultReceived | None = None
        async for event in operation.events():
            if isinstance(event, nnrp.PartialReceived):
                sequences.append(event.sequence)
                delta = json.loads(event.body)
                if delta.get("type") == "response.output_text.delta":
                    text_events += 1
                if pending and text_events >= pending[0]:
                    pending.pop(0)
                    phase.cuts += 1
                    proxy.cut()
            elif isinstance(event, nnrp.ResultReceived):
                final = event
        await session.close()
    if (final is not None and final.meta.status_code == 200
            and sequences == list(range(1, len(sequences) + 1))):
        phase.whole += 1
        phase.tokens_delivered += tokens  # ignore_eos: exactly max_tokens


# --------------------------------------------------------------------------- phases


async def run_phase(way: str, rate: int, *, answers: int, tokens: int, model: str,
                    target: tuple[str, int], vllm_url: str, prompt_tokens: int,
                    chunks: int) -> Phase:
    phase = Phase(way, rate, answers, tokens, prompt_tokens_per_request=prompt_tokens)
    cuts = cut_points(chunks, rate)
    async with httpx.AsyncClient(trust_env=False) as metrics:
        before = await vllm_counters(metrics, vllm_url)
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            proxies = []
            for _ in range(answers):
                proxy = StreamCutProxy(target)
                await nursery.start(proxy.serve)
                proxies.append(proxy)
            with trio.fail_after(ANSWER_TIMEOUT):
                async with trio.open_nursery() as clients:
                    for index, proxy in enumerate(proxies):
                        if way == "http":
                            clients.start_soon(http_answer, proxy, model, tokens, cuts, phase)
                        else:
                            clients.start_soon(nnrp_answer, proxy, model, tokens, cuts,
                                               phase, index)
            phase.wall_seconds = round(time.perf_counter() - start, 3)
            nursery.cancel_scope.cancel()
        # vLLM counts an aborted request's tokens when it aborts: let it settle.
        await trio.sleep(1.0)
        after = await vllm_counters(metrics, vllm_url)
    phase.vllm = {key: after[key] - before[key] for key in COUNTERS}
    if way == "nnrp":
        phase.attempts = answers
    return phase


async def calibrate(vllm_url: str, model: str, tokens: int) -> tuple[int, int, str]:
    """One uncut answer: its prompt's tokens, its text chunks, and vLLM's version."""
    chunks = prompt = 0
    async with httpx.AsyncClient(base_url=vllm_url, trust_env=False, timeout=120) as client:
        async with client.stream("POST", "/v1/chat/completions",
                                 json=chat_body(model, tokens)) as reply:
            reply.raise_for_status()
            async for line in reply.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    prompt = int(chunk["usage"]["prompt_tokens"])
                chunks += sum(1 for choice in chunk.get("choices", [])
                              if choice.get("delta", {}).get("content"))
        version = ""
        with contextlib.suppress(httpx.HTTPError, ValueError):
            version = (await client.get("/version")).json().get("version", "")
    return prompt, chunks, version


@contextlib.asynccontextmanager
async def gateways(vllm_url: str, count: int, log_dir: Path, *, fleet: bool
                   ) -> AsyncIterator[list[str]]:
    """``count`` gateway processes in front of ``vllm_url`` (one fleet when ``fleet``);
    yields their tcp:// endpoints."""
    exe = str(Path(sys.executable).parent / "nnrp-gateway")
    processes: list[subprocess.Popen[bytes]] = []
    key = log_dir / "fleet.key"
    key.write_text(os.urandom(32).hex() + "\n")
    key.chmod(0o600)
    endpoints = []
    try:
        for index in range(count):
            port, admin = free_port(), free_port()
            args = [exe, "serve", "--listen", f"tcp://127.0.0.1:{port}", "--vllm-url", vllm_url,
                    "--admin-listen", f"127.0.0.1:{admin}", "--log-level", "warning"]
            if fleet:
                args += ["--fleet-advertise", f"127.0.0.1:{free_port()}",
                         "--fleet-key-file", str(key)]
            with (log_dir / f"gateway-{index}.log").open("wb") as log:
                processes.append(subprocess.Popen(  # noqa: ASYNC220 - started, not awaited
                    args, stdout=log, stderr=log))
            await until_http_ready(f"http://127.0.0.1:{admin}/readyz", processes[-1],
                                   "gateway")
            endpoints.append(f"127.0.0.1:{port}")
        yield endpoints
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                await trio.to_thread.run_sync(process.wait, 15)
            except subprocess.TimeoutExpired:
                process.kill()


async def fleet_cost(endpoints: list[str], model: str, resumes: int, tokens: int) -> FleetCost:
    """Resume latency, same pod against through a forward: a session opened on the
    first gateway, dropped after a few results, resumed on the first or the second
    (alternating), timed from the new connection to the first result after the resume."""
    cost = FleetCost(resumes)
    owner, other = endpoints
    document = {"schema_version": "openai-compatible/1",
                "operation": "chat.completions.create", "request_id": "value-fleet",
                "body": chat_body(model, tokens)}
    payload = json.dumps(document).encode()
    for attempt in range(2 * resumes):
        async with connect(f"tcp://{owner}") as client:
            session = await client.open_session(resume=True)
            assert session.ticket is not None
            operation = await session.submit(payload, operation_id=5, frame_id=5)
            held = 0
            async for event in operation.events():
                if isinstance(event, nnrp.PartialReceived):
                    held = event.sequence
                    if held >= 5:
                        break
        await trio.sleep(0.05)  # the gateway sees the end and detaches the session
        where = owner if attempt % 2 == 0 else other
        start = time.perf_counter()
        async with connect(f"tcp://{where}") as client:
            resumed = await _resumed(client, session.ticket)
            again = await resumed.resubmit(payload, operation_id=5, frame_id=5, after=held)
            async for event in again.events():
                if isinstance(event, nnrp.PartialReceived | nnrp.ResultReceived):
                    elapsed = (time.perf_counter() - start) * 1000
                    (cost.same_pod_ms if where == owner else cost.other_pod_ms).append(elapsed)
                    break
            await resumed.close()
    return cost


async def _resumed(client: Any, ticket: Any) -> Any:
    """The session resumed, retried while the gateway still has it attached (it has
    not seen the old connection end yet: retry_later)."""
    for _ in range(50):
        try:
            return await client.resume_session(ticket)
        except ClientError as exc:
            if not exc.retry_later:
                raise
            await trio.sleep(0.01)
    return await client.resume_session(ticket)


async def measure_value(vllm_url: str, *, model: str, tokens: int, answers: int,
                        rates: list[int], fleet_resumes: int, progress: Progress,
                        log_dir: Path | None = None) -> ValueReport:
    prompt_tokens, chunks, version = await calibrate(vllm_url, model, tokens)
    report = ValueReport(vllm_url, model, tokens, answers, vllm_version=version,
                         text_chunks=chunks)
    parsed = httpx.URL(vllm_url)
    vllm_target = (parsed.host, parsed.port or 80)
    with tempfile.TemporaryDirectory(prefix="nnrp-bench-value-") as scratch:
        logs = log_dir or Path(scratch)
        logs.mkdir(parents=True, exist_ok=True)
        async with gateways(vllm_url, 1, logs, fleet=False) as (endpoint,):
            host, _, port = endpoint.rpartition(":")
            for rate in rates:
                for way, target in (("http", vllm_target), ("nnrp", (host, int(port)))):
                    progress(f"{way}, {rate} cut(s) per answer, {answers} answers")
                    report.phases.append(await run_phase(
                        way, rate, answers=answers, tokens=tokens, model=model,
                        target=target, vllm_url=vllm_url, prompt_tokens=prompt_tokens,
                        chunks=chunks))
        if fleet_resumes:
            progress(f"fleet: {fleet_resumes} resumes on the same pod, {fleet_resumes} "
                     "through another")
            async with gateways(vllm_url, 2, logs, fleet=True) as endpoints:
                report.fleet = await fleet_cost(endpoints, model, fleet_resumes, tokens)
    return report


def markdown(report: ValueReport) -> str:
    lines = [f"vLLM {report.vllm_version or '?'} at {report.vllm_url}, model {report.model}: "
             f"{report.answers} answers of {report.tokens} tokens each way, at each cut rate.",
             "",
             "| cuts per answer | way | cuts made | answers whole | vLLM tokens generated "
             "per token delivered | prompt tokens sent again (from the prefix cache) | "
             "requests vLLM started | wall time until all whole (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for phase in report.phases:
        way = "HTTP/SSE re-send" if phase.way == "http" else "NNRP resume"
        lines.append(
            f"| {phase.cuts_per_answer} | {way} | {phase.cuts} "
            f"| {phase.whole}/{phase.answers} | {phase.generated_per_delivered} "
            f"| {phase.prompt_tokens_again:g} ({phase.vllm.get('prefix_cache_hits', 0):g}) "
            f"| {phase.vllm_requests:g} "
            f"| {phase.wall_seconds} |")
    summary = report.fleet_summary()
    if summary is not None:
        lines += ["", f"Resume latency (new connection to first result after it), p50 of "
                  f"{summary['resumes_each']} each: same pod {summary['same_pod_p50_ms']} ms, "
                  f"through another pod of the fleet {summary['other_pod_p50_ms']} ms "
                  f"(x{summary['ratio']}); p90 {summary['same_pod_p90_ms']} and "
                  f"{summary['other_pod_p90_ms']} ms."]
        if report.wake_us:
            lines.append(f"In this run's bare trio wake-ups ({report.wake_us:.1f} us back to "
                         f"back): same pod {summary['same_pod_p50_wakes']}, another pod "
                         f"{summary['other_pod_p50_wakes']}.")
    lines += ["", verdict(())]  # no goals here: the line says so, as every bench's ends
    return "\n".join(lines) + "\n"


def plot(report: ValueReport, path: Path) -> bool:
    """Tokens generated per token delivered against the cut rate, both ways (needs
    matplotlib, the 'plots' extra); False without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for way, label in (("http", "HTTP/SSE, re-send on a cut"),
                       ("nnrp", "NNRP through the gateway, resume on a cut")):
        phases = [p for p in report.phases if p.way == way]
        ax.plot([p.cuts_per_answer for p in phases],
                [p.generated_per_delivered or 0 for p in phases], "o-", label=label)
    ax.set_xlabel("connection cuts per answer")
    ax.set_ylabel("vLLM tokens generated per token delivered")
    ax.set_ylim(bottom=0)
    ax.set_title(f"What a cut costs ({report.tokens}-token answers, vLLM {report.vllm_version})",
                 fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
