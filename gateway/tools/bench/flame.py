"""Collapsed stacks (a sampling profiler's output) to the shares of each frame and to a
flame graph: pure functions, no I/O, so a profile taken once can be read again, diffed
and re-drawn (``bench profile`` writes all three).

Rules:

1. The input is the collapsed-stack format (Brendan Gregg's ``stackcollapse``, py-spy's
   ``--format raw``): one line per distinct stack, its frames root first joined by ``;``,
   a space, and the number of samples. A line that is not that is an error naming it;
   blank lines are skipped. The same stack on two lines adds up. A count with no frames
   (py-spy's line for a sample in which it read no Python stack) is the stack
   ``NO_STACK``: the sample happened, so it counts.
2. A frame's **self** share is the samples in which it was the innermost frame (where the
   CPU was); its **total** share is the samples in which it was anywhere on the stack,
   counted once per sample even when it recurses. Shares are of all samples: py-spy
   records only samples of a busy thread (idle ones, waiting in epoll, are left out
   unless asked), so a share is of the time the process was on the CPU.
3. The flame graph is drawn root at the bottom, each frame as wide as its samples, the
   children of a frame sorted by name (as flamegraph.pl does, so two graphs of the same
   code line up), and a frame narrower than ``MIN_WIDTH_PX`` left out (it still counts
   in its parent's width). Colours come from a hash of the frame's file, so the same code
   has the same colour in every graph. Every rectangle carries a tooltip with its name,
   samples and share.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from html import escape

import attrs

Stacks = dict[tuple[str, ...], int]
#: The stack of a sample in which the profiler read no Python frames (rule 1).
NO_STACK = "(no Python stack)"

#: The drawing: widths in pixels, one row per stack depth.
WIDTH_PX = 1200
ROW_PX = 16
#: A frame narrower than this is not drawn (rule 3): unreadable, and it bloats the file.
MIN_WIDTH_PX = 0.3
#: Characters that fit in a pixel of the 11 px monospace label (a label is cut to fit).
_CHARS_PER_PX = 1 / 6.6


@attrs.frozen
class FrameShare:
    """One frame's samples: where it was innermost (self) and anywhere (total)."""

    frame: str
    self_samples: int
    total_samples: int
    self_share: float
    total_share: float


def parse_collapsed(text: str) -> Stacks:
    """Collapsed-stack text to stacks and their sample counts (rule 1)."""
    stacks: Stacks = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        frames, space, count = line.rpartition(" ")
        if not space or not count.isdigit():
            raise ValueError(f"line {number} is not 'frame;frame;... count': {line[:120]!r}")
        stack = tuple(frames.split(";")) if frames.strip() else (NO_STACK,)
        stacks[stack] = stacks.get(stack, 0) + int(count)
    return stacks


def to_collapsed(stacks: Stacks) -> str:
    """Stacks as collapsed-stack text, one line per stack in sorted order: two profiles
    of the same code diff line by line."""
    return "".join(f"{';'.join(stack)} {count}\n" for stack, count in sorted(stacks.items()))


def frame_shares(stacks: Stacks) -> list[FrameShare]:
    """Every frame's self and total samples and shares (rule 2), most self time first."""
    total = sum(stacks.values())
    own: dict[str, int] = {}
    anywhere: dict[str, int] = {}
    for stack, count in stacks.items():
        if not stack:
            continue
        own[stack[-1]] = own.get(stack[-1], 0) + count
        for frame in set(stack):  # once per sample, even recursing
            anywhere[frame] = anywhere.get(frame, 0) + count
    return sorted((FrameShare(frame, own.get(frame, 0), samples,
                              own.get(frame, 0) / total if total else 0.0,
                              samples / total if total else 0.0)
                   for frame, samples in anywhere.items()),
                  key=lambda share: (-share.self_samples, -share.total_samples, share.frame))


