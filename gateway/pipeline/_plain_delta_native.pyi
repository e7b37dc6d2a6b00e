"""The C ``plain_blocks`` (``_plain_delta_native.c``), built by the compiled build only
(``_plain_delta`` rule 7): the same signature and answers as the pure function."""

def plain_blocks(raw: bytes, prefix: bytes, suffix: bytes, longest: int, event_tail: bytes,
                 /) -> tuple[list[str], tuple[bytes | None, ...]] | None: ...
