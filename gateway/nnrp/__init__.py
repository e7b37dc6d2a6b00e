"""Sans-IO NNRP/1 (preview4): codec, typed bodies and session state machines.

Bytes in, events out: nothing here imports trio or httpx (architecture.md, rule 1).
"""

from ._body import (
    DESCRIPTOR_LEN as DESCRIPTOR_LEN,
)
from ._body import (
    PRELUDE_LEN as PRELUDE_LEN,
)
from ._body import (
    Prelude as Prelude,
)
from ._body import (
    TypedBody as TypedBody,
)
from ._body import (
    TypedDescriptor as TypedDescriptor,
)
from ._body import (
    TypedFrame as TypedFrame,
)
from ._body import (
    pack_single_frame as pack_single_frame,
)
from ._body import (
    pack_typed_body as pack_typed_body,
)
from ._body import (
    parse_typed_body as parse_typed_body,
)
from ._client import (
    ClientConnection as ClientConnection,
)
from ._client import (
    ClientEvent as ClientEvent,
)
from ._client import (
    ClientState as ClientState,
)
from ._client import (
    DropReceived as DropReceived,
)
from ._client import (
    ErrorReceived as ErrorReceived,
)
from ._client import (
    HelloAcked as HelloAcked,
)
from ._client import (
    OtherReceived as OtherReceived,
)
from ._client import (
    PartialReceived as PartialReceived,
)
from ._client import (
    ResultReceived as ResultReceived,
)
from ._client import (
    SessionCloseAcked as SessionCloseAcked,
)
from ._client import (
    SessionOpenAnswered as SessionOpenAnswered,
)
from ._codec import (
    Decoder as Decoder,
)
from ._codec import (
    Header as Header,
)
from ._codec import (
    Packet as Packet,
)
from ._codec import (
    decode_packet as decode_packet,
)
from ._codec import (
    encode as encode,
)
from ._codec import (
    encode_openai_submit as encode_openai_submit,
)
from ._codec import (
    encode_partial_result as encode_partial_result,
)
from ._constants import *  # noqa: F403
from ._errors import (
    LocalProtocolError as LocalProtocolError,
)
from ._errors import (
    ProtocolError as ProtocolError,
)
from ._errors import (
    RemoteProtocolError as RemoteProtocolError,
)
from ._errors import (
    TypedBodyError as TypedBodyError,
)
from ._events import *  # noqa: F403
from ._messages import *  # noqa: F403
from ._server import (
    ConnState as ConnState,
)
from ._server import (
    OpState as OpState,
)
from ._server import (
    ServerConfig as ServerConfig,
)
from ._server import (
    ServerConnection as ServerConnection,
)
from ._server import (
    SessionState as SessionState,
)
