"""Codec cost per frame: ours against nnrp-py's pure-Python reference codec (when installed)."""

from __future__ import annotations

import json
from collections.abc import Callable

from gateway import nnrp

from .stats import Figure, per_call_us

_EVENT = json.dumps({"type": "response.output_text.delta", "index": 0,
                     "delta": "Hello"}, separators=(",", ":")).encode()
_ENVELOPE = json.dumps({
    "schema_version": "openai-compatible/1", "operation": "chat.completions.create",
    "body": {"model": "example-model", "stream": True,
             "messages": [{"role": "user", "content": "Say hello in five words, please."}]},
}, separators=(",", ":")).encode()


def _ready_client() -> nnrp.ClientConnection:
    client = nnrp.ClientConnection()
    client.hello()
    client.receive_data(nnrp.encode(nnrp.Packet(nnrp.ServerHelloAck(accepted_profile_bitmap=2))))
    client.open_session()
    client.receive_data(nnrp.encode(nnrp.Packet(nnrp.SessionOpenAck(session_id=1),
                                                session_id=1)))
    return client


def run_codec_bench(quick: bool = False) -> list[Figure]:
    """Encode/decode cost per PARTIAL_RESULT and per FRAME_SUBMIT (typed body)."""
    min_time = 0.1 if quick else 0.5
    partial = nnrp.encode_partial_result(1, 1, 0x65, 7, _EVENT)
    decoder = nnrp.Decoder()

    def decode_partial() -> object:
        return decoder.feed(partial)

    client = _ready_client()
    ids = iter(range(1, 1 << 62))
    submit = client.submit(1, 1 << 62, 1 << 31, _ENVELOPE)

    def encode_submit() -> object:
        number = next(ids)
        data = client.submit(1, number, number, _ENVELOPE)
        client._sessions[1].by_frame.clear()  # keep the client's registry from growing
        client._sessions[1].by_operation.clear()
        return data

    def decode_submit() -> object:
        (packet,) = decoder.feed(submit)
        message = packet.message
        assert isinstance(message, nnrp.FrameSubmit)
        return nnrp.parse_typed_body(packet.body, payload_kind_bitmap=message.payload_kind_bitmap,
                                     payload_frame_count=message.payload_frame_count)

    ours = {
        "partial_encode": per_call_us(lambda: nnrp.encode_partial_result(1, 1, 0x65, 7, _EVENT),
                                      min_time=min_time),
        "partial_decode": per_call_us(decode_partial, min_time=min_time),
        "submit_encode": per_call_us(encode_submit, min_time=min_time),
        "submit_decode": per_call_us(decode_submit, min_time=min_time),
    }
    ours["pipeline_event"] = per_call_us(_pipeline_event(), min_time=min_time)
    ours["pipeline_fused"] = per_call_us(_pipeline_event_fused(), min_time=min_time)
    if _native_built():  # the row above read by the C function: this one by the pure one
        ours["pipeline_fused_python"] = per_call_us(_pipeline_event_fused("python"),
                                                    min_time=min_time)
    theirs = _reference_codec(min_time)
    goals = {"partial_encode": 2.0, "partial_decode": 2.0, "submit_encode": 10.0,
             "submit_decode": 10.0, "pipeline_event": None, "pipeline_fused": None}
    names = {"partial_encode": "PARTIAL_RESULT encode", "partial_decode": "PARTIAL_RESULT decode",
             "submit_encode": "FRAME_SUBMIT encode (typed body)",
             "submit_decode": "FRAME_SUBMIT decode + validate",
             "pipeline_event": "pipeline per streamed event (SSE -> checks -> event -> frame)",
             "pipeline_fused": "pipeline per streamed event, plain delta fused (read -> frame)",
             "pipeline_fused_python": "pipeline per streamed event, plain delta fused, the "
                                      "pure function (NNRP_GATEWAY_PLAIN_DELTA=python)"}
    return [Figure(names[key], value, "us", goal=goals.get(key),
                   baseline=theirs.get(key), baseline_name="nnrp-py nnrp.core", spread=spread)
            for key, (value, spread) in ours.items()]


_SSE_CHUNK = (b'data: {"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1796034842,'
              b'"model":"example-model","choices":[{"index":0,"delta":{"content":" quick"},'
              b'"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n')


_SSE_ROLE_CHUNK = (b'data: {"id":"chatcmpl-abc","object":"chat.completion.chunk",'
                   b'"created":1796034842,"model":"example-model","choices":[{"index":0,'
                   b'"delta":{"role":"assistant","content":""},"logprobs":null,'
                   b'"finish_reason":null}],"prompt_token_ids":null}\n\n')


