"""vLLM over HTTP: the client (the only httpx user), the SSE decoder, version bindings."""

from ._client import (
    BodyChunks as BodyChunks,
)
from ._client import (
    UpstreamConfig as UpstreamConfig,
)
from ._client import (
    VllmClient as VllmClient,
)
from ._client import (
    VllmInfo as VllmInfo,
)
from ._errors import (
    UpstreamError as UpstreamError,
)
from ._errors import (
    UpstreamMalformed as UpstreamMalformed,
)
from ._errors import (
    UpstreamStatus as UpstreamStatus,
)
from ._errors import (
    UpstreamTimeout as UpstreamTimeout,
)
from ._errors import (
    UpstreamUnavailable as UpstreamUnavailable,
)
from ._errors import (
    to_profile_error as to_profile_error,
)
from ._sse import SSEDecoder as SSEDecoder
from ._sse import SSEError as SSEError
from ._sse import SSEEvent as SSEEvent
from ._versions import (
    BINDINGS as BINDINGS,
)
from ._versions import (
    SUPPORTED_BAND as SUPPORTED_BAND,
)
from ._versions import (
    Binding as Binding,
)
from ._versions import (
    UnsupportedVersion as UnsupportedVersion,
)
from ._versions import (
    select_binding as select_binding,
)
