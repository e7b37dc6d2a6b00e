"""openai-compatible/1: envelope validation, event builders, how operations end
(the outcome table), the capability document. Pure: no trio, no httpx."""

from . import _events as events
from ._capabilities import (
    EXTENSIONS as EXTENSIONS,
    RUNTIME_TOKENS as RUNTIME_TOKENS,
    Listener as Listener,
    capability_document as capability_document,
    runtime_tokens as runtime_tokens,
)
from ._envelope import (
    CAPABILITIES_OPERATION as CAPABILITIES_OPERATION,
    CHAT_COMPLETIONS as CHAT_COMPLETIONS,
    KNOWN_OPERATIONS as KNOWN_OPERATIONS,
    SCHEMA_VERSION as SCHEMA_VERSION,
    Envelope as Envelope,
    EnvelopeResubmission as EnvelopeResubmission,
    NnrpPolicy as NnrpPolicy,
    check_typed_body as check_typed_body,
    parse_envelope as parse_envelope,
)
from ._errors import ProfileError as ProfileError
from ._outcomes import (
    CANCEL_CAUSES as CANCEL_CAUSES,
    END_TABLE as END_TABLE,
    ERROR_CAUSES as ERROR_CAUSES,
    Drop as Drop,
    EndCause as EndCause,
    EndSpec as EndSpec,
    Outcome as Outcome,
    Push as Push,
    Silent as Silent,
    Terminal as Terminal,
)
from ._token import (
    TOKEN_COMPLETION as TOKEN_COMPLETION,
    is_token_request as is_token_request,
    token_prompt as token_prompt,
)

__all__ = ["events"]
