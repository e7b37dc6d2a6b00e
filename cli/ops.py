"""Operator commands: ``health`` (container health checks), ``check`` (is vLLM ready for
us?), ``chat`` (a terminal NNRP client; Ctrl-C sends a real CANCEL)."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from gateway.tools.client import ClientOperation, Trust

AdminUrl = Annotated[str, typer.Option(envvar="NNRP_GATEWAY_ADMIN_URL",
                                       help="Base URL of the gateway's admin listener.")]


def health(admin_url: AdminUrl = "http://127.0.0.1:9090",
           readiness: Annotated[bool, typer.Option(
               "--ready", help="Check /readyz instead of /healthz.")] = False,
           quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
           timeout: Annotated[float, typer.Option(
               help="Seconds; a gateway saturated by streams answers late.")] = 5.0) -> None:
    """Exit 0 when the gateway answers /healthz (or /readyz with --ready), 1 otherwise."""
    path = "/readyz" if readiness else "/healthz"
    # The standard library, not httpx: a container runs this every few seconds, and
    # httpx (with httpcore and trio behind it) would double its start-up. No proxies.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{admin_url.rstrip('/')}{path}", timeout=timeout) as response:
            status, text = response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:  # an answer all the same (503 from /readyz)
        status, text = exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        if not quiet:
            typer.echo(f"unhealthy: {admin_url}{path} unreachable ({type(exc).__name__})",
                       err=True)
        raise typer.Exit(1) from None
    if not quiet:
        typer.echo(f"{status} {text}")
    raise typer.Exit(0 if status == 200 else 1)


def check(vllm_url: Annotated[str, typer.Option(envvar="NNRP_GATEWAY_VLLM_URL")]
          = "http://127.0.0.1:8000",
          upstream_api_key: Annotated[str | None, typer.Option(
              envvar="NNRP_GATEWAY_UPSTREAM_API_KEY")] = None,
          allow_untested_vllm: Annotated[bool, typer.Option(
              envvar="NNRP_GATEWAY_ALLOW_UNTESTED_VLLM")] = False,
          as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Can the gateway serve this vLLM? Health, version and binding, models. Exit 1 if not."""
    import trio

    from gateway.observe import configure_logging
    from gateway.upstream import UnsupportedVersion, UpstreamConfig, UpstreamError, VllmClient

    configure_logging(level="warning", to_stderr=True)

    async def probe() -> dict[str, Any]:
        client = VllmClient(UpstreamConfig(vllm_url, upstream_api_key))
        report: dict[str, Any] = {"vllm_url": vllm_url, "ready": False}
        try:
            report["healthy"] = await client.health()
            info = await client.probe(allow_untested=allow_untested_vllm)
            report.update(version=info.version, binding=info.binding.family,
                          untested=info.untested, models=list(info.models))
            report["ready"] = report["healthy"]
        except UnsupportedVersion as exc:
            report["error"] = str(exc)
        except UpstreamError as exc:
            report["error"] = f"vLLM unreachable or failing: {exc}"
        finally:
            await client.aclose()
        return report

    report = trio.run(probe)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            typer.echo(f"{key:>10}: {value}")
    raise typer.Exit(0 if report["ready"] else 1)


def chat(prompt: Annotated[str | None, typer.Argument(
             help="One-shot prompt; omit for an interactive session.")] = None,
         endpoint: Annotated[str, typer.Option(envvar="NNRP_GATEWAY_ENDPOINT")]
         = "tcp://127.0.0.1:7700",
         model: Annotated[str, typer.Option()] = "example-model",
         max_tokens: Annotated[int | None, typer.Option()] = None,
         usage: Annotated[bool, typer.Option(help="Ask for and show token usage.")] = True,
         ca_file: Annotated[Path | None, typer.Option(
             "--ca-file", exists=True, dir_okay=False,
             help="PEM trust anchor for tcps://, wss:// and quic:// (the server's "
                  "certificate or its CA; default: the system's store).")] = None) -> None:
    """Chat over NNRP from a terminal: streams text, shows tool calls and usage; Ctrl-C
    during an answer sends a real CANCEL (the gateway aborts vLLM's request). A dropped
    connection is reconnected and the session resumed: the answer goes on."""
    import trio

    from gateway.observe import configure_logging
    from gateway.tools.client import ClientError, Trust

    configure_logging(level="warning", to_stderr=True)
    try:
        trio.run(_chat, prompt, endpoint, model, max_tokens, usage, Trust(ca_file))
    except (ClientError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


async def _chat(prompt: str | None, endpoint: str, model: str, max_tokens: int | None,
                usage: bool, trust: Trust) -> None:
    import trio

    from gateway.tools.client import connect

    history: list[dict[str, Any]] = []
    async with connect(endpoint, ssl_context=trust.ssl_context(), quic=trust.quic(),
                       resume=True) as client:
        session = await client.open_session(resume=True)
        while True:
            text = prompt if prompt is not None else await trio.to_thread.run_sync(_ask)
            if text is None:
                break
            history.append({"role": "user", "content": text})
            body: dict[str, Any] = {"model": model, "messages": history, "stream": True}
            if usage:
                body["stream_options"] = {"include_usage": True}
            if max_tokens:
                body["max_tokens"] = max_tokens
            operation = await session.submit(json.dumps({
                "schema_version": "openai-compatible/1",
                "operation": "chat.completions.create", "body": body}).encode())
            answer = await _stream_answer(operation)
            if answer is not None:
                history.append({"role": "assistant", "content": answer})
            if prompt is not None:
                break
        await session.close()


def _ask() -> str | None:
    try:
        line = input("you> ")
    except EOFError:
        return None
    return line or None


async def _stream_answer(operation: ClientOperation) -> str | None:
    import trio

    from gateway import nnrp

    parts: list[str] = []
    try:
        async for event in operation.events():
            if isinstance(event, nnrp.PartialReceived):
                _show(json.loads(event.body), parts)
            elif isinstance(event, nnrp.ResultReceived) and event.typed_body is not None:
                final = json.loads(event.typed_body.frames[0].payload)
                if final["type"] == "response.error":
                    error = final["error"]
                    typer.echo(f"\n[error {error['code']}: {error['message']}]", err=True)
                    return None
            elif isinstance(event, nnrp.DropReceived):
                typer.echo("\n[cancelled]")
                return None
    except KeyboardInterrupt:
        with trio.CancelScope(shield=True):
            await operation.cancel()
            async for _ in operation.events():
                pass
        typer.echo("\n[cancelled]")
        return None
    typer.echo()
    return "".join(parts)


def _show(event: dict[str, Any], parts: list[str]) -> None:
    kind = event["type"]
    if kind == "response.output_text.delta":
        parts.append(event["delta"])
        sys.stdout.write(event["delta"])
        sys.stdout.flush()
    elif kind == "response.tool_call.completed":
        typer.echo(f"\n[tool call {event['name']}({event['arguments']})]")
    elif kind == "response.usage":
        typer.echo(f"\n[usage {event['usage']}]", nl=False)
