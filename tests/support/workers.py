"""``serve --workers N`` as a real process, and which worker holds a connection (read
from /proc): what the workers' tests and the resume tests share."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx

from tests.support.processes import free_port, served_endpoints, stop_gateway
from tests.support.waits import wait_for

EXE = str(Path(sys.executable).parent / "nnrp-gateway")

@attrs.define
class Served:
    process: subprocess.Popen[bytes]
    log: Path
    uris: dict[str, str]  # scheme -> URI, as announced
    admin: str
    pids: list[int]

    def records(self) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def operations(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("event") == "operation"]

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.admin}/metrics").text
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    def worker_pids(self) -> list[int]:
        """The running workers' pids, by worker index (the latest start of each)."""
        started = {}
        for record in self.records():
            if record.get("event") == "worker serving":
                started[record["worker"]] = record["pid"]
        return [started[i] for i in sorted(started)]


@contextmanager
def served_workers(tmp_path: Path, vllm_url: str, *listen: str, workers: int = 2,
                   extra: tuple[str, ...] = ()) -> Iterator[Served]:
    admin_port = free_port()
    log = tmp_path / "gateway.log"
    args = [EXE, "serve", "--workers", str(workers), "--vllm-url", vllm_url,
            "--admin-listen", f"127.0.0.1:{admin_port}", "--metrics", "--drain-timeout",
            "10", *extra]
    for uri in listen:
        args += ["--listen", uri]
    with log.open("wb") as sink:
        process = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT)
    try:
        def announced() -> list[str]:
            return served_endpoints(log.read_text())
        wait_for(lambda: len(announced()) == len(listen) or process.poll() is not None,
                 what="the announcement")
        assert process.poll() is None, log.read_text()
        admin = f"http://127.0.0.1:{admin_port}"
        wait_for(lambda: httpx.get(f"{admin}/readyz").status_code == 200, what="ready")
        uris = {uri.split("://")[0]: uri for uri in announced()}
        served = Served(process, log, uris, admin, [])
        served.pids = served.worker_pids()
        yield served
    finally:
        if process.poll() is None:
            stop_gateway(process)


def server_sockets(port: int) -> set[str]:
    """Inodes of established TCP sockets whose local port is ``port`` (server sides)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    inodes.add(fields[9])
    return inodes


def held_by(pid: int, inodes: set[str]) -> set[str]:
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:[") and link[8:-1] in inodes:
                held.add(link[8:-1])
    return held
