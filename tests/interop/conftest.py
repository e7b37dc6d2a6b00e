"""Share the running-server fixtures of the server tests."""

from tests.server.conftest import running, socket_dir

__all__ = ["running", "socket_dir"]
