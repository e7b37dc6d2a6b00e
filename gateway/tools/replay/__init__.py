"""Recorded vLLM transcripts and a loopback fake vLLM (trio + h11), for tests and ``demo``."""

from ._record import (
    record_admission as record_admission,
    record_all as record_all,
    record_forced as record_forced,
)
from ._server import (
    BACKEND_ERROR_MODEL as BACKEND_ERROR_MODEL,
    SERVED_MODELS as SERVED_MODELS,
    Disconnect as Disconnect,
    RecordedRequest as RecordedRequest,
    ReplayServer as ReplayServer,
    choose_scenario as choose_scenario,
)
from ._transcripts import (
    FAMILIES as FAMILIES,
    VERSIONS as VERSIONS,
    Transcript as Transcript,
    bundled_transcripts as bundled_transcripts,
    conform_body as conform_body,
    derive as derive,
    family_transcripts as family_transcripts,
    load_transcript as load_transcript,
    parse_transcript as parse_transcript,
)
