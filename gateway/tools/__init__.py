"""Tools around the gateway, apart from the serving core: a trio NNRP client
(``client``), the replay vLLM (``replay``), the conformance runner (``conformance``), the
benchmarks (``bench``) and the Grafana dashboard's builder (``dashboard``). The serving
core (nnrp, profile, upstream, pipeline, server, observe, app) never imports them
(tests/test_layers.py checks it)."""
