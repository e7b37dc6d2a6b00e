"""Run from the repository, with gc_sitecustomize.py copied to /tmp/gcexp/sitecustomize.py:
``.venv/bin/python docs/bench/issue25-final/gc.py "" freeze "freeze+threshold"``.

Issue 25, row 3: does the cyclic garbage collector explain the coalesced cost? The cost
scenario twice per mode, the gateway started with gc.freeze() 4 s after start-up
("freeze"), with gc.set_threshold(10_000, 50, 100) too ("freeze+threshold"), or as it is
(""); printed: gateway CPU per event at 1, 16 and 256 streams, paced then coalesced."""
import sys, trio, os
from gateway.tools.bench._stack import Stack
from gateway.tools.bench.scenarios import cost
modes = sys.argv[1:]
async def main():
    for rnd in range(2):
        for mode in modes:
            env = {"PYTHONPATH": "/tmp/gcexp", "GW_GC": mode}
            async with Stack(env=env) as stack:
                await trio.sleep(5)
                figs = await cost(stack, False, lambda m: None)
            vals = {f.name: f.value for f in figs}
            print(mode or "default", " ".join(f"{vals[k]:.1f}" for k in vals if k.startswith("gateway CPU per event")), flush=True)
trio.run(main)
