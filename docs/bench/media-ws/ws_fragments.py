"""What a read of tiny WebSocket fragments costs wsproto, the events trio-websocket then
takes in one step of the loop: a hostile client's masked 1-byte continuation frames, a
read's worth at 4, 16 and 64 KiB (``WS_RECEIVE_BYTES`` in gateway/server/_server.py).

    python docs/bench/media-ws/ws_fragments.py > docs/bench/media-ws/ws_fragments.txt
"""

from __future__ import annotations

import os
import time

from wsproto import ConnectionType
from wsproto.connection import Connection


def frame(opcode: int, fin: bool, payload: bytes) -> bytes:
    mask = os.urandom(4)
    masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
    return bytes([(0x80 if fin else 0) | opcode, 0x80 | len(payload)]) + mask + masked


if __name__ == "__main__":
    for _run in range(2):
        for size in (4096, 16384, 65536):
            data = frame(0x2, False, b"x") + b"".join(
                frame(0x0, False, b"x") for _ in range(size // 7))
            connection = Connection(ConnectionType.SERVER)
            began = time.perf_counter()
            connection.receive_data(data[:size])
            events = sum(1 for _ in connection.events())
            print(f"{size // 1024:2} KiB read: {events:5} events, "
                  f"{(time.perf_counter() - began) * 1000:6.1f} ms", flush=True)
