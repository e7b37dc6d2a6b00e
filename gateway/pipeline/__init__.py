"""Pure translation stages and the chat pipeline that runs them for one operation."""

from ._handler import (
    ChatPipeline as ChatPipeline,
    PipelineLimits as PipelineLimits,
    profile_refusal as profile_refusal,
)
from ._media import (
    MEDIA_DIR_CAPACITY as MEDIA_DIR_CAPACITY,
    MediaDelivery as MediaDelivery,
    MediaDirectory as MediaDirectory,
)
from ._plain_delta import (
    PlainDelta as PlainDelta,
    plain_blocks_of as plain_blocks_of,
    plain_delta_mode as plain_delta_mode,
)
from ._request import (
    UpstreamRequest as UpstreamRequest,
    build_request as build_request,
    traceparent as traceparent,
    upstream_traceparent as upstream_traceparent,
    vllm_priority as vllm_priority,
)
from ._translate import Translator as Translator, token_count as token_count
