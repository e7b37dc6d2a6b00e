"""Media in a chat request: binary typed frames referenced from content parts, planned
here without I/O (``plan_media``), delivered to vLLM by the pipeline
(``gateway.pipeline._media``: a data URI, or a file in ``--media-dir``).

The openai-compatible/1 mapping carries one STRUCTURED_EVENT frame (docs/reference/nnrp-wire.md
section 4); base64 inside that JSON is the only way the frozen profile has to send an
image, a third larger on the client's link and parsed whole. This gateway extension
(``gateway.media`` in the capability document) lets the same submit carry the bytes as
typed frames of their own, which FRAME_SUBMIT's body has room for (section 3: several
descriptors, payload kinds AUDIO, VIDEO, OPAQUE beside STRUCTURED_EVENT). The rules:

M1. **Frames.** Frame 0 is the envelope, exactly as the profile has it
    (``check_typed_body``). Frames 1..N are media: payload kind OPAQUE, AUDIO or VIDEO,
    profile 0, schema 0/0, descriptor flags none or terminal, stream semantics
    unspecified or snapshot (a media frame is whole: partial or append frames are
    refused). At most ``MAX_MEDIA_FRAMES``; their bytes together at most the configured
    ``max_media_bytes``. A refusal names the frame by its index.
M2. **References.** A content part names a frame as ``nnrp:frame/N`` (N >= 1, decimal,
    no leading zero), optionally followed by ``;type=TYPE/SUBTYPE``, in the places vLLM
    takes media (``REFERENCE_FIELDS``): ``image_url.url``, ``video_url.url``,
    ``audio_url.url`` and ``input_audio.data``, in ``body.messages[i].content[j]``.
    Every ``nnrp:`` value there is the gateway's: one that is not a frame reference is
    refused, naming the part (``messages[0].content[1].image_url.url``), as is a
    reference to a frame the submit does not have.
M3. **Kinds.** An image part takes an OPAQUE frame; a video part VIDEO or OPAQUE; an
    audio part (``audio_url``, ``input_audio``) AUDIO or OPAQUE. Otherwise refused,
    naming the part and the frame.
M4. **Types.** The media type is the reference's ``;type=`` or else the one the bytes'
    signature names (``MEDIA_TYPES``: PNG, JPEG, GIF, WebP, WAV, MP3, FLAC, MP4, WebM).
    It must be of the part's family (``image/`` for an image part, and so on); a part
    whose type is neither given nor recognised is refused, naming the part.
M5. **Every frame is used.** A media frame no part references is refused (the client
    meant something by it); a frame may be referenced by several parts. What the parts
    deliver is bounded too, since each delivers its frame's bytes again (a data URI per
    part): at most ``MAX_MEDIA_REFERENCES`` parts, and their bytes together, counted per
    part, at most the configured ``max_media_bytes``.
M6. **``input_audio``** takes base64 data, not a URL (vLLM builds
    ``data:audio/{format};base64,`` from it): its reference is delivered as bare base64
    whatever the delivery mode, and ``format`` is set from the type when the part has
    none (``MEDIA_TYPES``).
M7. **The body is rewritten in place**: each reference becomes a placeholder
    (``MediaSlot.placeholder``, unique to the request: a random nonce the client cannot
    know) that delivery replaces by the data URI, the base64 or the file URL.
M8. **Session objects.** ``nnrp:object/ID`` names one of the session's runtime objects
    (its bytes sent once, with OBJECT_DECLARE and OBJECT_PATCH, and used by any later
    request of the session), at its current version or at ``@VERSION``
    (``nnrp:object/7@3;type=image/png``). The session reads it (``objects``: the bytes,
    whole, or why not, which refuses the request naming the part; ``gateway.nnrp._objects``
    O9) and the request depends on it from then on. An object has no payload kind: any
    part takes it, its type deciding (M4). Each object is read once per request.
M9. **Cached objects.** ``nnrp:cache/NS/KEY`` names an object the session put in its cache
    (CACHE_PUT: NS its cache_namespace in decimal, KEY its 128-bit key as 32 hex digits,
    cache_key_hi then cache_key_lo: ``nnrp:cache/7/00000000000000010000000000000002``).
    It is read as M8 reads an object (``cached``: the bytes, or why not; the request
    depends on the entry from then on, ``gateway.nnrp._cache`` C6), once per request,
    and any part takes it, its type deciding. A submit that lists the entry in its
    object-reference region has it checked before it runs; one that does not may still
    name it here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from gateway.nnrp import DescriptorFlag, PayloadKind, StreamSemantics

from ._errors import ProfileError

#: M1: media frames per submit.
MAX_MEDIA_FRAMES = 64
#: M5: content parts naming media, per request.
MAX_MEDIA_REFERENCES = 64
DEFAULT_MAX_MEDIA_BYTES = 64 << 20
#: M1: the payload kinds a media frame may have.
MEDIA_KINDS = frozenset({int(PayloadKind.OPAQUE), int(PayloadKind.AUDIO),
                         int(PayloadKind.VIDEO)})
_WHOLE_FLAGS = frozenset({0, int(DescriptorFlag.TERMINAL)})
_WHOLE_SEMANTICS = frozenset({int(StreamSemantics.UNSPECIFIED), int(StreamSemantics.SNAPSHOT)})

#: M2/M3/M4: each part type's media field, the frame kinds it takes, its type family.
REFERENCE_FIELDS: dict[str, tuple[str, frozenset[int], str]] = {
    "image_url": ("url", frozenset({int(PayloadKind.OPAQUE)}), "image"),
    "video_url": ("url", frozenset({int(PayloadKind.VIDEO), int(PayloadKind.OPAQUE)}), "video"),
    "audio_url": ("url", frozenset({int(PayloadKind.AUDIO), int(PayloadKind.OPAQUE)}), "audio"),
    "input_audio": ("data", frozenset({int(PayloadKind.AUDIO), int(PayloadKind.OPAQUE)}),
                    "audio"),
}
#: M6: the part whose reference is delivered as bare base64.
INLINE_PART = "input_audio"
REFERENCE_PREFIX = "nnrp:"
_REFERENCE = re.compile(r"nnrp:(?:frame/([1-9][0-9]{0,4})"
                        r"|object/([1-9][0-9]{0,19})(?:@([1-9][0-9]{0,19}))?"
                        r"|cache/(0|[1-9][0-9]{0,9})/([0-9a-fA-F]{32}))"
                        r"(?:;type=([^;]*))?")
#: M8: a session's objects, read by id and version (0: current): the bytes or why not.
ObjectReader = Callable[[int, int], "bytes | str"]
#: M9: a session's cache, read by namespace and key (hi, lo): the bytes or why not.
CacheReader = Callable[[int, int, int], "bytes | memoryview | str"]
#: What a request may name (M2, M8, M9), for its refusals.
_FORMS = ("nnrp:frame/N, nnrp:object/ID[@VERSION] or nnrp:cache/NS/KEY (32 hex digits), "
          "optionally ;type=TYPE/SUBTYPE")
_MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,62}/[a-z0-9][a-z0-9!#$&^_.+-]{0,62}")


Signature = Callable[[bytes], bool]


def _riff(form: bytes) -> Signature:
    return lambda head: head[:4] == b"RIFF" and head[8:12] == form


def _mp3(head: bytes) -> bool:
    # An ID3v2 tag, or an MPEG audio frame sync (11 set bits) of layer III.
    return head[:3] == b"ID3" or (len(head) >= 2 and head[0] == 0xFF
                                  and head[1] & 0xE6 == 0xE2)


@attrs.frozen
class MediaType:
    """One media type the gateway knows: how its bytes begin (M4; None: only declared),
    its file name extension in ``--media-dir`` (vLLM reads the bytes, not the name; a
    familiar name helps whoever looks in the directory), its ``input_audio.format``
    (M6)."""

    name: str
    extension: str
    signature: Signature | None = None
    audio_format: str | None = None


#: M4, M6, the files' names: one row per type, the signatures checked in this order.
MEDIA_TYPES: tuple[MediaType, ...] = (
    MediaType("image/png", "png", lambda head: head[:8] == b"\x89PNG\r\n\x1a\n"),
    MediaType("image/jpeg", "jpg", lambda head: head[:3] == b"\xff\xd8\xff"),
    MediaType("image/gif", "gif", lambda head: head[:6] in (b"GIF87a", b"GIF89a")),
    MediaType("image/webp", "webp", _riff(b"WEBP")),
    MediaType("audio/wav", "wav", _riff(b"WAVE"), "wav"),
    MediaType("audio/flac", "flac", lambda head: head[:4] == b"fLaC", "flac"),
    MediaType("audio/mpeg", "mp3", _mp3, "mp3"),
    MediaType("video/mp4", "mp4", lambda head: head[4:8] == b"ftyp"),
    MediaType("video/webm", "webm", lambda head: head[:4] == b"\x1a\x45\xdf\xa3"),
    MediaType("audio/ogg", "ogg", audio_format="ogg"),
    MediaType("audio/webm", "webm", audio_format="webm"),
    MediaType("audio/mp4", "m4a", audio_format="m4a"),
)
#: Views of ``MEDIA_TYPES``: the recognised types with their signatures, the files'
#: extensions, the audio formats.
SIGNATURES = tuple((row.name, row.signature) for row in MEDIA_TYPES if row.signature)
MEDIA_EXTENSIONS = {row.name: row.extension for row in MEDIA_TYPES}
AUDIO_FORMATS = {row.name: row.audio_format for row in MEDIA_TYPES if row.audio_format}


def sniff(data: bytes | memoryview) -> str | None:
    """M4: the media type the bytes' signature names, or None."""
    head = bytes(data[:16])
    for media_type, matches in SIGNATURES:
        if matches(head):
            return media_type
    return None