def _pipeline_event() -> Callable[[], object]:
    """The gateway's CPU per streamed token: one vLLM SSE chunk in, one PARTIAL_RESULT out
    (the reference adapter's in-process figure is 4.3 us, with no wire on either side)."""
    from gateway.pipeline import Translator, token_count
    from gateway.upstream import BINDINGS, ChunkParser, SSEDecoder

    decoder = SSEDecoder()
    parse_chunk = ChunkParser()  # one stream's: its chunks share a head
    translator = Translator(BINDINGS[-1], usage_requested=False)
    translator.feed(parse_chunk(_SSE_ROLE_CHUNK[6:-2].decode()))  # the stream's first chunk

    def one() -> object:
        # As ChatPipeline._stream does it per chunk (the token budget's count included).
        for sse in decoder.feed(_SSE_CHUNK):
            chunk = parse_chunk(sse.data)
            token_count(chunk)
            for body in translator.feed_encoded(chunk):
                nnrp.encode_partial_result(1, 1, 1, 5, body)
        return None

    return one


def _native_built() -> bool:
    """The C plain text delta is built: ``fused`` reads with another function."""
    from gateway.pipeline import plain_blocks_of

    return plain_blocks_of("fused") is not plain_blocks_of("python")


def _pipeline_event_fused(mode: str = "fused") -> Callable[[], object]:
    """``_pipeline_event``'s chunk as the handler reads it now: the plain text delta
    fused (``gateway.pipeline.PlainDelta``), the upstream read's bytes to the event's
    body, then the frame; its bytes read as ``NNRP_GATEWAY_PLAIN_DELTA=mode`` reads
    them (``fused``: in C where the build has it)."""
    from gateway.pipeline import PlainDelta, Translator, plain_blocks_of
    from gateway.upstream import BINDINGS, ChunkParser, SSEDecoder

    decoder = SSEDecoder()
    parse_chunk = ChunkParser()
    translator = Translator(BINDINGS[-1], usage_requested=False)
    for chunk in (_SSE_ROLE_CHUNK, _SSE_CHUNK):  # the first plain delta keeps the head
        translator.feed(parse_chunk(chunk[6:-2].decode()))
    blocks = plain_blocks_of(mode)
    assert blocks is not None
    reader = PlainDelta(translator, blocks)
    if reader(_SSE_CHUNK, decoder, parse_chunk) is None:
        raise RuntimeError("the fused plain delta did not take the bench's chunk")

    def one() -> object:
        taken = reader(_SSE_CHUNK, decoder, parse_chunk)
        for body in taken[0] if taken is not None else ():
            if body is not None:
                nnrp.encode_partial_result(1, 1, 1, 5, body)
        return None

    return one


def _reference_codec(min_time: float) -> dict[str, float]:
    try:
        from nnrp.core import FrameSubmitMetadata, MessageType, NnrpHeader, PayloadKind
        from nnrp.core.packet import (
            NnrpPacket,
            build_frame_submit_typed_payload_packet,
            build_typed_payload_frame,
            validate_frame_submit_body,
        )
        from nnrp.runtime.types import PartialResultMetadata
        from nnrp.schema import StreamSemantics
    except ImportError:
        return {}

    def encode_partial() -> bytes:
        meta = PartialResultMetadata(0x65, 7, 0, 7, len(_EVENT), 0).pack()
        header = NnrpHeader(version_major=1, wire_format=0, msg_type=MessageType.PARTIAL_RESULT,
                            header_len=40, flags=0, meta_len=len(meta), body_len=len(_EVENT),
                            session_id=1, frame_id=1, view_id=0, route_id=0, trace_id=0)
        return bytes(header.pack() + meta + _EVENT)

    partial = nnrp.encode_partial_result(1, 1, 0x65, 7, _EVENT)

    def decode_partial() -> object:
        header = NnrpHeader.unpack(partial[:40])
        return header, PartialResultMetadata.unpack(partial[40:80]), partial[80:]

    def encode_submit() -> bytes:
        frame = build_typed_payload_frame(PayloadKind.STRUCTURED_EVENT, _ENVELOPE, profile_id=0,
                                          stream_semantics=StreamSemantics.SNAPSHOT)
        return bytes(build_frame_submit_typed_payload_packet(
            session_id=1, frame_id=1, operation_id=1, frames=[frame]).pack())

    submit = encode_submit()

    def decode_submit() -> object:
        packet = NnrpPacket.unpack(submit)
        metadata = FrameSubmitMetadata.unpack(packet.metadata)
        return validate_frame_submit_body(metadata, packet.body)

    return {key: per_call_us(fn, min_time=min_time)[0] for key, fn in {
        "partial_encode": encode_partial, "partial_decode": decode_partial,
        "submit_encode": encode_submit, "submit_decode": decode_submit}.items()}
