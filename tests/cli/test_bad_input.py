"""Every command, every mistake (issue 22): a table of bad inputs, one per option that
takes a path, URL, address or choice, and the unreachable peers. Each must end in exactly
one line ``error: ...`` on stderr naming what is wrong and where, no traceback, and the
exit status of cli/_app.py's rules: 2 for usage and configuration, 1 for a failed run.

The commands run in this process (CliRunner) against real sockets: a port held busy, a
closed port, and one real gateway (``serve`` as a process, tcp, ws and tcps listeners,
in front of the replay vLLM) for the mistakes that need a server to be made against.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from cli.main import app
from tests.support.processes import ReplayThread, free_port, served_endpoints
from tests.support.quic import make_pki
from tests.support.waits import wait_for

runner = CliRunner()


@attrs.frozen
class World:
    """What the bad inputs are made of."""

    tmp: Path
    busy: int  # a loopback port something listens on
    closed: int  # a loopback port nothing listens on
    cert: Path
    key: Path
    other_key: Path  # a key that does not match ``cert``
    other_cert: Path  # a certificate the gateway's is not signed by
    gateway_tcp: str
    gateway_ws: str
    gateway_tcps: str
    gateway_tcp_port: int


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("bad-input")
    server, other = make_pki(tmp / "pki"), make_pki(tmp / "other", "other")
    (tmp / "not.pem").write_text("not a certificate\n")
    (tmp / "bad.toml").write_text("this is = = not toml\n")
    (tmp / "typo.toml").write_text('vllm_urll = "http://127.0.0.1:8000"\n')
    (tmp / "not.json").write_text("{")
    (tmp / "a-file").write_text("")
    (tmp / "comments").write_text("# the tokens\n\n#   none yet\n")
    (tmp / "fleet.key").write_text("k" * 64 + "\n")
    (tmp / "short.key").write_text("abc\n")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    log = tmp / "gateway.log"
    with ReplayThread(speed=50.0) as replay, log.open("wb") as sink:
        exe = str(Path(sys.executable).parent / "nnrp-gateway")
        gateway = subprocess.Popen(
            [exe, "serve", "--vllm-url", replay.url, "--listen", "tcp://127.0.0.1:0",
             "--listen", "ws://127.0.0.1:0/nnrp", "--listen", "tcps://127.0.0.1:0",
             "--tls-cert", str(server.cert), "--tls-key", str(server.key)],
            stdout=sink, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: len(served_endpoints(log.read_text())) == 3
                     or gateway.poll() is not None, what="the gateway")
            assert gateway.poll() is None, log.read_text()
            uris = {uri.split(":")[0]: uri for uri in served_endpoints(log.read_text())}
            yield World(tmp, busy.getsockname()[1], free_port(), server.cert, server.key,
                        other.key, other.cert, uris["tcp"], uris["ws"], uris["tcps"],
                        int(uris["tcp"].rsplit(":", 1)[1]))
        finally:
            gateway.kill()
            gateway.wait()
            busy.close()


#: The host-route target's arguments as the runner gives them; a case overrides one
#: (click takes an option's last value).
HOST_ROUTE_TARGET = ["conformance", "host-route-target", "--scenario", "{tmp}/not.json",
                     "--resolved-scenario", "{tmp}/not.json", "--output", "{tmp}/o.json",
                     "--ready-output", "{tmp}/r.json", "--artifacts", "{tmp}"]

#: (id, argv with placeholders for ``World``, exit status, what stderr must say).
CASES: list[tuple[str, list[str], int, str]] = [
    # the top command
    ("unknown-command", ["sreve"], 2, "no such command 'sreve'. Did you mean 'serve'?"),
    ("unknown-option", ["serve", "--lisen", "x"], 2, "no such option: --lisen"),
    # serve: every path, URL, address and choice, checked before anything binds
    ("serve-listen-scheme", ["serve", "--listen", "http://127.0.0.1:1", "--print-config"], 2,
     "scheme must be tcp://"),
    ("serve-listen-bare", ["serve", "--listen", "127.0.0.1:7700", "--print-config"], 2,
     "scheme must be"),
    ("serve-listen-busy", ["serve", "--listen", "tcp://127.0.0.1:{busy}", "--vllm-url",
                           "http://127.0.0.1:{closed}"], 2,
     "cannot listen on tcp://127.0.0.1:{busy}: address already in use"),
    ("serve-listen-busy-workers", ["serve", "--workers", "2", "--listen",
                                   "tcp://127.0.0.1:{busy}"], 2,
     "cannot listen on tcp://127.0.0.1:{busy}: address already in use"),
    ("serve-tls-listener-no-cert", ["serve", "--listen", "tcps://127.0.0.1:0",
                                    "--print-config"], 2, "needs a certificate"),
    ("serve-admin-listen-shape", ["serve", "--admin-listen", "localhost", "--print-config"], 2,
     "expected host:port or unix:PATH (no scheme), got 'localhost', --admin-listen"),
    ("serve-admin-listen-scheme", ["serve", "--admin-listen", "http://0.0.0.0:9090",
                                   "--print-config"], 2,
     "(no scheme), got 'http://0.0.0.0:9090', --admin-listen"),
    ("serve-admin-listen-busy", ["serve", "--listen", "tcp://127.0.0.1:0", "--admin-listen",
                                 "127.0.0.1:{busy}", "--vllm-url", "http://127.0.0.1:{closed}"],
     2, "cannot listen on admin listener 127.0.0.1:{busy}: address already in use"),
    ("serve-vllm-url-no-scheme", ["serve", "--vllm-url", "localhost:8000", "--print-config"],
     2, "expected an http:// or https:// URL with a host, got 'localhost:8000', --vllm-url"),
    ("serve-vllm-url-ftp", ["serve", "--vllm-url", "ftp://host", "--print-config"], 2,
     "got 'ftp://host', --vllm-url"),
    ("serve-vllm-url-port", ["serve", "--vllm-url", "http://host:99999", "--print-config"], 2,
     "not a URL"),
    ("serve-log-level", ["serve", "--log-level", "verbose", "--print-config"], 2,
     "invalid value ('verbose' is not one of 'debug', 'info', 'warning', 'error'), "
     "--log-level"),
    ("serve-quic-alpn", ["serve", "--quic-alpn", "h3", "--print-config"], 2, "--quic-alpn"),
    ("serve-tls-cert-missing", ["serve", "--tls-cert", "{tmp}/none.pem", "--tls-key", "{key}",
                                "--print-config"], 2,
     "certificate {tmp}/none.pem: no such file or directory"),
    ("serve-tls-cert-not-pem", ["serve", "--tls-cert", "{tmp}/not.pem", "--tls-key", "{key}",
                                "--print-config"], 2,
     "certificate {tmp}/not.pem: not PEM"),
    ("serve-tls-key-mismatch", ["serve", "--tls-cert", "{cert}", "--tls-key", "{other_key}",
                                "--print-config"], 2,
     "the private key does not match the certificate"),
    ("serve-tls-key-not-pem", ["serve", "--tls-cert", "{cert}", "--tls-key", "{tmp}/not.pem",
                               "--print-config"], 2,
     "private key {tmp}/not.pem: not PEM (no PRIVATE KEY block), --tls-key"),
    ("serve-tls-key-alone", ["serve", "--tls-key", "{key}", "--print-config"], 2,
     "--tls-cert and --tls-key go together, --tls-key"),
    ("serve-tls-client-ca", ["serve", "--tls-cert", "{cert}", "--tls-key", "{key}",
                             "--tls-client-ca", "{tmp}/not.pem", "--print-config"], 2,
     "client CA {tmp}/not.pem: not PEM (no BEGIN CERTIFICATE block), --tls-client-ca"),
    ("serve-quic-mutual-tls", ["serve", "--listen", "quic://127.0.0.1:0", "--tls-cert",
                               "{cert}", "--tls-key", "{key}", "--tls-client-ca", "{cert}",
                               "--print-config"], 2,
     "quic:// does not do mutual TLS (drop --tls-client-ca or the quic:// listener), "
     "--tls-client-ca"),
    # Issue 37: TLS files no listener uses, a close grace longer than the drain.
    ("serve-tls-cert-no-tls-listener", ["serve", "--tls-cert", "{cert}", "--tls-key", "{key}",
                                        "--print-config"], 2,
     "no listener uses the certificate: NNRP would be served without TLS (make a listener "
     "tcps://, wss:// or quic://, or drop the certificate), --tls-cert"),
    ("serve-tls-client-ca-no-tls-listener", ["serve", "--tls-cert", "{cert}", "--tls-key",
                                             "{key}", "--tls-client-ca", "{cert}",
                                             "--print-config"], 2,
     "no listener uses the certificate"),
    ("serve-tls-client-ca-alone", ["serve", "--tls-client-ca", "{cert}", "--print-config"],
     2, "a client CA goes with --tls-cert, --tls-key and a tcps:// or wss:// listener, "
        "--tls-client-ca"),
    ("serve-drain-close-grace", ["serve", "--drain-timeout", "5", "--drain-close-grace", "10",
                                 "--print-config"], 2,
     "a close grace of 10 s does not fit in the drain's 5 s (--drain-timeout), which it is "
     "the end of, --drain-close-grace"),
    ("serve-listen-empty", ["serve", "--listen", "", "--print-config"], 2,
     "an empty listener URL, --listen"),
    ("serve-auth-token-file", ["serve", "--auth-token-file", "{tmp}/none", "--print-config"],
     2, "cannot read the token file (No such file or directory), --auth-token-file"),
    ("serve-media-dir-missing", ["serve", "--media-dir", "{tmp}/none", "--print-config"], 2,
     "{tmp}/none: not a directory, --media-dir"),
    ("serve-media-dir-not-writable", ["serve", "--media-dir", "/proc/sys", "--print-config"],
     2, "/proc/sys: not writable"),
    ("serve-fleet-no-key", ["serve", "--fleet-advertise", "127.0.0.1:7702", "--print-config"],
     2, "--fleet-advertise needs --fleet-key-file"),
    ("serve-fleet-no-advertise", ["serve", "--fleet-key-file", "{key}", "--print-config"], 2,
     "give --fleet-advertise too, --fleet-key-file"),
    ("serve-fleet-address", ["serve", "--fleet-advertise", "pod:notaport", "--fleet-key-file",
                             "{key}", "--print-config"], 2,
     "--fleet-advertise is HOST:PORT"),
    ("serve-fleet-no-port", ["serve", "--fleet-advertise", "::1", "--fleet-key-file",
                             "{key}", "--print-config"], 2, "--fleet-advertise is HOST:PORT"),
    ("serve-fleet-port-0", ["serve", "--fleet-advertise", "127.0.0.1:0", "--fleet-key-file",
                            "{key}", "--print-config"], 2, "needs a fixed port"),
    ("serve-fleet-wildcard", ["serve", "--fleet-advertise", "0.0.0.0:7702",
                              "--fleet-key-file", "{key}", "--print-config"], 2,
     "not a wildcard, --fleet-advertise"),
    ("serve-fleet-key-short", ["serve", "--fleet-advertise", "127.0.0.1:7702",
                               "--fleet-key-file", "{tmp}/short.key", "--print-config"], 2,
     "a fleet key needs at least 32 bytes, got 3"),
    ("serve-fleet-key-none", ["serve", "--fleet-advertise", "127.0.0.1:7702",
                              "--fleet-key-file", "{tmp}/a-file", "--print-config"], 2,
     "no key (one per line; # starts a comment)"),
    ("serve-fleet-key-missing", ["serve", "--fleet-advertise", "127.0.0.1:7702",
                                 "--fleet-key-file", "{tmp}/none", "--print-config"], 2,
     "fleet key: {tmp}/none: No such file or directory, --fleet-key-file"),
    ("serve-fleet-resume-off", ["serve", "--fleet-advertise", "127.0.0.1:7702",
                                "--fleet-key-file", "{tmp}/fleet.key", "--resume-window", "0",
                                "--print-config"], 2, "--resume-window must be above 0"),
    ("serve-listen-ipv6-unclosed", ["serve", "--listen", "tcp://[::1", "--print-config"], 2,
     "tcp://[::1: Invalid IPv6 URL, --listen"),
    ("chat-endpoint-ipv6-unclosed", ["chat", "hi", "--endpoint", "tcp://[::1"], 2,
     "tcp://[::1: Invalid IPv6 URL, --endpoint"),
    ("health-admin-url-port", ["health", "--admin-url", "http://127.0.0.1:notaport"], 2,
     "not a URL"),
    ("serve-auth-token-empty", ["serve", "--auth-token", "", "--print-config"], 2,
     "an empty auth token would turn authentication off, --auth-token"),
    ("serve-auth-token-file-empty", ["serve", "--auth-token-file", "{tmp}/a-file",
                                     "--print-config"], 2,
     "{tmp}/a-file holds no token (empty, or comments only): authentication would be off, "
     "--auth-token-file"),
    ("serve-auth-token-file-comments", ["serve", "--auth-token-file", "{tmp}/comments",
                                        "--print-config"], 2, "holds no token"),
    ("serve-config-missing", ["serve", "--config", "{tmp}/none.toml", "--print-config"], 2,
     "cannot read the configuration file (No such file or directory), {tmp}/none.toml"),
    ("serve-config-not-toml", ["serve", "--config", "{tmp}/bad.toml", "--print-config"], 2,
     "not valid TOML"),
    ("serve-config-typo", ["serve", "--config", "{tmp}/typo.toml", "--print-config"], 2,
     "unknown key 'vllm_urll' (did you mean vllm_url?), {tmp}/typo.toml"),
    ("serve-target-manifest", ["serve", "--target-manifest", "{tmp}/a-file/m.json",
                               "--print-config"], 2,
     "cannot create the output directory"),
    ("serve-target-manifest-dir", ["serve", "--target-manifest", "{tmp}", "--print-config"], 2,
     "{tmp} is a directory (give a file name), --target-manifest"),
    ("serve-tls-server-name", ["serve", "--tls-server-name", "0.0.0.0", "--print-config"], 2,
     "'0.0.0.0' is a wildcard address, not a name a certificate holds, --tls-server-name"),
    ("serve-workers", ["serve", "--workers", "0", "--print-config"], 2, "--workers"),
    ("serve-load-source", ["serve", "--load-source", "prometheus", "--print-config"], 2,
     "invalid value ('prometheus' is not one of 'metrics', 'load'), --load-source"),
    ("serve-load-kv", ["serve", "--load-max-kv-cache-usage", "90", "--print-config"], 2,
     "--load-max-kv-cache-usage"),
    # health, check, capabilities
    ("health-url", ["health", "--admin-url", "ftp://x"], 2,
     "expected an http:// or https:// URL with a host, got 'ftp://x', --admin-url"),
    ("health-unreachable", ["health", "--admin-url", "http://127.0.0.1:{closed}"], 1,
     "unhealthy: no answer"),
    ("check-url", ["check", "--vllm-url", "garbage"], 2, "got 'garbage', --vllm-url"),
    ("check-unreachable", ["check", "--vllm-url", "http://127.0.0.1:{closed}"], 1,
     "not ready to serve (vLLM unreachable or failing"),
    ("capabilities-url", ["capabilities", "--vllm-url", "127.0.0.1:8000"], 2, "--vllm-url"),
    ("capabilities-unreachable", ["capabilities", "--vllm-url", "http://127.0.0.1:{closed}"],
     1, "vLLM probe failed"),
    # chat
    ("chat-endpoint-http", ["chat", "hi", "--endpoint", "http://127.0.0.1:1"], 2,
     "scheme must be tcp://"),
    ("chat-endpoint-bare", ["chat", "hi", "--endpoint", "127.0.0.1:7700"], 2,
     "scheme must be"),
    ("chat-endpoint-port-0", ["chat", "hi", "--endpoint", "tcp://127.0.0.1:0"], 2,
     "a client needs the port to dial"),
    ("chat-unreachable", ["chat", "hi", "--endpoint", "tcp://127.0.0.1:{closed}"], 1,
     "cannot connect (Connection refused), tcp://127.0.0.1:{closed}"),
    ("chat-ws-path", ["chat", "hi", "--endpoint", "{gateway_ws}x"], 1,
     "the server refused the WebSocket upgrade (HTTP 404: no NNRP endpoint at this path), "
     "{gateway_ws}x"),
    ("chat-untrusted-certificate", ["chat", "hi", "--endpoint", "{gateway_tcps}"], 1,
     "the server's certificate is not trusted; give --ca-file (self-signed certificate)"),
    ("chat-wrong-ca-file", ["chat", "hi", "--endpoint", "{gateway_tcps}", "--ca-file",
                            "{other_cert}"], 1,
     "the server's certificate is not trusted by --ca-file {other_cert}"),
    ("chat-tls-to-plain", ["chat", "hi", "--endpoint", "tcps://127.0.0.1:{gateway_tcp_port}"],
     1, "the TLS handshake failed"),
    ("chat-unknown-host", ["chat", "hi", "--endpoint", "tcp://no-such-host.invalid:1"], 1,
     "cannot resolve the host"),
    ("chat-token-twice", ["chat", "hi", "--auth-token", "a", "--auth-token-file", "{key}"],
     2, "give one session token, not two, --auth-token and --auth-token-file"),
    ("chat-ca-file-missing", ["chat", "hi", "--ca-file", "{tmp}/none.pem"], 2,
     "cannot read the CA file (No such file or directory), --ca-file"),
    ("chat-ca-file-not-pem", ["chat", "hi", "--ca-file", "{tmp}/not.pem"], 2,
     "not a PEM certificate, --ca-file"),
    ("chat-auth-token-file", ["chat", "hi", "--auth-token-file", "{tmp}/none"], 2,
     "cannot read the token file"),
    ("chat-unknown-model", ["chat", "hi", "--endpoint", "{gateway_tcp}", "--model", "nope"], 1,
     "the answer failed"),
    # replay-server, record
    ("replay-listen-shape", ["replay-server", "--listen", "nope"], 2,
     "expected host:port (no scheme), got 'nope', --listen"),
    ("replay-listen-busy", ["replay-server", "--listen", "127.0.0.1:{busy}"], 2,
     "cannot listen (Address already in use), 127.0.0.1:{busy}"),
    ("replay-version", ["replay-server", "--vllm-version", "9.9"], 2,
     "unknown vLLM line '9.9'"),
    ("record-url", ["record", "--out", "{tmp}/rec", "--vllm-url", "nope"], 2, "--vllm-url"),
    ("record-unreachable", ["record", "--out", "{tmp}/rec", "--vllm-url",
                            "http://127.0.0.1:{closed}"], 1, "vLLM did not answer"),
    ("record-forced", ["record", "--out", "{tmp}/rec", "--forced", "nope"], 2,
     "invalid value ('nope' is not one of 'tools', 'reasoning'), --forced"),
    ("record-two-sets", ["record", "--out", "{tmp}/rec", "--forced", "tools",
                         "--admission"], 2, "record one set at a time"),
    ("record-out", ["record", "--out", "{tmp}/a-file/x", "--vllm-url", "http://127.0.0.1:1"],
     2, "cannot create the output directory"),
    # conformance
    ("plan-capabilities-missing", ["conformance", "plan", "--out", "{tmp}/p.json",
                                   "--capabilities", "{tmp}/none.json"], 2, "does not exist"),
    ("plan-capabilities-not-json", ["conformance", "plan", "--out", "{tmp}/p.json",
                                    "--capabilities", "{tmp}/not.json"], 2,
     "the capability document is not JSON"),
    ("plan-endpoint", ["conformance", "plan", "--out", "{tmp}/p.json", "--endpoint",
                       "http://x:1"], 2, "scheme must be"),
    ("plan-unreachable", ["conformance", "plan", "--out", "{tmp}/p.json", "--endpoint",
                          "tcp://127.0.0.1:{closed}"], 1, "cannot connect"),
    ("plan-ca-file", ["conformance", "plan", "--out", "{tmp}/p.json", "--endpoint",
                      "{gateway_tcps}", "--ca-file", "{tmp}/not.pem"], 2, "not a PEM"),
    ("plan-untrusted", ["conformance", "plan", "--out", "{tmp}/p.json", "--endpoint",
                        "{gateway_tcps}"], 1, "give --ca-file"),
    ("plan-out", ["conformance", "plan", "--out", "{tmp}/a-file/p.json", "--endpoint",
                  "{gateway_tcp}"], 2, "cannot create the output directory"),
    ("run-endpoint", ["conformance", "run", "--out", "{tmp}/run", "--endpoint",
                      "127.0.0.1:1"], 2, "scheme must be"),
    ("run-unreachable", ["conformance", "run", "--out", "{tmp}/run", "--client", "builtin",
                         "--endpoint", "tcp://127.0.0.1:{closed}"], 1, "cannot connect"),
    ("run-client", ["conformance", "run", "--out", "{tmp}/run", "--endpoint",
                    "{gateway_tcp}", "--client", "rust"], 2, "--client"),
    ("run-backend-log", ["conformance", "run", "--out", "{tmp}/run", "--endpoint",
                         "{gateway_tcp}", "--backend-log", "garbage"], 2,
     "got 'garbage', --backend-log"),
    ("run-capabilities", ["conformance", "run", "--out", "{tmp}/run", "--endpoint",
                          "{gateway_tcp}", "--capabilities", "{tmp}/not.json"], 2,
     "the capability document is not JSON"),
    ("run-ca-file", ["conformance", "run", "--out", "{tmp}/run", "--endpoint",
                     "{gateway_tcp}", "--ca-file", "{tmp}/none.pem"], 2,
     "cannot read the CA file"),
    ("run-auth-token-file", ["conformance", "run", "--out", "{tmp}/run", "--endpoint",
                             "{gateway_tcp}", "--auth-token-file", "{tmp}/none"], 2,
     "cannot read the token file"),
    ("plan-auth-token-file", ["conformance", "plan", "--out", "{tmp}/p.json", "--endpoint",
                              "{gateway_tcp}", "--auth-token-file", "{tmp}/none"], 2,
     "cannot read the token file"),
    ("plan-out-dir", ["conformance", "plan", "--out", "{tmp}", "--endpoint",
                      "{gateway_tcp}"], 2, "is a directory (give a file name), --out"),
    ("wire-probe-ca-file", ["conformance", "wire-probe", "--out", "{tmp}/w.json",
                            "--endpoint", "{gateway_tcp}", "--ca-file", "{tmp}/not.pem"], 2,
     "not a PEM certificate"),
    ("wire-probe-auth-token-file", ["conformance", "wire-probe", "--out", "{tmp}/w.json",
                                    "--endpoint", "{gateway_tcp}", "--auth-token-file",
                                    "{tmp}/none"], 2, "cannot read the token file"),
    ("validate-plan-missing", ["conformance", "validate", "--results", "{tmp}/not.json",
                               "--plan", "{tmp}/none.json"], 2, "does not exist"),
    ("run-scripted-endpoint", ["conformance", "run", "--out", "{tmp}/run", "--endpoint",
                               "{gateway_tcp}", "--scripted-endpoint", "x"], 2,
     "--scripted-endpoint"),
    ("run-native-with-token", ["conformance", "run", "--out", "{tmp}/run", "--endpoint",
                               "{gateway_tcp}", "--client", "native", "--auth-token", "t"], 2,
     "nnrp-py's native client (--client native) cannot present a session auth token "
     "(use --client builtin), --auth-token"),
    ("run-out", ["conformance", "run", "--out", "{tmp}/a-file/run", "--endpoint",
                 "{gateway_tcp}"], 2, "cannot create the output directory"),
    ("validate-results-missing", ["conformance", "validate", "--results", "{tmp}/none.json"],
     2, "does not exist"),
    ("validate-results-not-json", ["conformance", "validate", "--results", "{tmp}/not.json",
                                   "--plan", "{tmp}/not.json"], 2, "is not JSON"),
    ("wire-probe-endpoint", ["conformance", "wire-probe", "--out", "{tmp}/w.json",
                             "--endpoint", "ftp://x:1"], 2, "scheme must be"),
    ("wire-probe-out", ["conformance", "wire-probe", "--out", "{tmp}/a-file/w.json",
                        "--endpoint", "{gateway_tcp}"], 2, "cannot create the output directory"),
    ("host-route-scenario", [*HOST_ROUTE_TARGET, "--scenario", "{tmp}/none.json"], 2,
     "does not exist"),
    ("host-route-resolved", [*HOST_ROUTE_TARGET, "--resolved-scenario", "{tmp}/none.json"], 2,
     "does not exist"),
    ("host-route-not-json", HOST_ROUTE_TARGET, 2, "not a scenario"),
    ("host-route-output", [*HOST_ROUTE_TARGET, "--output", "{tmp}/a-file/o.json"], 2,
     "cannot create the output directory"),
    ("host-route-ready-output", [*HOST_ROUTE_TARGET, "--ready-output", "{tmp}"], 2,
     "{tmp} is a directory (give a file name), --ready-output"),
    ("host-route-artifacts", [*HOST_ROUTE_TARGET, "--artifacts", "{tmp}/none"], 2,
     "does not exist"),
    ("host-routes-out", ["conformance", "host-routes", "--out", "{tmp}/a-file/h"], 2,
     "cannot create the output directory"),
    ("host-routes-manifest-missing", ["conformance", "host-routes", "--out", "{tmp}/h",
                                      "--target-manifest", "{tmp}/none.json"], 2,
     "does not exist"),
    ("host-routes-manifest-not-json", ["conformance", "host-routes", "--out", "{tmp}/h",
                                       "--target-manifest", "{tmp}/not.json"], 2,
     "the target manifest is not JSON"),
    ("host-routes-target", ["conformance", "host-routes", "--out", "{tmp}/h", "--target",
                            "{tmp}/not.json"], 2, "not an executable, --target {tmp}/not.json"),
    ("host-route-vllm-url", [*HOST_ROUTE_TARGET, "--vllm-url", "nope"], 2, "--vllm-url"),
    # bench
    ("bench-run-scenario", ["bench", "run", "--scenario", "nope"], 2,
     "unknown scenario(s) nope"),
    ("bench-run-out", ["bench", "run", "--quick", "--scenario", "latency", "--out",
                       "{tmp}/a-file/b"], 2, "cannot create the output directory"),
    ("bench-codec-out", ["bench", "codec", "--quick", "--out", "{tmp}/a-file/b"], 2,
     "cannot create the output directory"),
    ("bench-wire-out", ["bench", "wire", "--quick", "--out", "{tmp}/a-file/b"], 2,
     "cannot create the output directory"),
    ("bench-soak-out", ["bench", "soak", "--out", "{tmp}/a-file/b"], 2,
     "cannot create the output directory"),
    ("bench-media-out", ["bench", "media", "--quick", "--out", "{tmp}/a-file/b"], 2,
     "cannot create the output directory"),
    ("bench-flap-out", ["bench", "flap", "--out", "{tmp}/a-file/b"], 2, "--out"),
    ("bench-flap-resets", ["bench", "flap", "--reset-min", "1", "--reset-max", "0.5"], 2,
     "--reset-max"),
    ("bench-profile-out", ["bench", "profile", "--out", "{tmp}/a-file/b"], 2,
     "cannot create the output directory"),
    ("bench-profile-load", ["bench", "profile", "--out", "{tmp}/p", "--load", "nope"], 2,
     "--load"),
    ("bench-live-url", ["bench", "live", "--vllm-url", "nope"], 2, "--vllm-url"),
    ("bench-live-streams-remote", ["bench", "live", "--vllm-url", "http://192.0.2.1:8000",
                                   "--streams", "8"], 2,
     "--streams cannot measure vLLM: vLLM must be on this machine's loopback"),
    ("bench-live-unreachable", ["bench", "live", "--vllm-url", "http://127.0.0.1:{closed}"],
     1, "vLLM did not answer"),
    ("bench-live-out", ["bench", "live", "--vllm-url", "http://127.0.0.1:{closed}", "--out",
                        "{tmp}/a-file/b"], 2, "cannot create the output directory"),
    ("bench-live-endpoint", ["bench", "live", "--vllm-url", "http://127.0.0.1:{closed}",
                             "--endpoint", "nope"], 2, "scheme must be"),
    ("bench-value-url", ["bench", "value", "--vllm-url", "nope"], 2, "--vllm-url"),
    ("bench-value-unreachable", ["bench", "value", "--vllm-url", "http://127.0.0.1:{closed}"],
     1, "vLLM did not answer"),
    ("bench-value-out", ["bench", "value", "--vllm-url", "http://127.0.0.1:{closed}", "--out",
                         "{tmp}/a-file/b"], 2, "cannot create the output directory"),
    ("bench-value-rates", ["bench", "value", "--vllm-url", "http://127.0.0.1:{closed}",
                           "--cut-rates", "1,x"], 2, "--cut-rates is a list of whole numbers"),
    ("bench-relay-listen", ["bench", "relay", "--listen", "x", "--target", "127.0.0.1:1"], 2,
     "expected host:port (no scheme), got 'x', --listen"),
    ("bench-relay-target", ["bench", "relay", "--listen", "127.0.0.1:0", "--target", "y"], 2,
     "expected host:port (no scheme), got 'y', --target"),
]


@pytest.mark.parametrize(("argv", "status", "says"), [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_a_mistake_is_one_line_and_an_exit_status(world: World, argv: list[str], status: int,
                                                  says: str) -> None:
    values = {field.name: getattr(world, field.name) for field in attrs.fields(World)}
    args = [arg.format(**values) for arg in argv]
    result = runner.invoke(app, args, env={"NNRP_GATEWAY_DEBUG": None,
                                           "NNRP_GATEWAY_ADMIN_LISTEN": None})
    assert "Traceback" not in result.output + result.stderr
    lines = result.stderr.splitlines()
    assert lines and lines[-1].startswith("error: "), result.stderr
    assert sum(line.startswith("error: ") for line in lines) == 1, result.stderr
    assert says.format(**values) in lines[-1], lines[-1]
    assert result.exit_code == status, result.stderr


def _commands(group: object, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                                          object]]:
    for name, command in getattr(group, "commands", {}).items():
        if getattr(command, "commands", None):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


#: The metavars of options that take a path, URL, address or choice (cli/_app.py's help).
TAKES_SOMETHING_TO_GET_WRONG = ("URL", "PATH", "PEM", "DIR", "JSON", "TOML", "HOST:PORT",
                                "LINE")


def _mistakable(command: object) -> set[str]:
    options = set()
    for param in getattr(command, "params", []):
        if param.param_type_name != "option" or getattr(param, "hidden", False):
            continue
        described = getattr(param, "type_descriptor", None)
        if param.metavar in TAKES_SOMETHING_TO_GET_WRONG or (
                described is not None and (described.is_choice or described.is_path)):
            options.add(param.opts[0])
    return options


def test_the_table_covers_every_option_that_can_be_given_wrong() -> None:
    commands = list(_commands(get_command(app)))
    tried: dict[tuple[str, ...], set[str]] = {}
    for _, argv, _, _ in CASES:
        words = [w for w in argv if not w.startswith("-")]
        for path, _ in commands:
            if tuple(words[:len(path)]) == path:
                tried.setdefault(path, set()).update(w for w in argv if w.startswith("--"))
    missing = {" ".join(path): sorted(_mistakable(command) - tried.get(path, set()))
               for path, command in commands}
    assert {path: options for path, options in missing.items() if options} == {}


def test_a_bare_group_prints_its_help() -> None:
    for args in ([], ["bench"], ["conformance"]):
        result = runner.invoke(app, args)
        assert (result.exit_code, result.stderr) == (0, ""), args
        assert result.stdout.startswith("Usage: ")


@pytest.mark.parametrize(("argv", "env", "says"), [
    (["check"], {"NNRP_GATEWAY_VLLM_URL": "ftp://x"},
     "got 'ftp://x', environment variable NNRP_GATEWAY_VLLM_URL"),
    (["chat", "hi"], {"NNRP_GATEWAY_ENDPOINT": "http://x:1"},
     "environment variable NNRP_GATEWAY_ENDPOINT"),
    (["health"], {"NNRP_GATEWAY_ADMIN_URL": "ftp://x"},
     "environment variable NNRP_GATEWAY_ADMIN_URL"),
    (["health"], {"NNRP_GATEWAY_ADMIN_LISTEN": "127.0.0.1"},
     "expected host:port (no scheme), got '127.0.0.1', environment variable "
     "NNRP_GATEWAY_ADMIN_LISTEN=127.0.0.1"),
    (["serve", "--print-config"], {"NNRP_GATEWAY_TLS_CERT": "/nonexistent.pem",
                                   "NNRP_GATEWAY_TLS_KEY": "/nonexistent.key"},
     "environment variable NNRP_GATEWAY_TLS_CERT"),
    # Tracing is configured by OpenTelemetry's own variables: one the gateway cannot use
    # is named, and so is where tracing was asked for.
    (["serve", "--print-config"], {"NNRP_GATEWAY_OTEL_TRACES": "1",
                                   "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
     "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json': the gateway exports traces over "
     "http/protobuf or grpc, environment variable NNRP_GATEWAY_OTEL_TRACES"),
    (["serve", "--otel-traces", "--print-config"], {"OTEL_BSP_MAX_QUEUE_SIZE": "0"},
     "OTEL_BSP_MAX_QUEUE_SIZE='0' must be at least 1, --otel-traces"),
    # Values the SDK would only warn about and replace with its default are refused.
    (["serve", "--otel-traces", "--print-config"], {"OTEL_TRACES_SAMPLER": "sometimes"},
     "OTEL_TRACES_SAMPLER='sometimes' is not a sampler OpenTelemetry's SDK knows (one of "
     "always_off, always_on,"),
    (["serve", "--otel-traces", "--print-config"],
     {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "10%"},
     "OTEL_TRACES_SAMPLER_ARG='10%': parentbased_traceidratio needs a ratio from 0 to 1, "
     "--otel-traces"),
    (["serve", "--otel-traces", "--print-config"],
     {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"},
     "OTEL_TRACES_SAMPLER_ARG='1.5': traceidratio needs a ratio from 0 to 1"),
    (["serve", "--otel-traces", "--print-config"],
     {"OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=fine,Bearer s3cret-token"},
     "OTEL_EXPORTER_OTLP_HEADERS: entry 2 is not key=value"),
    (["serve", "--print-config"], {"NNRP_GATEWAY_PLAIN_DELTA": "off"},
     "NNRP_GATEWAY_PLAIN_DELTA is 'off', not one of fused, python, general"),
])
def test_an_error_names_the_variable_it_came_from(argv: list[str], env: dict[str, str],
                                                  says: str) -> None:
    result = runner.invoke(app, argv, env=env)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert says in line, line
    assert "s3cret" not in line  # a header's value may be a key: never repeated


def test_otel_sdk_disabled_switches_tracing_off_and_checks_nothing() -> None:
    result = runner.invoke(app, ["serve", "--otel-traces", "--print-config"],
                           env={"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_SAMPLER": "sometimes"})
    assert (result.exit_code, result.stderr) == (0, "")


def test_debug_shows_the_traceback_instead() -> None:
    result = runner.invoke(app, ["--debug", "serve", "--vllm-url", "x", "--print-config"])
    assert result.exit_code == 1 and result.exception is not None
    assert "expected an http://" in str(result.exception)


def test_conformance_plan_reaches_a_tls_gateway_with_its_ca_file(world: World) -> None:
    # Issue 22: `conformance plan` had no --ca-file; against tcps:// it could not start.
    result = runner.invoke(app, ["conformance", "plan", "--out", str(world.tmp / "tls.json"),
                                 "--endpoint", world.gateway_tcps, "--ca-file",
                                 str(world.cert)])
    assert result.exit_code == 0, result.stderr
    assert "selected" in result.stdout


def test_conformance_run_and_wire_probe_reach_tcps_with_the_default_client(world: World
                                                                           ) -> None:
    # Issue 26: the default (native) client crashed on tcps (route-unresolved), and the
    # wire probe ran nothing there.
    pytest.importorskip("nnrp.client.native")
    result = runner.invoke(app, ["conformance", "run", "--endpoint", world.gateway_tcps,
                                 "--ca-file", str(world.cert), "--suite-only",
                                 "--no-check-without-extensions",
                                 "--out", str(world.tmp / "run-tcps")])
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "passed with the native client" in result.stdout
    probe = runner.invoke(app, ["conformance", "wire-probe", "--endpoint", world.gateway_tcps,
                                "--ca-file", str(world.cert),
                                "--out", str(world.tmp / "wire-tcps.json")])
    assert probe.exit_code == 0, probe.stdout + probe.stderr
    assert probe.stdout.count("passed  gateway.wire.tcps.") == 3


def test_every_conformance_command_that_connects_takes_trust_and_a_token() -> None:
    """Issue 26: --ca-file and --auth-token on every conformance command that reaches a
    gateway (validate reads files; host-routes and host-route-target bring their own
    certificate, the runner's, and no endpoint)."""
    group = get_command(app).commands["conformance"]  # type: ignore[attr-defined]
    connecting = {name: {opt for param in command.params for opt in param.opts}
                  for name, command in group.commands.items()
                  if any("--endpoint" in param.opts for param in command.params)}
    assert sorted(connecting) == ["plan", "run", "wire-probe"]
    for name, options in connecting.items():
        assert {"--ca-file", "--auth-token", "--auth-token-file"} <= options, name


@pytest.mark.parametrize(("given", "env", "source"), [
    (["--auth-token", "t"], {}, "--auth-token"),
    (["--auth-token-file", "{token}"], {}, "--auth-token-file"),
    ([], {"NNRP_GATEWAY_CLIENT_AUTH_TOKEN": "t"},
     "environment variable NNRP_GATEWAY_CLIENT_AUTH_TOKEN"),
])
def test_the_native_client_with_a_token_names_where_the_token_came_from(
        tmp_path: Path, given: list[str], env: dict[str, str], source: str) -> None:
    """Issue 26 review: the line ended "…; use --client builtin, --client native" (the
    option given as the error's place, after the advice)."""
    pytest.importorskip("nnrp.client.native")
    token = tmp_path / "token"
    token.write_text("t\n")
    result = runner.invoke(app, ["conformance", "run", "--endpoint", "tcp://127.0.0.1:1",
                                 "--client", "native", "--out", str(tmp_path / "run"),
                                 *(arg.format(token=token) for arg in given)], env=env)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: nnrp-py's native client (--client native) cannot present a session auth "
        f"token (use --client builtin), {source}"]
