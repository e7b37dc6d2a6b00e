"""The ``nnrp-gateway`` command line (typer). Thin: parse options, call ``trio.run``."""

from __future__ import annotations

import json

import trio
import typer

import gateway
from gateway import nnrp
from gateway.client import connect
from gateway.server import GatewayServer, OperationContext

from .bench import bench_app

app = typer.Typer(name="nnrp-gateway", no_args_is_help=True, add_completion=False,
                  help="Serve a co-located vLLM OpenAI server over NNRP/1 sessions.")
app.add_typer(bench_app, name="bench")


@app.command()
def version() -> None:
    """Print the gateway's version."""
    typer.echo(f"nnrp-vllm-gateway {gateway.__version__}")


async def _echo_words(op: OperationContext) -> None:
    """Interim demo handler: streams the request's words back as text deltas."""
    assert op.typed_body is not None
    words = json.loads(op.typed_body.frames[0].payload)["text"].split()
    for word in words:
        await op.emit(json.dumps({"type": "response.output_text.delta", "index": 0,
                                  "delta": word + " "}).encode())
        await trio.sleep(0.02)
    await op.finish(200, b'{"type":"response.completed"}')


async def _demo() -> None:
    server = GatewayServer(_echo_words)
    async with trio.open_nursery() as nursery:
        (endpoint,) = await nursery.start(server.serve, ["tcp://127.0.0.1:0"])
        typer.echo(f"NNRP server on {endpoint.uri}")
        async with connect(endpoint.uri) as client:
            session = await client.open_session()
            operation = await session.submit(
                json.dumps({"text": "streamed over a real NNRP session"}).encode())
            async for event in operation.events():
                if isinstance(event, nnrp.PartialReceived):
                    typer.echo(json.loads(event.body)["delta"], nl=False)
            typer.echo()
            await session.close()
        nursery.cancel_scope.cancel()


@app.command()
def demo() -> None:
    """Start a server on a free port and stream one answer through it over NNRP."""
    trio.run(_demo)


def main() -> None:
    app()
