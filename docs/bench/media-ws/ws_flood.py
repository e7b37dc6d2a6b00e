"""A hostile WebSocket client against a gateway process: it opens ws://, then sends one
binary message as FRAGMENTS masked 1-byte frames that never finish, before any NNRP
packet (no authentication is needed to get this far). Printed: the gateway's RSS before
and after, the bytes the client sent, the gateway CPU it took, and the gateway's longest
trio task steps meanwhile (the instrument of ws_submit.py). A workplace measurement, not
part of the product:

    python docs/bench/media-ws/ws_flood.py [FRAGMENTS] > docs/bench/media-ws/ws_flood.txt
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from gateway.tools.bench import _media_load as load
from gateway.tools.bench._procs import process_cpu_seconds, until_http_ready
from gateway.tools.bench._stack import free_port

sys.path.insert(0, str(Path(__file__).parent))
from ws_submit import SITECUSTOMIZE, steps_since_last

#: Fragments per client send.
BATCH = 4096


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def masked_frame(opcode: int, payload: bytes) -> bytes:
    mask = os.urandom(4)
    masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
    return bytes([opcode, 0x80 | len(payload)]) + mask + masked


async def flood(gateway: subprocess.Popen[bytes], ws: int, admin: int, sink: int,
                sink_process: subprocess.Popen[bytes], fragments: int,
                steps_out: Path) -> None:
    await until_http_ready(f"http://127.0.0.1:{sink}/health", sink_process, "sink")
    await until_http_ready(f"http://127.0.0.1:{admin}/readyz", gateway, "gateway")
    stream = await trio.open_tcp_stream("127.0.0.1", ws)
    await stream.send_all(
        b"GET /nnrp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n")
    reply = await stream.receive_some(4096)
    print("handshake:", reply.split(b"\r\n")[0].decode(), flush=True)
    await trio.sleep(0.5)
    await steps_since_last(gateway, steps_out)
    before, cpu = rss_bytes(gateway.pid), process_cpu_seconds(gateway.pid)
    batch = masked_frame(0x0, b"x") * BATCH
    sent = len(masked_frame(0x2, b"x"))
    await stream.send_all(masked_frame(0x2, b"x"))
    began = time.perf_counter()
    try:
        for _ in range(fragments // BATCH):
            await stream.send_all(batch)
            sent += len(batch)
    except trio.BrokenResourceError as exc:
        print(f"the gateway closed the connection after {sent:,} bytes: {exc}")
    # Until the gateway has read it all: under 5 % of a core for a second (its health
    # checks go on).
    last = -1.0
    while (now := process_cpu_seconds(gateway.pid)) - last > 0.05:
        last = now
        await trio.sleep(1.0)
    took = time.perf_counter() - began
    after = rss_bytes(gateway.pid)
    steps = await steps_since_last(gateway, steps_out)
    print(f"{fragments:,} fragments, {sent:,} bytes sent in {took:.1f} s; gateway CPU "
          f"{last - cpu:.1f} s; RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB "
          f"(+{(after - before) / 2**20:.0f} MiB, {(after - before) / fragments:.0f} bytes "
          f"a fragment); longest task steps (ms, task): {steps}", flush=True)
    await stream.aclose()


def main(folder: Path, fragments: int) -> None:
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    steps_out = folder / "steps.json"
    sink, ws, admin = (free_port() for _ in range(3))
    sink_process = subprocess.Popen([sys.executable, "-m", load.__name__, "sink", str(sink)])
    exe = str(Path(sys.executable).parent / "nnrp-gateway")
    gateway = subprocess.Popen(
        [exe, "serve", "--listen", f"ws://127.0.0.1:{ws}/nnrp",
         "--vllm-url", f"http://127.0.0.1:{sink}", "--admin-listen", f"127.0.0.1:{admin}",
         "--log-level", "warning"],
        env={**os.environ, "PYTHONPATH": str(folder), "STEPS_OUT": str(steps_out)})
    try:
        trio.run(flood, gateway, ws, admin, sink, sink_process, fragments, steps_out)
    finally:
        for process in (gateway, sink_process):
            process.terminate()
            process.wait()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        main(Path(folder), int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20)
