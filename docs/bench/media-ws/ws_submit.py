"""One 63 MiB image (a binary media frame, delivered as a data URI) submitted over
tcp://, ws:// and quic:// to a gateway process, one at a time, each way twice: the time
from the submit to its result, the gateway process's CPU meanwhile, and its longest trio
task steps (over 2 ms), from a trio instrument the gateway process loads through
``sitecustomize``. The client is the project's (aioquic for quic://). A workplace
measurement, not part of the product:

    python docs/bench/media-ws/ws_submit.py > docs/bench/media-ws/ws_submit.txt
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from gateway.tools.bench import _media_load as load
from gateway.tools.bench._procs import process_cpu_seconds, until_http_ready
from gateway.tools.bench._stack import free_port
from gateway.tools.client import connect
from gateway.transport import QuicClientOptions
from tests.support.quic import make_pki

#: Loaded by the gateway process: its task steps over 2 ms, the longest written to
#: STEPS_OUT (and forgotten) on each SIGUSR1.
SITECUSTOMIZE = '''
import json, os, signal, time
import trio

class Steps(trio.abc.Instrument):
    def __init__(self):
        self.started = 0.0
        self.long = []
    def before_task_step(self, task):
        self.started = time.perf_counter()
    def after_task_step(self, task):
        took = time.perf_counter() - self.started
        if took > 0.002:
            self.long.append((round(took * 1000, 1), task.name))

steps = Steps()
original_run = trio.run

def run(*args, **kwargs):
    kwargs.setdefault("instruments", []).append(steps)
    return original_run(*args, **kwargs)

trio.run = run

def dump(*_):
    with open(os.environ["STEPS_OUT"], "w") as out:
        json.dump(sorted(steps.long, reverse=True)[:8], out)
    steps.long.clear()

signal.signal(signal.SIGUSR1, dump)
'''
LIMITS = [f"--max-{name}-bytes" for name in ("frame", "envelope", "media")]


async def steps_since_last(gateway: subprocess.Popen[bytes], out: Path) -> list[object]:
    os.kill(gateway.pid, signal.SIGUSR1)
    await trio.sleep(0.3)
    listed: list[object] = json.loads(await trio.Path(out).read_text())
    return listed


async def measure(sink: subprocess.Popen[bytes], sink_port: int,
                  gateway: subprocess.Popen[bytes], ports: tuple[int, int, int, int],
                  steps_out: Path, trust: ssl.SSLContext, ca_file: Path) -> None:
    tcp, ws, quic, admin = ports
    try:
        await until_http_ready(f"http://127.0.0.1:{sink_port}/health", sink, "sink")
        await until_http_ready(f"http://127.0.0.1:{admin}/readyz", gateway, "gateway")
        request = load.MediaRequest("ws-submit", load.image(63))
        for uri in (f"tcp://127.0.0.1:{tcp}", f"ws://127.0.0.1:{ws}/nnrp",
                    f"quic://127.0.0.1:{quic}") * 2:
            async with connect(uri, ssl_context=trust,
                               quic=QuicClientOptions(ca_file=ca_file)) as client:
                session = await client.open_session()
                await steps_since_last(gateway, steps_out)
                began, cpu = time.perf_counter(), process_cpu_seconds(gateway.pid)
                operation = await session.submit_frame(request.meta(1), request.typed_body,
                                                       frame_id=1)
                async for _event in operation.events():
                    pass
                took = time.perf_counter() - began
                cpu = process_cpu_seconds(gateway.pid) - cpu
                await trio.sleep(0.5)
                steps = await steps_since_last(gateway, steps_out)
                print(f"{uri.split(':')[0]:4} submit -> result {took * 1000:5.0f} ms, gateway "
                      f"CPU {cpu * 1000:5.0f} ms; the "
                      f"gateway's longest task steps (ms, task): {steps}", flush=True)
    finally:
        for process in (gateway, sink):
            process.terminate()
            process.wait()


def main(folder: Path) -> None:
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    steps_out = folder / "steps.json"
    sink_port, tcp, ws, quic, admin = (free_port() for _ in range(5))
    pki = make_pki(folder / "pki")
    trust = ssl.create_default_context(cafile=str(pki.cert))
    sink = subprocess.Popen([sys.executable, "-m", load.__name__, "sink", str(sink_port)])
    exe = str(Path(sys.executable).parent / "nnrp-gateway")
    gateway = subprocess.Popen(
        [exe, "serve", "--listen", f"tcp://127.0.0.1:{tcp}",
         "--listen", f"ws://127.0.0.1:{ws}/nnrp", "--listen", f"quic://127.0.0.1:{quic}",
         "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
         "--vllm-url", f"http://127.0.0.1:{sink_port}",
         "--admin-listen", f"127.0.0.1:{admin}", "--log-level", "warning",
         *(arg for limit in LIMITS for arg in (limit, str(64 << 20)))],
        env={**os.environ, "PYTHONPATH": str(folder), "STEPS_OUT": str(steps_out)})
    trio.run(measure, sink, sink_port, gateway, (tcp, ws, quic, admin), steps_out, trust,
             pki.cert)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        main(Path(folder))
