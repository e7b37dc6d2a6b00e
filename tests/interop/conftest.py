"""The interop tests run against the same server fixtures as the server tests."""

from tests.server.conftest import running, socket_dir

__all__ = ["running", "socket_dir"]
