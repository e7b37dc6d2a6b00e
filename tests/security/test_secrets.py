"""Secrets never leave: the upstream API key, session tokens, resume tokens and trace
attribute bodies are absent from logs, diagnostics events, error messages and
--print-config."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import httpx
import trio
from typer.testing import CliRunner

from cli.main import app
from gateway.tools.client import ClientError, connect
from tests.support.processes import free_port, wait_ready
from tests.support.stack import chat, envelope, run_operation

API_KEY = "sk-upstream-SECRET-1f2e"
TOKEN = "tok-session-SECRET-9a8b"
ATTRIBUTE = b"customer=SECRET-attribute-77"
SECRETS = ("SECRET-1f2e", "SECRET-9a8b", "SECRET-attribute")


def test_no_secret_in_any_output(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).parent / "nnrp-gateway")
    vllm, nnrp_port, admin = free_port(), free_port(), free_port()
    replay = subprocess.Popen([exe, "replay-server", "--listen", f"127.0.0.1:{vllm}",
                               "--api-key", API_KEY], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    gateway = subprocess.Popen(
        [exe, "serve", "--listen", f"tcp://127.0.0.1:{nnrp_port}", "--vllm-url",
         f"http://127.0.0.1:{vllm}", "--admin-listen", f"127.0.0.1:{admin}", "--metrics",
         "--upstream-api-key", API_KEY, "--auth-token", TOKEN, "--log-level", "debug"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outputs: list[str] = []
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
                for body in (chat(stream=True, max_tokens=2), chat("no-such-model"),
                             chat(temperature=-1)):
                    outcome = await run_operation(session, envelope(
                        body, nnrp_policy={"diagnostics": True}))
                    outputs.append(json.dumps(outcome.partials))
                    outputs.append(json.dumps(outcome.final))
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
    finally:
        gateway.terminate()
        outputs.append(gateway.communicate(timeout=20)[0])
        replay.kill()
        replay.wait()
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
