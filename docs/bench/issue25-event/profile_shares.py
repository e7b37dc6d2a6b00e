"""Total share (the frame anywhere on the stack) of the per-event frames issue 25 item 3
touched, in the before and after profiles: python profile_shares.py BEFORE AFTER."""
import sys

FRAMES = ["parse_chunk (gateway/upstream/_chunks.py)",
          "Translator.feed (gateway/pipeline/_translate.py)",
          "Translator.feed_encoded (gateway/pipeline/_translate.py)",
          "encode_event (gateway/profile/_events.py)",
          "token_count (gateway/pipeline/_translate.py)",
          "FlowControl.active (gateway/nnrp/_flow.py)",
          "Operation.emit (gateway/server/_operation.py)",
          "ChunkStream.__anext__ (gateway/upstream/_stream.py)"]


def shares(path: str) -> dict[str, float]:
    total, on = 0, dict.fromkeys(FRAMES, 0)
    for line in open(path):
        stack, count = line.rsplit(" ", 1)
        frames = set(stack.split(";"))
        total += int(count)
        for frame in FRAMES:
            if frame in frames:
                on[frame] += int(count)
    return {frame: 100 * n / total for frame, n in on.items()}


before, after = shares(sys.argv[1]), shares(sys.argv[2])
print(f"| frame (total share) | before | after |\n|---|---:|---:|")
for frame in FRAMES:
    print(f"| `{frame.split(' ')[0]}` | {before[frame]:.1f} % | {after[frame]:.1f} % |")