@attrs.frozen
class MediaFrame:
    """A media frame of the submit (M1): its index among the typed frames, its kind."""

    index: int
    kind: int
    #: The frame's bytes: a view of the submit's body when that is one (``nnrp._codec``).
    data: bytes | memoryview = attrs.field(repr=False)


@attrs.frozen
class MediaSlot:
    """One reference in the body (M7): the placeholder that stands for it now, the frame
    and type it names, and whether it is delivered as bare base64 (M6)."""

    placeholder: str
    frame: int
    media_type: str
    inline: bool


@attrs.frozen
class MediaPlan:
    frames: tuple[MediaFrame, ...] = ()
    slots: tuple[MediaSlot, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(len(frame.data) for frame in self.frames)


def media_frames(frames: Sequence[tuple[Any, bytes | memoryview]], *, max_bytes: int
                 ) -> tuple[MediaFrame, ...]:
    """M1: the submit's frames after the envelope, checked (``frames`` are the typed
    body's (descriptor, payload) pairs, the envelope first)."""
    media = frames[1:]
    if len(media) > MAX_MEDIA_FRAMES:
        raise ProfileError("invalid_submit_body",
                           f"{len(media)} media frames; at most {MAX_MEDIA_FRAMES} per submit")
    checked = []
    total = 0
    for index, (descriptor, payload) in enumerate(media, start=1):
        if (descriptor.payload_kind not in MEDIA_KINDS or descriptor.profile_id != 0
                or descriptor.schema_id or descriptor.schema_version
                or descriptor.descriptor_flags not in _WHOLE_FLAGS
                or descriptor.stream_semantics not in _WHOLE_SEMANTICS):
            raise ProfileError(
                "invalid_submit_body",
                f"typed frame {index} must be a whole media frame (OPAQUE, AUDIO or VIDEO; "
                f"profile 0, schema 0/0, not partial, not append); got kind "
                f"{descriptor.payload_kind:#x}, profile {descriptor.profile_id}, flags "
                f"{descriptor.descriptor_flags}, schema {descriptor.schema_id}/"
                f"{descriptor.schema_version}, semantics {descriptor.stream_semantics}")
        total += len(payload)
        checked.append(MediaFrame(index, descriptor.payload_kind, payload))
    if total > max_bytes:
        raise ProfileError("invalid_submit_body",
                           f"media frames of {total} bytes exceed the {max_bytes}-byte limit")
    return tuple(checked)


def plan_media(body: dict[str, Any], frames: Sequence[MediaFrame], *, nonce: str,
               objects: ObjectReader | None = None, cached: CacheReader | None = None,
               max_bytes: int = DEFAULT_MAX_MEDIA_BYTES) -> MediaPlan:
    """M2-M9: find the references in ``body`` (rewritten in place: each becomes its
    slot's placeholder), check them against ``frames`` (and the session's ``objects``
    and ``cached`` entries), and decide each one's type. ``nonce`` makes the
    placeholders unique to this request (random, unguessable)."""
    by_index = {frame.index: frame for frame in frames}
    # M8, M9: what was read, (object, version) or (namespace, key), -> its frame index
    read: dict[tuple[int, ...], int] = {}

    def object_frame(source: tuple[int, ...], where: str) -> int:
        index = read.get(source)
        if index is None:
            data: bytes | memoryview | str
            if len(source) == 2:
                name = f"nnrp:object/{source[0]}"
                data = objects(*source) if objects is not None else (
                    "this request has no session objects to read")
            else:
                name = f"nnrp:cache/{source[0]}/{source[1]:016x}{source[2]:016x}"
                data = cached(*source) if cached is not None else (
                    "this request has no session cache to read")
            if isinstance(data, str):
                raise ProfileError("invalid_body", f"{where}: {name}: {data}")
            index = read[source] = -1 - len(read)
            by_index[index] = MediaFrame(index, int(PayloadKind.OPAQUE), data)
        return index

    slots: list[MediaSlot] = []
    used: set[int] = set()
    messages = body.get("messages")
    for m, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for p, part in enumerate(content):
            if not isinstance(part, dict):
                continue
            part_type = part.get("type")
            if part_type not in REFERENCE_FIELDS:
                continue
            field, kinds, family = REFERENCE_FIELDS[part_type]
            holder = part.get(part_type)
            value = holder.get(field) if isinstance(holder, dict) else None
            if not isinstance(value, str) or not value.startswith(REFERENCE_PREFIX):
                continue
            assert isinstance(holder, dict)
            where = f"messages[{m}].content[{p}].{part_type}.{field}"
            if len(slots) == MAX_MEDIA_REFERENCES:
                raise ProfileError("invalid_body",
                                   f"{where}: more than {MAX_MEDIA_REFERENCES} content parts "
                                   "name media in one request")
            slot = _slot(value, where, by_index, kinds, family, object_frame,
                         inline=part_type == INLINE_PART,
                         placeholder=f"nnrp-media-{nonce}-{len(slots)}")
            holder[field] = slot.placeholder
            if slot.inline and "format" not in holder:
                holder["format"] = AUDIO_FORMATS.get(slot.media_type,
                                                     slot.media_type.partition("/")[2])
            slots.append(slot)
            used.add(slot.frame)
    unused = [frame.index for frame in frames if frame.index not in used]
    if unused:
        raise ProfileError("invalid_submit_body",
                           f"media frame {unused[0]} is not referenced by any content part "
                           f"(as nnrp:frame/{unused[0]})")
    delivered = sum(len(by_index[slot.frame].data) for slot in slots)
    if delivered > max_bytes:
        raise ProfileError("invalid_body",
                           f"the media parts deliver {delivered} bytes to vLLM, past the "
                           f"{max_bytes}-byte limit (a frame or object named by several "
                           "parts counts for each)")
    return MediaPlan(tuple(by_index.values()), tuple(slots))


def _slot(value: str, where: str, frames: dict[int, MediaFrame], kinds: frozenset[int],
          family: str, object_frame: Callable[[tuple[int, ...], str], int], *, inline: bool,
          placeholder: str) -> MediaSlot:
    reference = _REFERENCE.fullmatch(value)
    if reference is None:
        raise ProfileError("invalid_body",
                           f"{where}: {value[:80]!r} is not a media reference this gateway "
                           f"reads ({_FORMS})")
    if reference.group(2) is not None:  # M8
        index = object_frame((int(reference.group(2)), int(reference.group(3) or 0)), where)
        kinds = MEDIA_KINDS
    elif reference.group(4) is not None:  # M9
        namespace, key = int(reference.group(4)), reference.group(5)
        if namespace > 0xFFFFFFFF:
            raise ProfileError("invalid_body",
                               f"{where}: cache namespace {namespace} is not a u32")
        index = object_frame((namespace, int(key[:16], 16), int(key[16:], 16)), where)
        kinds = MEDIA_KINDS
    else:
        index = int(reference.group(1))
    frame = frames.get(index)
    if frame is None:
        submitted = len([key for key in frames if key > 0])
        raise ProfileError("invalid_body",
                           f"{where}: nnrp:frame/{index} names a media frame the submit does "
                           f"not carry ({submitted} media frames)")
    if frame.kind not in kinds:
        allowed = " or ".join(sorted(PayloadKind(kind).name or "" for kind in kinds))
        raise ProfileError("invalid_body",
                           f"{where}: frame {index} is {PayloadKind(frame.kind).name}; "
                           f"a {family} part takes {allowed}")
    declared = reference.group(6)
    if declared is not None:
        media_type = declared.strip().lower()
        if not _MEDIA_TYPE.fullmatch(media_type):
            raise ProfileError("invalid_body",
                               f"{where}: {declared[:80]!r} is not a media type (TYPE/SUBTYPE)")
    else:
        sniffed = sniff(frame.data)
        if sniffed is None:
            raise ProfileError("invalid_body",
                               f"{where}: the media type of {value.partition(';')[0]} is not "
                               f"given and its bytes are no format the gateway recognises; "
                               f"add ;type=TYPE/SUBTYPE")
        media_type = sniffed
    if media_type.partition("/")[0] != family:
        what = f"frame {index}" if index > 0 else value.partition(";")[0]
        raise ProfileError("invalid_body",
                           f"{where}: {what} is {media_type}; a {family} part takes "
                           f"{family}/*")
    return MediaSlot(placeholder, index, media_type, inline)
