"""What a kept object byte costs in memory (``gateway/nnrp/_objects.py`` O9): objects
declared and patched whole into one session's table, the process's resident set size
before and after, and after the table is cleared (the reservation given back). With
``cache``: CACHE_PUT objects kept by the session's cache instead (``gateway/nnrp/_cache.py``
C3), each put's bytes copied out of its frame, and the whole session cache invalidated.

    .venv/bin/python -m gateway.tools.bench.object_rss [COUNT] [MIB] [cache]

Linux only (it reads ``/proc/self/status``).
"""

from __future__ import annotations

import gc
import os
import sys

from gateway import nnrp


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(count: int, size: int) -> dict[str, float]:
    limits = nnrp.ObjectLimits(max_objects=count, max_object_bytes=count * size,
                               max_kept_bytes=count * size)
    pool = nnrp.ObjectBytes(capacity=count * size)
    table = nnrp.ObjectTable(1, limits, pool)
    payload = os.urandom(size)
    gc.collect()
    before = resident_bytes()
    for object_id in range(1, count + 1):
        assert table.declare(nnrp.ObjectDeclare(object_id=object_id, session_id=1,
                                                byte_size=size)) is None
        patch = nnrp.ObjectPatch(object_id=object_id, delta_sequence=1, region_offset=0,
                                 region_bytes=size, delta_bytes=size,
                                 flags=int(nnrp.ObjectDeltaFlag.REPLACES_REGION))
        assert table.apply_delta(patch, payload) is None
    gc.collect()
    kept, grown = table.kept_bytes, resident_bytes() - before
    table.clear()
    gc.collect()
    return {"kept_mib": kept / 2**20, "rss_grown_mib": grown / 2**20,
            "rss_per_kept_byte": grown / kept,
            "rss_left_after_clear_mib": (resident_bytes() - before) / 2**20,
            "pool_used_after_clear": pool.used}


def measure_cache(count: int, size: int) -> dict[str, float]:
    limits = nnrp.ObjectLimits(max_kept_bytes=count * size)
    pool = nnrp.ObjectBytes(capacity=count * size)
    table = nnrp.ObjectTable(1, limits, pool, cache=nnrp.CacheLimits(max_entries=count))
    payload = os.urandom(size)
    gc.collect()
    before = resident_bytes()
    for key in range(1, count + 1):
        put = nnrp.CachePut(cache_namespace=1, object_kind=int(nnrp.CacheObjectKind.CAMERA_BLOCK),
                            cache_key_lo=key, object_bytes=size)
        # A frame's body is a view of what it arrived in (``nnrp._codec``): the cache copies.
        assert table.cache.put(put, memoryview(payload)).status == nnrp.CacheAckStatus.ACCEPTED
    gc.collect()
    kept, grown = table.kept_bytes, resident_bytes() - before
    table.cache.invalidate(nnrp.CacheInvalidate(scope=int(nnrp.CacheInvalidateScope.WHOLE_SESSION)))
    gc.collect()
    return {"kept_mib": kept / 2**20, "rss_grown_mib": grown / 2**20,
            "rss_per_kept_byte": grown / kept,
            "rss_left_after_clear_mib": (resident_bytes() - before) / 2**20,
            "pool_used_after_clear": pool.used}


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    size = (int(sys.argv[2]) if len(sys.argv) > 2 else 4) << 20
    how = measure_cache if sys.argv[3:] == ["cache"] else measure
    for name, value in how(count, size).items():
        print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}")


if __name__ == "__main__":
    main()
