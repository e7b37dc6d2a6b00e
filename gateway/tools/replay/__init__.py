"""Recorded vLLM transcripts and a loopback fake vLLM (trio + h11), for tests and ``demo``."""

from ._server import (
    BACKEND_ERROR_MODEL as BACKEND_ERROR_MODEL,
)
from ._server import (
    SERVED_MODELS as SERVED_MODELS,
)
from ._server import (
    Disconnect as Disconnect,
)
from ._server import (
    RecordedRequest as RecordedRequest,
)
from ._server import (
    ReplayServer as ReplayServer,
)
from ._transcripts import (
    FAMILIES as FAMILIES,
)
from ._transcripts import (
    Transcript as Transcript,
)
from ._transcripts import (
    bundled_transcripts as bundled_transcripts,
)
from ._transcripts import (
    derive as derive,
)
from ._transcripts import (
    load_transcript as load_transcript,
)
from ._transcripts import (
    parse_transcript as parse_transcript,
)
