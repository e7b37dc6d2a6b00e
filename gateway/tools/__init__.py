"""Tools around the gateway, apart from the serving core: a trio NNRP client
(``client``), the replay vLLM (``replay``), the conformance runner (``conformance``) and
the benchmarks (``bench``). The serving core (nnrp, profile, upstream, pipeline, server,
observe, app) never imports them (tests/test_layers.py checks it)."""
