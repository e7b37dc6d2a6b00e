"""Test helpers shared across the suite, in one place: tests import from here and never
from each other (nor from the benchmarks).

* ``processes``: free ports, readiness polling, a replay vLLM in a thread;
* ``servers``: a GatewayServer with a scripted operation handler;
* ``stack``: the whole gateway behind a replay vLLM, and envelope helpers;
* ``native``: driving nnrp-py's Rust-backed native client and server;
* ``waits``: waiting for a state (``until``, ``until_steady``, ``wait_for``), never for
  the machine's speed.
"""
