"""vLLM over HTTP: the client (for an http:// vLLM's requests the project's own HTTP/1.1
client, for https:// and the probes httpx: ``_client``'s rules), the checked chunk
stream, the SSE decoder, chunk checks and version bindings.

httpx is imported by ``_client`` (the probes) and ``_https`` (an https:// vLLM's requests)
only; in the serving core, besides them, only the workers' supervisor uses it (to ask each
worker's admin listener over its unix socket), and in ``gateway.tools`` whatever tool
talks HTTP (tests/test_layers.py).
"""

from ._admission import LoadMonitor as LoadMonitor
from ._chunks import (
    ChunkParser as ChunkParser,
    check_chunk as check_chunk,
    parse_chunk as parse_chunk,
    parse_completion as parse_completion,
)
from ._client import (
    CHAT_PATH as CHAT_PATH,
    TEXT_COMPLETION_PATH as TEXT_COMPLETION_PATH,
    Completion as Completion,
    UpstreamConfig as UpstreamConfig,
    VllmClient as VllmClient,
    VllmInfo as VllmInfo,
)
from ._errors import (
    ENGINE_DEAD_MESSAGE as ENGINE_DEAD_MESSAGE,
    RefusalReason as RefusalReason,
    UpstreamError as UpstreamError,
    UpstreamMalformed as UpstreamMalformed,
    UpstreamOverloaded as UpstreamOverloaded,
    UpstreamStatus as UpstreamStatus,
    UpstreamTimeout as UpstreamTimeout,
    UpstreamUnavailable as UpstreamUnavailable,
    classify_refusal as classify_refusal,
    engine_dead as engine_dead,
    refusal_of as refusal_of,
    to_profile_error as to_profile_error,
)
from ._http1 import RequestBody as RequestBody
from ._load import (
    LoadDecision as LoadDecision,
    LoadError as LoadError,
    LoadPolicy as LoadPolicy,
    LoadSample as LoadSample,
    LoadSource as LoadSource,
    LoadState as LoadState,
    RefuseReason as RefuseReason,
    decide as decide,
    parse_load as parse_load,
    parse_metrics as parse_metrics,
)
from ._request_fields import (
    RequestFieldError as RequestFieldError,
    is_streaming as is_streaming,
    lax_bool as lax_bool,
    lax_int as lax_int,
    output_token_limit as output_token_limit,
    usage_requested as usage_requested,
)
from ._slots import SlotHolder as SlotHolder, Standing as Standing
from ._sse import SSEDecoder as SSEDecoder, SSEError as SSEError, SSEEvent as SSEEvent
from ._stream import ChunkStream as ChunkStream, observe_reads as observe_reads
from ._versions import (
    BINDINGS as BINDINGS,
    PRIORITY_HEADER as PRIORITY_HEADER,
    SUPPORTED_BAND as SUPPORTED_BAND,
    Binding as Binding,
    ResponseShape as ResponseShape,
    UnsupportedVersion as UnsupportedVersion,
    select_binding as select_binding,
)
