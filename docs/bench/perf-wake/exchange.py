"""CPU per non-streaming exchange through VllmClient.completion against a raw loopback
server in the same process (the server's cost is the same in both trees)."""
import functools, sys, time
import trio
from gateway.upstream import UpstreamConfig, VllmClient
BODY = (b'{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":'
        b'[{"index":0,"message":{"role":"assistant","content":"hello"}}]}')
REPLY = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY)
async def handle(stream):
    buf = b""
    while True:
        while b"\r\n\r\n" not in buf:
            d = await stream.receive_some(65536)
            if not d: return
            buf += d
        head, _, buf = buf.partition(b"\r\n\r\n")
        n = next(int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:"))
        while len(buf) < n: buf += await stream.receive_some(65536)
        buf = buf[n:]
        await stream.send_all(REPLY)
async def main(n):
    async with trio.open_nursery() as nursery:
        ls = await nursery.start(functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        port = ls[0].socket.getsockname()[1]
        client = VllmClient(UpstreamConfig(f"http://127.0.0.1:{port}"))
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(200): await client.completion(body, {"x-request-id": "a"})
        c = time.process_time()
        for _ in range(n): await client.completion(body, {"x-request-id": "a"})
        c = time.process_time() - c
        await client.aclose()
        nursery.cancel_scope.cancel()
    print(f"{c / n * 1e6:.1f}")
trio.run(main, int(sys.argv[1]))
