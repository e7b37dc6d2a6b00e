"""Pure translation stages and the chat pipeline that runs them for one operation."""

from ._chunks import check_chunk as check_chunk
from ._chunks import parse_chunk as parse_chunk
from ._handler import (
    ChatPipeline as ChatPipeline,
)
from ._handler import (
    OperationNotes as OperationNotes,
)
from ._handler import (
    PipelineLimits as PipelineLimits,
)
from ._handler import (
    profile_refusal as profile_refusal,
)
from ._request import (
    UpstreamRequest as UpstreamRequest,
)
from ._request import (
    build_request as build_request,
)
from ._request import (
    traceparent as traceparent,
)
from ._translate import Translator as Translator
