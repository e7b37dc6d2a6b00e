"""Markdown as the documentation tests read it: its links (outside code) and GitHub's
heading anchors."""

from __future__ import annotations

import re

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# [text](target) and ![alt](target), an optional "title" after the target.
_INLINE_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The text outside fenced code blocks (a link there is an example, not a link)."""
    return _FENCE.sub("", text)


def links(text: str) -> list[str]:
    outside = CODE_SPAN.sub("", prose(text))
    return _INLINE_LINK.findall(outside) + _REFERENCE_LINK.findall(outside)


def anchors(text: str) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but '-' and '_' dropped, spaces to '-',
    a repeated id numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(prose(text)):
        plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", plain.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out