def area(frame: str) -> str:
    """Where a frame's code lives, coarsely: the gateway's unit (``gateway/upstream``,
    ``gateway/_sockio.py``), else the top-level package or module (``trio``, ``json``);
    py-spy names the file in the frame's last parentheses."""
    if frame == NO_STACK:
        return frame
    where = frame.rsplit("(", 1)[-1].rstrip(")") if "(" in frame else frame
    parts = where.split("/")
    return "/".join(parts[:2]) if parts[0] == "gateway" and len(parts) > 1 else parts[0]


def area_shares(stacks: Stacks) -> list[tuple[str, float]]:
    """Self time by ``area`` (the innermost frame's), most first: which unit the CPU was
    in."""
    total = sum(stacks.values())
    by_area: dict[str, int] = {}
    for stack, count in stacks.items():
        if stack:
            key = area(stack[-1])
            by_area[key] = by_area.get(key, 0) + count
    return sorted(((key, samples / total) for key, samples in by_area.items()),
                  key=lambda item: (-item[1], item[0]))


def top_frames_table(shares: Iterable[FrameShare], count: int = 15) -> str:
    """A Markdown table of the first ``count`` frames: self and total share."""
    lines = ["| frame | self | total |", "|---|---:|---:|"]
    for share in list(shares)[:count]:
        lines.append(f"| `{share.frame}` | {share.self_share * 100:.1f} % | "
                     f"{share.total_share * 100:.1f} % |")
    return "\n".join(lines) + "\n"


@attrs.define
class _Node:
    samples: int = 0
    children: dict[str, _Node] = attrs.Factory(dict)


def _tree(stacks: Stacks) -> _Node:
    root = _Node()
    for stack, count in stacks.items():
        root.samples += count
        node = root
        for frame in stack:
            node = node.children.setdefault(frame, _Node())
            node.samples += count
    return root


def _colour(frame: str) -> str:
    """A warm colour from the frame's file (rule 3): same code, same colour."""
    where = frame.rsplit("(", 1)[-1]
    digest = hashlib.sha1(where.encode()).digest()
    return f"rgb({205 + digest[0] % 50},{80 + digest[1] % 130},{digest[2] % 60})"


def render_svg(stacks: Stacks, title: str) -> str:
    """The flame graph of ``stacks`` as a standalone SVG document (rule 3)."""
    root = _tree(stacks)
    total = root.samples
    depth = max((len(stack) for stack in stacks), default=0)
    height = (depth + 3) * ROW_PX
    scale = WIDTH_PX / total if total else 0.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH_PX}" height="{height}" '
           f'viewBox="0 0 {WIDTH_PX} {height}" font-family="monospace" font-size="11">',
           f'<rect width="{WIDTH_PX}" height="{height}" fill="#fdfdf6"/>',
           f'<text x="{WIDTH_PX / 2}" y="{ROW_PX}" text-anchor="middle" font-size="13">'
           f'{escape(title)} ({total} samples)</text>']

    def draw(node: _Node, name: str, x: float, level: int) -> None:
        width = node.samples * scale
        y = height - (level + 1) * ROW_PX
        share = node.samples / total * 100
        label = escape(f"{name} ({node.samples} samples, {share:.1f} %)")
        out.append(f'<g><title>{label}</title><rect x="{x:.1f}" y="{y}" width="{width:.1f}" '
                   f'height="{ROW_PX - 1}" fill="{_colour(name)}"/>')
        fits = int(width * _CHARS_PER_PX)
        if fits >= 3:
            text = name if len(name) <= fits else name[:fits - 2] + ".."
            out.append(f'<text x="{x + 2:.1f}" y="{y + ROW_PX - 4}">{escape(text)}</text>')
        out.append("</g>")
        for child_name in sorted(node.children):
            child = node.children[child_name]
            if child.samples * scale >= MIN_WIDTH_PX:
                draw(child, child_name, x, level + 1)
            x += child.samples * scale

    if total:
        draw(root, "all", 0.0, 0)
    out.append("</svg>\n")
    return "\n".join(out)
