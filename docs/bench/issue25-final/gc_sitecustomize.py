import gc, os, threading
_mode = os.environ.get("GW_GC", "")
if "freeze" in _mode:
    threading.Timer(4.0, gc.freeze).start()
if "threshold" in _mode:
    gc.set_threshold(10_000, 50, 100)
