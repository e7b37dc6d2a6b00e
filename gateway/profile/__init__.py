"""openai-compatible/1: envelope validation, event builders, error codes, capabilities."""

from . import _events as events
from ._envelope import (
    CAPABILITIES_OPERATION as CAPABILITIES_OPERATION,
)
from ._envelope import (
    CHAT_COMPLETIONS as CHAT_COMPLETIONS,
)
from ._envelope import (
    KNOWN_OPERATIONS as KNOWN_OPERATIONS,
)
from ._envelope import (
    SCHEMA_VERSION as SCHEMA_VERSION,
)
from ._envelope import (
    Envelope as Envelope,
)
from ._envelope import (
    NnrpPolicy as NnrpPolicy,
)
from ._envelope import (
    check_typed_body as check_typed_body,
)
from ._envelope import (
    parse_envelope as parse_envelope,
)
from ._errors import ERROR_TABLE as ERROR_TABLE
from ._errors import ErrorSpec as ErrorSpec
from ._errors import ProfileError as ProfileError

__all__ = ["events"]
