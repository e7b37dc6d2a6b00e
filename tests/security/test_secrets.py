"""Secrets never leave: the upstream API key, session tokens, resume tokens and trace
attribute bodies are absent from logs, diagnostics events, error messages, --print-config
and every exported trace span (a real OTLP receiver takes them: no attribute, event,
status or resource value may carry a secret, nor the prompt's or the completion's text)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import trio
from typer.testing import CliRunner

from cli.main import app
from gateway.tools.client import ClientError, connect
from tests.support.otlp import OtlpReceiver
from tests.support.processes import free_port, wait_ready
from tests.support.stack import chat, envelope, run_operation
from tests.support.waits import wait_for

API_KEY = "sk-upstream-SECRET-1f2e"
TOKEN = "tok-session-SECRET-9a8b"
ATTRIBUTE = b"customer=SECRET-attribute-77"
SECRETS = ("SECRET-1f2e", "SECRET-9a8b", "SECRET-attribute")
#: Content: the prompt's text (and, found at run time, the completion's).
PROMPT = "PROMPT-TEXT-4d5e"


def test_no_secret_in_any_output(tmp_path: Path) -> None:
    with OtlpReceiver() as receiver:
        _scan(tmp_path, receiver)


def _scan(tmp_path: Path, receiver: OtlpReceiver) -> None:
    exe = str(Path(sys.executable).parent / "nnrp-gateway")
    vllm, nnrp_port, admin = free_port(), free_port(), free_port()
    replay = subprocess.Popen([exe, "replay-server", "--listen", f"127.0.0.1:{vllm}",
                               "--api-key", API_KEY], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    # The gateway's output goes to a file, not a pipe: nobody reads a pipe while the
    # test drives the gateway, and a full pipe (debug logs) would block its loop and its
    # span exporter (both write logs) until the wait below times out.
    log_path = tmp_path / "gateway.log"
    log = log_path.open("w")
    gateway = subprocess.Popen(
        [exe, "serve", "--listen", f"tcp://127.0.0.1:{nnrp_port}", "--vllm-url",
         f"http://127.0.0.1:{vllm}", "--admin-listen", f"127.0.0.1:{admin}", "--metrics",
         "--upstream-api-key", API_KEY, "--auth-token", TOKEN, "--log-level", "debug",
         "--otel-traces"],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
             "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_TRACES_SAMPLER": "always_on"})
    outputs: list[str] = []
    completions: list[str] = []
    resume_tokens: list[bytes] = []
    try:
        wait_ready(f"http://127.0.0.1:{admin}")

        async def drive() -> None:
            async with connect(f"tcp://127.0.0.1:{nnrp_port}") as client:
                try:
                    await client.open_session(auth=b"tok-wrong-SECRET-9a8b-guess")
                except ClientError as exc:
                    outputs.append(str(exc))
                session = await client.open_session(auth=TOKEN.encode())
                await session.trace_context(trace_id=1, span_id=2, attributes=ATTRIBUTE)
                prompt = {"messages": [{"role": "user", "content": PROMPT}]}
                for body in (chat(stream=True, max_tokens=2, **prompt), chat("no-such-model"),
                             chat(temperature=-1), chat(max_tokens=4, **prompt)):
                    outcome = await run_operation(session, envelope(
                        body, nnrp_policy={"diagnostics": True}))
                    outputs.append(json.dumps(outcome.partials))
                    outputs.append(json.dumps(outcome.final))
                    if outcome.final and outcome.final["type"] == "response.completed":
                        completions.extend(choice["message"]["content"] for choice
                                           in outcome.final["body"]["choices"])
                # A resumable session, dropped and resumed: its tokens are secrets too.
                async with connect(f"tcp://127.0.0.1:{nnrp_port}") as first:
                    resumable = await first.open_session(auth=TOKEN.encode(), resume=True)
                    assert resumable.ticket is not None
                    resume_tokens.append(resumable.ticket.token)
                async with httpx.AsyncClient() as http:
                    detached = 'nnrp_gateway_resume_sessions{state="detached"} 1.0'
                    with trio.fail_after(10):  # until the gateway has seen it end
                        while detached not in (  # noqa: ASYNC110 - another process's state
                                await http.get(f"http://127.0.0.1:{admin}/metrics")).text:
                            await trio.sleep(0.05)
                async with connect(f"tcp://127.0.0.1:{nnrp_port}") as second:
                    resumed = await second.resume_session(resumable.ticket,
                                                          auth=TOKEN.encode())
                    assert resumed.ticket is not None
                    resume_tokens.append(resumed.ticket.token)
                    await resumed.close()
                async with httpx.AsyncClient() as http:
                    for path in ("/metrics", "/capabilities", "/readyz"):
                        outputs.append((await http.get(f"http://127.0.0.1:{admin}{path}")).text)

        trio.run(drive)
        # The spans leave in the exporter's own time (50 ms batches): wait for them, not
        # for the drain to flush them within its grace on a loaded host.
        wait_for(lambda: len([s for s in receiver.taken()
                              if s.attributes.get("nnrp.operation.id")]) >= 4,
                 what="the four operations' spans")
    finally:
        gateway.terminate()  # the drain sends what is still queued before it exits
        gateway.wait(timeout=20)
        log.close()
        outputs.append(log_path.read_text())
        replay.kill()
        replay.wait()
    spans = receiver.taken()
    assert len([s for s in spans if s.attributes.get("nnrp.operation.id")]) == 4, spans
    exported = "\n".join(span.as_text() for span in spans)
    outputs.append(exported)
    assert [text for text in completions if len(text) >= 8]  # something to look for
    for text in (PROMPT, *completions):
        if len(text) >= 8:  # a token or two may be a common word; the whole text may not
            assert text not in exported, text
    printed = CliRunner().invoke(app, ["serve", "--upstream-api-key", API_KEY,
                                       "--auth-token", TOKEN, "--print-config"])
    outputs.append(printed.output)
    everything = "\n".join(outputs)
    assert '"event": "operation"' in everything  # the logs were captured
    assert "response.diagnostics" in everything
    assert "session authentication failed" in everything
    assert "session resumed" in everything
    for secret in SECRETS:
        assert secret not in everything, secret
    assert len(resume_tokens) == 2
    for token in resume_tokens:  # in any spelling a log could use
        for spelling in (token.hex(), repr(token), base64.b64encode(token).decode()):
            assert spelling not in everything
