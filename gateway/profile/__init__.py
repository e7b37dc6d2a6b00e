"""openai-compatible/1: envelope validation, event builders, how operations end
(the outcome table), the capability document. Pure: no trio, no httpx."""

from . import _events as events
from ._capabilities import (
    EXTENSIONS as EXTENSIONS,
    RUNTIME_TOKENS as RUNTIME_TOKENS,
    Listener as Listener,
    MediaCapabilities as MediaCapabilities,
    capability_document as capability_document,
    runtime_tokens as runtime_tokens,
)
from ._envelope import (
    CAPABILITIES_OPERATION as CAPABILITIES_OPERATION,
    CHAT_COMPLETIONS as CHAT_COMPLETIONS,
    DEFAULT_MAX_ENVELOPE_BYTES as DEFAULT_MAX_ENVELOPE_BYTES,
    KNOWN_OPERATIONS as KNOWN_OPERATIONS,
    SCHEMA_VERSION as SCHEMA_VERSION,
    Envelope as Envelope,
    NnrpPolicy as NnrpPolicy,
    SubmitBody as SubmitBody,
    parse_envelope as parse_envelope,
    read_envelope as read_envelope,
    read_envelope_steps as read_envelope_steps,
    read_typed_body as read_typed_body,
)
from ._errors import ProfileError as ProfileError
from ._media import (
    DEFAULT_MAX_MEDIA_BYTES as DEFAULT_MAX_MEDIA_BYTES,
    MEDIA_EXTENSIONS as MEDIA_EXTENSIONS,
    MediaFrame as MediaFrame,
    MediaPlan as MediaPlan,
    MediaSlot as MediaSlot,
    media_frames as media_frames,
    plan_media as plan_media,
    sniff as sniff,
)
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
from ._resubmission import EnvelopeResubmission as EnvelopeResubmission
from ._token import (
    TOKEN_COMPLETION as TOKEN_COMPLETION,
    is_token_request as is_token_request,
    token_prompt as token_prompt,
)

__all__ = ["events"]
