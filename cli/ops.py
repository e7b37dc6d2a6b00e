"""Operator commands: ``health`` (container health checks), ``check`` (is vLLM ready for
us?), ``chat`` (a terminal NNRP client; Ctrl-C sends a real CANCEL)."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._app import EXIT_FAILED, EXIT_INTERRUPTED, UserError, first_of, source
from ._settings import check_host_port, check_http_url

if TYPE_CHECKING:
    from gateway.tools.client import ClientOperation, Trust

AdminUrl = Annotated[str | None, typer.Option(
    envvar="NNRP_GATEWAY_ADMIN_URL", metavar="URL",
    help="Base URL of the gateway's admin listener [default: from NNRP_GATEWAY_ADMIN_LISTEN "
         "when set, else http://127.0.0.1:9090].")]
AuthToken = Annotated[str | None, typer.Option(
    envvar="NNRP_GATEWAY_CLIENT_AUTH_TOKEN", metavar="TOKEN",
    help="Session auth token to present (the gateway's --auth-token).")]
AuthTokenFile = Annotated[Path | None, typer.Option(
    metavar="PATH", help="Read the session auth token from this file (its first line).")]
CaFile = Annotated[Path | None, typer.Option(
    "--ca-file", metavar="PEM",
    help="Trust anchor for tcps://, wss:// and quic://: the server's certificate or its "
         "CA (on quic://, its own certificate only when self-signed) [default: the "
         "system's store].")]


def admin_base_url(explicit: str | None) -> str:
    """``--admin-url``, else the admin listener the gateway in this container was given
    (``NNRP_GATEWAY_ADMIN_LISTEN``: the image's HEALTHCHECK follows a moved port), else the
    chart's and the image's default."""
    if explicit:
        return explicit
    listen = os.environ.get("NNRP_GATEWAY_ADMIN_LISTEN")
    if not listen:
        return "http://127.0.0.1:9090"
    if listen.startswith("unix:"):
        raise UserError("health cannot reach a unix: admin listener; give --admin-url",
                        f"NNRP_GATEWAY_ADMIN_LISTEN={listen}")
    host, port = check_host_port(listen, f"environment variable NNRP_GATEWAY_ADMIN_LISTEN="
                                         f"{listen}")
    if host in ("", "0.0.0.0", "::"):  # every address: this host's loopback is one of them
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def health(ctx: typer.Context,
           admin_url: AdminUrl = None,
           readiness: Annotated[bool, typer.Option(
               "--ready", help="Check /readyz instead of /healthz.")] = False,
           quiet: Annotated[bool, typer.Option(
               "--quiet", "-q", help="Print nothing; the exit status says it.")] = False,
           timeout: Annotated[float, typer.Option(
               min=0.1, metavar="SECONDS",
               help="How long to wait; a gateway saturated by streams answers late.")
           ] = 5.0) -> None:
    """Exit 0 when the gateway answers /healthz (or /readyz with --ready), 1 otherwise."""
    path = "/readyz" if readiness else "/healthz"
    base = admin_base_url(admin_url)
    check_http_url(base, source(ctx, "admin_url") if admin_url else "the admin listener")
    url = f"{base.rstrip('/')}{path}"
    # The standard library, not httpx: a container runs this every few seconds, and
    # httpx (with httpcore and trio behind it) would double its start-up. No proxies.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as response:
            status, text = response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:  # an answer all the same (503 from /readyz)
        status, text = exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if quiet:
            raise typer.Exit(EXIT_FAILED) from None
        raise UserError(f"unhealthy: no answer ({reason})", url, code=EXIT_FAILED) from None
    if not quiet:
        typer.echo(f"{status} {text}")
    raise typer.Exit(0 if status == 200 else EXIT_FAILED)


def check(ctx: typer.Context,
          vllm_url: Annotated[str, typer.Option(
              envvar="NNRP_GATEWAY_VLLM_URL", metavar="URL",
              help="Base URL of the vLLM OpenAI server.")] = "http://127.0.0.1:8000",
          upstream_api_key: Annotated[str | None, typer.Option(
              envvar="NNRP_GATEWAY_UPSTREAM_API_KEY", metavar="KEY",
              help="Bearer token for vLLM's --api-key.")] = None,
          allow_untested_vllm: Annotated[bool, typer.Option(
              envvar="NNRP_GATEWAY_ALLOW_UNTESTED_VLLM",
              help="Accept a vLLM outside the tested lines, as serve would.")] = False,
          as_json: Annotated[bool, typer.Option(
              "--json", help="The report as JSON.")] = False) -> None:
    """Can the gateway serve this vLLM? Health, version and binding, models. Exit 1 if not."""
    import trio

    from gateway.observe import configure_logging
    from gateway.upstream import UnsupportedVersion, UpstreamConfig, UpstreamError, VllmClient

    from ._settings import check_http_url

    check_http_url(vllm_url, source(ctx, "vllm_url"))
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
    else:  # the error, when there is one, is the error line below
        for key, value in report.items():
            if key != "error":
                typer.echo(f"{key:>10}: {value}")
    if not report["ready"]:
        why = report.get("error") or "its /health answers unhealthy"
        raise UserError(f"not ready to serve ({why})", vllm_url, code=EXIT_FAILED)


def read_auth_token(token: str | None, token_file: Path | None,
                    ctx: typer.Context | None = None) -> bytes:
    """``--auth-token`` or the first line of ``--auth-token-file``: what SESSION_OPEN
    presents (empty: none)."""
    if token is not None and token_file is not None:
        given = (f"{source(ctx, 'auth_token')} and {source(ctx, 'auth_token_file')}"
                 if ctx is not None else "--auth-token and --auth-token-file")
        raise UserError("give one session token, not two", given)
    if token_file is not None:
        try:
            lines = token_file.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read the token file ({getattr(exc, 'strerror', exc)})",
                            f"--auth-token-file {token_file}") from None
        token = next((line.strip() for line in lines if line.strip()), "")
        if not token:
            raise UserError("the token file is empty", f"--auth-token-file {token_file}")
    return (token or "").encode()


def check_endpoint(endpoint: str, where: str = "--endpoint") -> None:
    """A URL the NNRP clients can dial (gateway.transport's syntax, with a real port)."""
    from gateway.transport import ListenError, parse_endpoint

    try:
        spec = parse_endpoint(endpoint)
    except ListenError as exc:
        raise UserError(str(exc), where) from None
    if spec.scheme != "unix" and spec.port == 0:
        raise UserError(f"{endpoint}: a client needs the port to dial", where)


def connection_failure(error: BaseException, endpoint: str, *,
                       ca_file: Path | None = None, auth: bytes = b"") -> UserError:
    """A failed connect or a broken session, said the way an operator can act on it: the
    first cause that names something (an untrusted certificate, a refused port, a name
    that does not resolve, a peer that is not NNRP)."""
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:
        cause = pending.pop(0)
        if id(cause) in seen:
            continue
        seen.add(id(cause))
        said = _said(cause, ca_file=ca_file, auth=auth)
        if said is not None:
            return UserError(said, endpoint, code=EXIT_FAILED)
        if isinstance(cause, BaseExceptionGroup):
            pending.extend(cause.exceptions)
        pending.extend(c for c in (cause.__cause__, cause.__context__) if c is not None)
    leaf = first_of(error, BaseException)  # the error itself, or its group's first leaf
    return UserError(f"no NNRP session ({leaf or type(leaf).__name__})", endpoint,
                     code=EXIT_FAILED)


def _said(cause: BaseException, *, ca_file: Path | None, auth: bytes) -> str | None:
    """What one cause of a failed connection says, or None to look further."""
    import socket
    import ssl

    import trio

    from gateway.nnrp import HttpAnswerError
    from gateway.tools.client import ClientError
    from gateway.transport import WebSocketRefused
    from gateway.transport.quic import QuicConnectError

    if isinstance(cause, ssl.SSLCertVerificationError):
        return _untrusted(ca_file, cause.verify_message)
    if isinstance(cause, QuicConnectError) and cause.untrusted:
        # aioquic checks against a store of its own: no partial chain (--ca-file's help),
        # so a file holding the server's CA-issued certificate finds no issuer.
        quic_rule = ("; on quic:// the file must hold the CA (the certificate itself only "
                     "when it is self-signed)"
                     if ca_file is not None and "issuer" in cause.reason else "")
        return _untrusted(ca_file, cause.reason) + quic_rule
    if isinstance(cause, ssl.SSLError):
        return (f"the TLS handshake failed ({cause.reason or cause.strerror}); is this a "
                "TLS listener?")
    if isinstance(cause, HttpAnswerError):
        return (f"that is an HTTP server (vLLM's own port?), not NNRP: it answered "
                f"{cause.status_line!r}")
    if isinstance(cause, socket.gaierror):
        return f"cannot resolve the host ({cause.strerror})"
    if isinstance(cause, trio.TooSlowError):
        return "no NNRP answer in time: is this an NNRP endpoint?"
    if isinstance(cause, WebSocketRefused) and cause.status:  # an HTTP answer
        body = cause.body.decode(errors="replace").strip()
        return (f"the server refused the WebSocket upgrade (HTTP "
                f"{cause.status}{': ' + body if body else ''})")
    if isinstance(cause, ClientError) and "session refused" in str(cause):
        hint = "" if auth else "; does the gateway require --auth-token?"
        return f"{cause}{hint}"
    if isinstance(cause, OSError) and cause.strerror:
        said = cause.strerror
        if said.startswith("Error connecting to") and cause.errno and cause.errno > 0:
            said = os.strerror(cause.errno)  # trio's prefix names the address again
        return f"cannot connect ({said})"
    return None


def _untrusted(ca_file: Path | None, why: str) -> str:
    """The line for a server certificate the client refused, on every TLS transport."""
    trusted = (f"not trusted by --ca-file {ca_file}" if ca_file is not None
               else "not trusted; give --ca-file")
    return f"the server's certificate is {trusted} ({why})"


#: Seconds chat tries to resume a session whose connection dropped before it gives up
#: (the gateway would wait its --resume-window, two minutes by default).
RECOVERY_LIMIT = 10.0


def chat(ctx: typer.Context,
         prompt: Annotated[str | None, typer.Argument(
             help="One-shot prompt; omit for an interactive session.")] = None,
         endpoint: Annotated[str, typer.Option(
             envvar="NNRP_GATEWAY_ENDPOINT", metavar="URL",
             help="The gateway: tcp://HOST:PORT, unix:///PATH, ws://HOST:PORT/PATH, "
                  "tcps://, wss:// or quic://.")] = "tcp://127.0.0.1:7700",
         model: Annotated[str, typer.Option(help="Served model name.")] = "example-model",
         max_tokens: Annotated[int | None, typer.Option(
             min=1, metavar="N", help="Longest answer, in tokens.")] = None,
         usage: Annotated[bool, typer.Option(help="Ask for and show token usage.")] = True,
         ca_file: CaFile = None,
         auth_token: AuthToken = None,
         auth_token_file: AuthTokenFile = None,
         reconnect_for: Annotated[float, typer.Option(
             min=0.0, metavar="SECONDS",
             help="How long to try to resume the session after the connection drops, "
                  "before giving up (the gateway's --resume-window bounds it too).")
         ] = RECOVERY_LIMIT) -> None:
    """Chat over NNRP from a terminal: streams text, shows tool calls and usage; Ctrl-C
    during an answer sends a real CANCEL (the gateway aborts vLLM's request). A dropped
    connection is reconnected and the session resumed: the answer goes on. Exit 1 when
    an answer fails (an error or a drop), 130 after Ctrl-C in a one-shot chat."""
    import trio

    from gateway.observe import configure_logging

    check_endpoint(endpoint, source(ctx, "endpoint"))
    auth = read_auth_token(auth_token, auth_token_file, ctx)
    trust = trust_for(ca_file)
    configure_logging(level="warning", to_stderr=True)
    quiet_quic_logs()
    try:
        status = trio.run(_chat, prompt, endpoint, model, max_tokens, usage, trust, auth,
                          reconnect_for)
    except (KeyboardInterrupt, UserError):
        raise
    except Exception as exc:
        raise connection_failure(exc, endpoint, ca_file=ca_file, auth=auth) from None
    raise typer.Exit(status)


def quiet_quic_logs() -> None:
    """aioquic logs a failed handshake itself (a bare "Error: 298, reason: ..." line on
    stderr); the tools say it once, in their own error line."""
    import logging

    logging.getLogger("quic").setLevel(logging.CRITICAL)


def trust_for(ca_file: Path | None) -> Trust:
    """``--ca-file`` checked up front: a missing or non-PEM file is named, not a TLS
    failure later."""
    from gateway.tools.client import Trust

    if ca_file is not None:
        try:
            text = ca_file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read the CA file ({getattr(exc, 'strerror', exc)})",
                            f"--ca-file {ca_file}") from None
        if "-----BEGIN CERTIFICATE-----" not in text:
            raise UserError("not a PEM certificate", f"--ca-file {ca_file}")
    return Trust(ca_file)


#: Seconds the goodbye (SESSION_CLOSE and its answer) may take.
CLOSE_LIMIT = 2.0

#: What one answer came to: its text, and the exit status it is worth.
Answer = tuple["str | None", int]


class _Interrupts:
    """Ctrl-C as chat's own event, not a KeyboardInterrupt: trio would raise that in
    whatever task runs when it comes (the connection's reader too), so the signal is
    received (``trio.open_signal_receiver``) and each one sets ``event``, which the
    answer being streamed (or the prompt being waited at) watches."""

    def __init__(self) -> None:
        import trio

        self.event = trio.Event()

    async def watch(self, signals: Any) -> None:
        async for _ in signals:
            self.event.set()

    def reset(self) -> None:
        import trio

        self.event = trio.Event()


async def _chat(prompt: str | None, endpoint: str, model: str, max_tokens: int | None,
                usage: bool, trust: Trust, auth: bytes, reconnect_for: float) -> int:
    import signal
    import threading

    import trio

    interrupts = _Interrupts()
    if threading.current_thread() is not threading.main_thread():
        # Signals reach the main thread only (a caller running chat in a worker thread,
        # as tests do): there is no Ctrl-C to take here.
        return await _converse(prompt, endpoint, model, max_tokens, usage, trust, auth,
                               interrupts, reconnect_for)
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(interrupts.watch, signals)
            status = await _converse(prompt, endpoint, model, max_tokens, usage, trust,
                                     auth, interrupts, reconnect_for)
            nursery.cancel_scope.cancel()
    return status


async def _converse(prompt: str | None, endpoint: str, model: str, max_tokens: int | None,
                    usage: bool, trust: Trust, auth: bytes, interrupts: _Interrupts,
                    reconnect_for: float) -> int:
    import trio

    from gateway.tools.client import connect

    history: list[dict[str, Any]] = []
    status = 0
    async with connect(endpoint, ssl_context=trust.ssl_context(), quic=trust.quic(),
                       resume=True, recovery_limit=reconnect_for) as client:
        session = await client.open_session(resume=True, auth=auth)
        if prompt is None:
            typer.echo(LEAVE_HINT, err=True)
        while True:
            text = prompt if prompt is not None else await _ask_unless_interrupted(interrupts)
            if interrupts.event.is_set():  # Ctrl-C at the prompt: the chat ends
                status = EXIT_INTERRUPTED
                break
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
            answer, status = await _stream_answer(operation, interrupts.event)
            interrupts.reset()  # a Ctrl-C ends an answer; the session goes on
            if answer is not None:
                history.append({"role": "assistant", "content": answer})
            if prompt is not None:
                break
        # Nothing is left to wait for: a gateway gone for good (or draining) must not
        # hold the terminal for its resume window.
        with trio.move_on_after(CLOSE_LIMIT):
            await session.close()
    return status


async def _ask_unless_interrupted(interrupts: _Interrupts) -> str | None:
    """The next line typed, or None at the end of input or on Ctrl-C (the thread that
    reads is abandoned then: nothing can interrupt a blocking ``input``)."""
    import trio

    line: list[str | None] = []
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            line.append(await trio.to_thread.run_sync(_ask, abandon_on_cancel=True))
            nursery.cancel_scope.cancel()

        async def interrupted() -> None:
            await interrupts.event.wait()
            typer.echo(err=True)
            nursery.cancel_scope.cancel()

        nursery.start_soon(read)
        nursery.start_soon(interrupted)
    return line[0] if line else None


#: Said once, on stderr, when an interactive chat has its session: how to leave.
LEAVE_HINT = ("Type a message and Enter; Ctrl-D or an empty line leaves, Ctrl-C during "
              "an answer cancels it.")


def _ask() -> str | None:
    try:
        line = input("you> ")
    except EOFError:  # Ctrl-D: the prompt's line is ended, as Enter would have
        sys.stdout.write("\n")
        sys.stdout.flush()
        return None
    return line or None


async def _stream_answer(operation: ClientOperation, interrupted: Any) -> Answer:
    """Show one answer as it streams; on Ctrl-C (``interrupted`` set) send a real CANCEL
    and read the answer to its end (the gateway's drop)."""
    import trio


    parts: list[str] = []
    async with trio.open_nursery() as nursery:

        async def cancel_when_interrupted() -> None:
            await interrupted.wait()
            await operation.cancel()

        nursery.start_soon(cancel_when_interrupted)
        outcome = await _read_answer(operation, parts)
        nursery.cancel_scope.cancel()
    if interrupted.is_set():
        typer.echo("\n[cancelled]", err=True)
        return None, EXIT_INTERRUPTED
    if outcome is not None:
        typer.echo(f"\nerror: {outcome}", err=True)
        return None, EXIT_FAILED
    typer.echo()
    return "".join(parts), 0


async def _read_answer(operation: ClientOperation, parts: list[str]) -> str | None:
    """Every event of the answer, shown; what went wrong (None: it completed)."""
    from gateway import nnrp

    problem = None
    async for event in operation.events():
        if isinstance(event, nnrp.PartialReceived):
            _show(json.loads(event.body), parts)
        elif isinstance(event, nnrp.ResultReceived) and event.typed_body is not None:
            final = json.loads(bytes(event.typed_body.frames[0].payload))
            if final["type"] == "response.error":
                error = final["error"]
                problem = f"the answer failed ({error['code']}: {error['message']})"
        elif isinstance(event, nnrp.DropReceived):
            try:
                reason = nnrp.DropReason(event.drop_reason).name
            except ValueError:
                reason = str(event.drop_reason)
            detail = event.diagnostic.decode(errors="replace")
            problem = f"the answer was dropped ({reason}{': ' + detail if detail else ''})"
    return problem


def _show(event: dict[str, Any], parts: list[str]) -> None:
    kind = event["type"]
    if kind == "response.output_text.delta":
        parts.append(event["delta"])
        sys.stdout.write(event["delta"])
        sys.stdout.flush()
    elif kind == "response.tool_call.completed":
        typer.echo(f"\n[tool call {event['name']}({event['arguments']})]")
    elif kind == "response.usage":
        typer.echo(f"\n[usage: {usage_text(event['usage'])}]", nl=False)


def usage_text(usage: dict[str, Any]) -> str:
    """vLLM's token usage as a person reads it: ``prompt 9 tokens, completion 5 tokens,
    total 14`` (with the cached and reasoning tokens when vLLM counted them)."""
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    parts = []
    if prompt is not None:
        parts.append(f"prompt {prompt} tokens" + (f" ({cached} cached)" if cached else ""))
    if completion is not None:
        parts.append(f"completion {completion} tokens"
                     + (f" ({reasoning} reasoning)" if reasoning else ""))
    if usage.get("total_tokens") is not None:
        parts.append(f"total {usage['total_tokens']}")
    return ", ".join(parts) or "none counted"
