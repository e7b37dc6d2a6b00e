"""Resumable sessions against a hostile or careless client (issue 34, findings 1, 7 and
12): a resume that names both workers of a pod, a token taken to another certificate or
out of TLS, and a revoked auth token still holding a session. Each test names the finding
it covers, what was wrong before and what holds now."""

from __future__ import annotations

import contextlib
import datetime
import os
import secrets
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway import nnrp
from gateway.tools.client import ClientError, ResumeTicket, connect
from gateway.transport import TlsConfig
from tests.support.processes import ReplayThread, free_port, served_endpoints, stop_gateway
from tests.support.stack import Stack, chat, envelope, run_operation, start_stack
from tests.support.tls import make_pki
from tests.support.waits import until, wait_for
from tests.support.workers import EXE, held_by, served_workers

if TYPE_CHECKING:
    from gateway.server import SessionRegistry

RESUME_REJECTED = f"code {int(nnrp.SessionError.RESUME_REJECTED):#x}"
AUTH_FAILED = f"code {int(nnrp.SessionError.AUTH_FAILED):#x}"


# ---------------------------------------------------------------- finding 1: relay loop


def _server_inode(port: int, client_port: int) -> str | None:
    """The inode of the server side of the established TCP connection from
    ``client_port`` to ``port`` on loopback (None until it is accepted)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                local, remote = fields[1], fields[2]
                if (int(local.rsplit(":", 1)[1], 16) == port
                        and int(remote.rsplit(":", 1)[1], 16) == client_port
                        and fields[3] == "01" and fields[9] != "0"):
                    return fields[9]
    return None


async def _raw_connection_to(host: str, port: int, pid: int, pids: list[int]
                             ) -> tuple[trio.SocketStream, nnrp.ClientConnection]:
    """A raw TCP connection whose hello worker ``pid`` answered (the kernel picks the
    worker: connections are opened until one lands there, as ``connect_to`` does)."""
    for _ in range(64):  # each try is a coin toss between two workers
        stream = await trio.open_tcp_stream(host, port)
        sans_io = nnrp.ClientConnection()
        await stream.send_all(sans_io.hello())
        acked = False
        while not acked:
            data = await stream.receive_some(65536)
            assert data, "closed before SERVER_HELLO_ACK"
            acked = any(isinstance(e, nnrp.HelloAcked) for e in sans_io.receive_data(data))
        inode = _server_inode(port, stream.socket.getsockname()[1])
        assert inode is not None  # answered, so accepted
        holders = [worker for worker in pids if held_by(worker, {inode})]
        if holders == [pid]:
            return stream, sans_io
        await stream.aclose()
    raise AssertionError(f"no connection to port {port} reached worker {pid}")


async def _resume_both_workers_then_close(host: str, port: int, pid: int, pids: list[int]
                                          ) -> list[nnrp.SessionOpenAnswered]:
    """CLIENT_HELLO, then two resumes of session 1 (allow_resume, 24-byte made-up tokens,
    the first naming worker 0, the second worker 1) sent together, their answers, then
    the close."""
    with trio.fail_after(20):
        stream, sans_io = await _raw_connection_to(host, port, pid, pids)
    async with stream:
        tokens = [bytes([worker]) + secrets.token_bytes(23) for worker in (0, 1)]
        await stream.send_all(b"".join(sans_io.resume_session(1, token) for token in tokens))
        answers: list[nnrp.SessionOpenAnswered] = []
        with trio.fail_after(5):
            while len(answers) < 2:
                data = await stream.receive_some(65536)
                assert data, f"closed after {len(answers)} answers"
                answers += [e for e in sans_io.receive_data(data)
                            if isinstance(e, nnrp.SessionOpenAnswered)]
    return answers


def _cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_resume_naming_both_workers_is_relayed_at_most_once(tmp_path: Path) -> None:
    """Finding 1 of issue 34 (relay loop). One raw connection resumes a made-up session
    with a token naming worker 0, then another naming worker 1, and closes. Before, the
    worker that got the connection relayed it to worker 0, which relayed it back on the
    second token, and so on: the two workers bounced it between them forever (1,200 hops
    a second). Now a connection is relayed at most once (gateway/nnrp/_server_lifecycle.py
    rule 4d; gateway/server/_relay.py rule 1): each resume gets its answer, and within a
    second of the close no connection is left open, the relay count stays put and the
    workers are idle (their CPU over the next second). Run once on each worker: on
    worker 1 the first token is relayed (once); on worker 0 it is its own, and the
    second, no longer the first session message, is not relayed at all."""
    with ReplayThread() as replay, served_workers(tmp_path, replay.url,
                                                  "tcp://127.0.0.1:0") as served:
        endpoint = served.uris["tcp"].split("://")[1]
        host, port = endpoint.rsplit(":", 1)
        relayed = "nnrp_gateway_resume_relayed_total"
        active = "nnrp_gateway_connections_active"

        for pid in reversed(served.pids):  # worker 1 (relays once), then worker 0
            answers = trio.run(_resume_both_workers_then_close, host, int(port), pid,
                               served.pids)
            # The first names a session no worker holds: rejected (where it was relayed,
            # or here). The second names the other worker, and is not the connection's
            # first session message: not relayed, not "gone" either (it may live there):
            # retry_later, to resume it first thing on a connection of its own.
            assert [(a.opened, a.ack.status, a.ack.session_error_code) for a in answers] == [
                (False, nnrp.SessionOpenStatus.REJECTED, nnrp.SessionError.RESUME_REJECTED),
                (False, nnrp.SessionOpenStatus.RETRY_LATER,
                 nnrp.SessionError.RESUME_REJECTED)]
            # Soon after the close, nothing of it is left in either worker (a leak never
            # gets there; a 1 s bound was a busy host's to miss).
            wait_for(lambda: served.metrics()[active] == 0, timeout=10.0,
                     what="no connection open")
            assert served.metrics()[relayed] == 1

        before = {pid: _cpu_seconds(pid) for pid in served.pids}
        time.sleep(1.0)  # the window over which "idle" is measured
        spent = {pid: _cpu_seconds(pid) - before[pid] for pid in served.pids}
        assert all(seconds < 0.2 for seconds in spent.values()), spent
        metrics = served.metrics()
        assert (metrics[relayed], metrics[active]) == (1, 0)  # it stopped growing
        hops = [r for r in served.records()
                if r.get("event") == "resume relayed to the worker holding the session"]
        assert len(hops) == 1


# ---------------------------------------------------------------- finding 7: TLS binding


def _two_client_pki(folder: Path) -> dict[str, Path]:
    """The throwaway PKI (tests.support.tls: its CA, a server certificate, client
    certificate A), and client certificate B from a second CA, with a client-CA file
    trusting both: B is as valid a client as A, only another one."""
    pki = make_pki(folder)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, public_key: Any, *, ca: bool) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "second-ca")])
        return (x509.CertificateBuilder().subject_name(name).issuer_name(issuer)
                .public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
                .sign(ca_key, hashes.SHA256()))

    second_ca = certificate("second-ca", ca_key.public_key(), ca=True)
    pem = serialization.Encoding.PEM
    pki["b"] = folder / "client-b.pem"
    pki["b"].write_bytes(certificate("client-b", key.public_key(), ca=False).public_bytes(pem))
    pki["b_key"] = folder / "client-b.key"
    pki["b_key"].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    pki["client_ca"] = folder / "client-ca.pem"
    pki["client_ca"].write_bytes(pki["ca"].read_bytes() + second_ca.public_bytes(pem))
    pki["a"], pki["a_key"] = pki["client"], pki["client_key"]
    return pki


def _as_client(pki: dict[str, Path], who: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    context.load_cert_chain(str(pki[who]), str(pki[f"{who}_key"]))
    return context


def _scheme_uri(stack: Stack, scheme: str) -> str:
    return next(e.uri for e in stack.gateway.endpoints if e.uri.startswith(f"{scheme}://"))


def _registry(stack: Stack) -> SessionRegistry:
    registry = stack.gateway.server.registry
    assert registry is not None
    return registry


async def _dropped_session(stack: Stack, uri: str, **connect_options: Any) -> ResumeTicket:
    """A resumable session opened on ``uri``, its connection dropped without
    SESSION_CLOSE: detached, waiting for its client."""
    registry = _registry(stack)
    detached = registry.detached
    async with connect(uri, **connect_options) as client:
        session = await client.open_session(resume=True)
        assert session.ticket is not None
        ticket = session.ticket
    await until(lambda: registry.detached == detached + 1)
    return ticket


async def _refusal(uri: str, ticket: ResumeTicket, **connect_options: Any) -> ClientError:
    async with connect(uri, **connect_options) as client:
        with pytest.raises(ClientError) as refused:
            await client.resume_session(ticket)
    return refused.value


async def test_a_token_opens_nothing_for_another_certificate_or_in_clear(
        nursery: trio.Nursery, socket_dir: Path, tmp_path: Path) -> None:
    """Finding 7 of issue 34 (TLS binding). Before, a token was a bearer secret alone: a
    session opened over mutual TLS with certificate A was resumed by whoever held the
    token, with certificate B, or over the plain tcp:// listener of the same gateway
    (the session's traffic then went in clear). Now a token is bound to how its session
    was secured (gateway/nnrp/_resumption.py R3): with another certificate, and in
    clear, the resume is rejected (resume_rejected, the same answer as for a token that
    opens nothing, and not retry_later); with certificate A it resumes and streams."""
    pki = _two_client_pki(tmp_path)
    stack = await start_stack(nursery, socket_dir, extra_listen=("tcps://127.0.0.1:0",),
                              tls=TlsConfig(pki["server"], pki["server_key"],
                                            pki["client_ca"]))
    tls, plain = _scheme_uri(stack, "tcps"), _scheme_uri(stack, "tcp")
    with trio.fail_after(20):
        ticket = await _dropped_session(stack, tls, ssl_context=_as_client(pki, "a"))
        unknown = await _refusal(tls, ResumeTicket(ticket.session_id, secrets.token_bytes(24),
                                                   ticket.window_ms),
                                 ssl_context=_as_client(pki, "a"))
        other_certificate = await _refusal(tls, ticket, ssl_context=_as_client(pki, "b"))
        in_clear = await _refusal(plain, ticket)
        for refused in (other_certificate, in_clear):
            assert not refused.retry_later
            assert RESUME_REJECTED in str(refused)
            assert str(refused) == str(unknown)  # nothing says a session exists
        assert _registry(stack).detached == 1  # the refusals spent nothing (R5)
        async with connect(tls, ssl_context=_as_client(pki, "a")) as client:
            session = await client.resume_session(ticket)
            assert session.ticket is not None and session.ticket.token != ticket.token
            outcome = await run_operation(session, envelope(chat(max_tokens=2)))
            assert outcome.status == 200
            await session.close()
    assert _registry(stack).stats.resumed_total == 1


async def test_a_session_opened_over_tls_never_goes_on_in_clear_but_one_in_clear_may(
        nursery: trio.Nursery, socket_dir: Path, tmp_path: Path) -> None:
    """Finding 7 of issue 34, without client certificates, so that only the carrier's
    encryption tells the two apart (gateway/nnrp/_resumption.py R3, ``Binding.admits``).
    Before, a session opened over tcps:// was resumed over the same gateway's plain
    tcp:// listener by whoever held the token, its traffic then in clear. Now that
    resume is rejected (resume_rejected, not retry_later) and the session still resumes
    over tcps://; the other way, clear to TLS, is allowed: a session opened over tcp://
    resumes over tcps://, and its client streams there."""
    pki = make_pki(tmp_path)
    stack = await start_stack(nursery, socket_dir, extra_listen=("tcps://127.0.0.1:0",),
                              tls=TlsConfig(pki["server"], pki["server_key"]))
    tls, plain = _scheme_uri(stack, "tcps"), _scheme_uri(stack, "tcp")
    trust = ssl.create_default_context(cafile=str(pki["ca"]))
    with trio.fail_after(20):
        opened_over_tls = await _dropped_session(stack, tls, ssl_context=trust)
        in_clear = await _refusal(plain, opened_over_tls)
        assert not in_clear.retry_later and RESUME_REJECTED in str(in_clear)
        opened_in_clear = await _dropped_session(stack, plain)
        for ticket in (opened_over_tls, opened_in_clear):
            async with connect(tls, ssl_context=trust) as client:
                session = await client.resume_session(ticket)
                outcome = await run_operation(session, envelope(chat(max_tokens=2)))
                assert outcome.status == 200
                await session.close()
    assert _registry(stack).stats.resumed_total == 2


# ---------------------------------------------------------------- finding 12: SIGHUP


RELOADED = "auth tokens reloaded"
RELOAD_FAILED = "auth token reload failed; keeping the previous tokens"


class _Process:
    """One ``nnrp-gateway serve`` process (no --workers), its JSON-lines log."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process = process
        self.log = log

    def lines(self, event: str) -> int:
        return self.log.read_text().count(f'"event": "{event}"')

    async def reload(self) -> str:
        """SIGHUP; the log line that says what the reload of the token file did."""
        outcomes = (RELOADED, RELOAD_FAILED)
        seen = {outcome: self.lines(outcome) for outcome in outcomes}
        self.process.send_signal(signal.SIGHUP)
        await until(lambda: any(self.lines(o) > seen[o] for o in outcomes))
        (outcome,) = [o for o in outcomes if self.lines(o) > seen[o]]
        return outcome


@contextlib.contextmanager
def _serving(tmp_path: Path, *args: str) -> Iterator[_Process]:
    log = tmp_path / "gateway.log"
    with log.open("wb") as sink:
        # vLLM is never asked: sessions open whether or not it answers.
        process = subprocess.Popen(
            [EXE, "serve", "--listen", "tcp://127.0.0.1:0", "--vllm-url",
             f"http://127.0.0.1:{free_port()}", "--drain-timeout", "1", *args],
            stdout=sink, stderr=subprocess.STDOUT)
    try:
        yield _Process(process, log)
    finally:
        if process.poll() is None:
            stop_gateway(process)


async def test_sighup_rereads_the_token_file_and_a_revoked_token_resumes_nothing(
        tmp_path: Path) -> None:
    """Finding 12 of issue 34 (SIGHUP and --auth-token-file). Before, SIGHUP re-read only
    the TLS files: the token file was read once, at start-up, so a revoked token went on
    opening sessions, and resuming the ones opened with it, until a restart (which also
    dropped every session). Now SIGHUP re-reads the file (gateway/server/_auth.py,
    ``Gateway.reload``), in a real process sent a real signal: a token no longer there
    opens no new session and resumes none (auth_failed: a resume is authenticated like
    an open), the new one opens sessions but takes no session of the old one's
    (resume_rejected: R3's binding). A file holding no token, or gone, keeps the tokens
    there were (an error logged): a reload never turns authentication off."""
    first, second = "first-token-" + secrets.token_hex(8), "second-token-" + secrets.token_hex(8)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# the team's tokens\n{first}\n")
    with _serving(tmp_path, "--auth-token-file", str(tokens)) as gateway, \
            trio.fail_after(30):
        await until(lambda: served_endpoints(gateway.log.read_text())
                    or gateway.process.poll() is not None)
        assert gateway.process.poll() is None, gateway.log.read_text()
        (uri,) = served_endpoints(gateway.log.read_text())

        async with connect(uri) as client:
            session = await client.open_session(resume=True, auth=first.encode())
            assert session.ticket is not None
            ticket = session.ticket
        await until(lambda: gateway.lines("session detached; it waits for its client to "
                                          "resume"))

        tokens.write_text(f"{second}\n")
        assert await gateway.reload() == RELOADED
        async with connect(uri) as client:
            with pytest.raises(ClientError, match=AUTH_FAILED):
                await client.open_session(auth=first.encode())
            assert (await client.open_session(auth=second.encode())).session_id
        async with connect(uri) as client:
            with pytest.raises(ClientError, match=AUTH_FAILED) as revoked:
                await client.resume_session(ticket, auth=first.encode())
            assert not revoked.value.retry_later
            # Another identity's token, valid as it is, opens nothing of this session.
            with pytest.raises(ClientError, match=RESUME_REJECTED):
                await client.resume_session(ticket, auth=second.encode())

        for emptied in ("# every token revoked\n\n", None):
            if emptied is None:
                tokens.unlink()
            else:
                tokens.write_text(emptied)
            assert await gateway.reload() == RELOAD_FAILED
            async with connect(uri) as client:
                for refused in (b"", first.encode()):
                    with pytest.raises(ClientError, match=AUTH_FAILED):
                        await client.open_session(auth=refused)
                assert (await client.open_session(auth=second.encode())).session_id
        assert gateway.process.poll() is None
    assert gateway.process.returncode == 0  # drained and exited on SIGTERM
    text = gateway.log.read_text()
    assert first not in text and second not in text  # never logged
