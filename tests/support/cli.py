"""What ``serve`` would run with: the GatewayConfig its options build, without serving."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from typer.testing import CliRunner

import cli.main

if TYPE_CHECKING:
    import pytest

    from gateway.app import GatewayConfig


def served_config(monkeypatch: pytest.MonkeyPatch, args: list[str],
                  env: dict[str, str | None] | None = None) -> GatewayConfig:
    """Run ``nnrp-gateway serve ARGS`` with the serving itself replaced by a capture: the
    configuration is the one the real command would serve (one process)."""
    seen: list[GatewayConfig] = []

    async def capture(config: GatewayConfig, manifest: Path | None,
                      server_name: str | None) -> None:
        seen.append(config)

    monkeypatch.setattr(cli.main, "_serve", capture)
    result = CliRunner().invoke(cli.main.app, ["serve", *args], env=env)
    assert result.exit_code == 0, result.stderr
    (config,) = seen
    return config
