"""Media delivery's parts alone (gateway/pipeline/_media.py): base64 in slices, the body
spliced without passing media through json.dumps, the media directory's checks."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest
import trio
from hypothesis import given, strategies as st

from gateway import nnrp
from gateway.errors import ConfigError
from gateway.pipeline import MediaDelivery, MediaDirectory
from gateway.pipeline._media import (
    ENCODE_SLICE,
    FILE_PREFIX,
    GROW_STEP,
    encode_base64,
    encode_body,
)
from gateway.profile import MediaFrame, MediaPlan, MediaSlot, ProfileError

PNG = b"\x89PNG\r\n\x1a\n" + os.urandom(100)


@pytest.mark.parametrize("size", [0, 1, ENCODE_SLICE - 1, ENCODE_SLICE, ENCODE_SLICE + 1,
                                  3 * ENCODE_SLICE + 2])
async def test_base64_in_slices_is_the_whole_encoding(size: int) -> None:
    data = os.urandom(size)
    assert b"".join(await encode_base64(data)) == base64.b64encode(data)


async def test_a_big_encoding_yields_to_other_tasks_between_slices() -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.lowlevel.checkpoint()  # the ticker has run once
        before = ticks
        await encode_base64(bytes(8 * ENCODE_SLICE))
        nursery.cancel_scope.cancel()
    assert ticks - before >= 7  # it ran between the slices, not only after them


@given(st.dictionaries(st.text(max_size=5), st.text(max_size=20), max_size=4),
       st.lists(st.binary(max_size=50), min_size=1, max_size=14))
def test_the_spliced_body_is_the_json_of_the_body_with_the_values(
        extra: dict[str, str], values: list[bytes]) -> None:
    placeholders = [f"nnrp-media-nonce-{index}" for index in range(len(values))]
    body = {"model": "m", "extra": extra, "parts": [{"url": p} for p in placeholders]}
    pieces = {p: [b"data:x/y;base64,", base64.b64encode(v)] for p, v in zip(
        placeholders, values, strict=True)}
    decoded = json.loads(b"".join(encode_body(body, pieces)))
    assert decoded["extra"] == extra
    assert [part["url"] for part in decoded["parts"]] == [
        "data:x/y;base64," + base64.b64encode(v).decode() for v in values]


def test_a_placeholder_is_never_taken_for_a_longer_one() -> None:
    """Twelve: ``...-1`` is a prefix of ``...-10`` (a review found the tenth part given
    the first's bytes and a trailing digit)."""
    placeholders = [f"nnrp-media-5eed-{index}" for index in range(12)]
    body = {"parts": placeholders, "text": "nnrp-media-other-1 is the client's text"}
    encoded = encode_body(body, {p: [f"value{index}".encode()] for index, p in
                                 enumerate(placeholders)})
    assert json.loads(b"".join(encoded)) == {"parts": [f"value{index}" for index in range(12)],
                                   "text": "nnrp-media-other-1 is the client's text"}


def test_without_replacements_the_body_is_plain_json() -> None:
    assert encode_body({"a": "é"}, {}) == (json.dumps({"a": "é"}).encode(),)


def test_the_directory_must_exist_and_be_writable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        MediaDirectory(tmp_path / "missing").prepare()
    (tmp_path / "a-file").write_bytes(b"")
    with pytest.raises(ConfigError, match="not a directory"):
        MediaDirectory(tmp_path / "a-file").prepare()
    # Root writes through permission bits; /proc/self is a directory no one can write in.
    with pytest.raises(ConfigError, match="not writable"):
        MediaDirectory(Path("/proc/self")).prepare()


def test_prepare_sweeps_only_its_own_leftovers(tmp_path: Path) -> None:
    (tmp_path / f"{FILE_PREFIX}1.png").write_bytes(b"x")
    (tmp_path / f"{FILE_PREFIX}2").write_bytes(b"y")
    (tmp_path / "keep.png").write_bytes(b"z")
    assert MediaDirectory(tmp_path).prepare() == 2
    assert [p.name for p in tmp_path.iterdir()] == ["keep.png"]
    assert MediaDirectory(tmp_path).prepare() == 0


def test_a_worker_sweeps_only_its_own_files(tmp_path: Path) -> None:
    """A worker the supervisor restarts must not take a live sibling's files from vLLM."""
    one = MediaDirectory(tmp_path, worker=1).write(PNG, "image/png")
    zero = MediaDirectory(tmp_path, worker=0).write(PNG, "image/png")
    single = MediaDirectory(tmp_path).write(PNG, "image/png")
    assert one.name.startswith(f"{FILE_PREFIX}w1-") and zero.name.startswith(f"{FILE_PREFIX}w0-")
    assert MediaDirectory(tmp_path, worker=1).prepare() == 1
    assert not one.exists() and zero.exists() and single.exists()
    assert MediaDirectory(tmp_path, worker=0).prepare() == 2  # its own, and a single run's
    assert list(tmp_path.iterdir()) == []


def test_a_written_file_holds_the_bytes_and_is_not_world_readable(tmp_path: Path) -> None:
    path = MediaDirectory(tmp_path).write(PNG, "image/png")
    assert path.read_bytes() == PNG
    assert path.name.startswith(FILE_PREFIX) and path.suffix == ".png"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert MediaDirectory(tmp_path).write(b"?", "application/x-thing").suffix == ".bin"


async def test_delivery_writes_each_frame_once_and_removes_it_on_any_exit(tmp_path: Path
                                                                         ) -> None:
    plan = MediaPlan((MediaFrame(1, 0x40, PNG),),
                     (MediaSlot("nnrp-media-n-0", 1, "image/png", False),
                      MediaSlot("nnrp-media-n-1", 1, "image/png", False),
                      MediaSlot("nnrp-media-n-2", 1, "audio/wav", True)))
    body = {"a": "nnrp-media-n-0", "b": "nnrp-media-n-1", "c": "nnrp-media-n-2"}
    delivery = MediaDelivery(MediaDirectory(tmp_path))
    assert delivery.mode == "file"

    async def exchange() -> None:
        async with delivery.deliver(plan, body) as content:
            assert content is not None
            sent = json.loads(b"".join(content))
            (written,) = _files(tmp_path)
            assert sent["a"] == sent["b"] == written.as_uri()
            assert base64.b64decode(sent["c"]) == PNG  # input_audio stays inline
            raise RuntimeError("vLLM went away")

    with pytest.raises(RuntimeError, match="vLLM went away"):
        await exchange()
    assert _files(tmp_path) == []


def _files(directory: Path) -> list[Path]:
    return list(directory.iterdir())


async def test_data_uri_delivery_and_a_plan_without_slots() -> None:
    delivery = MediaDelivery()
    assert delivery.mode == "data_uri"
    async with delivery.deliver(MediaPlan(), {"a": 1}) as content:
        assert content is None  # the client encodes the body as ever
    plan = MediaPlan((MediaFrame(1, 0x40, PNG),),
                     (MediaSlot("nnrp-media-n-0", 1, "image/png", False),))
    async with delivery.deliver(plan, {"url": "nnrp-media-n-0"}) as content:
        assert content is not None
        url = json.loads(b"".join(content))["url"]
    assert url == "data:image/png;base64," + base64.b64encode(PNG).decode()


async def test_the_directory_holds_at_most_its_capacity_and_gives_it_back(tmp_path: Path
                                                                         ) -> None:
    """A request whose files would pass it is refused before anything is written (a full
    emptyDir evicts the pod); what a request held is given back when it ends."""
    plan = MediaPlan((MediaFrame(1, 0x40, PNG),),
                     (MediaSlot("nnrp-media-n-0", 1, "image/png", False),
                      MediaSlot("nnrp-media-n-1", 1, "image/png", False)))
    directory = MediaDirectory(tmp_path, capacity=len(PNG) + 10)
    delivery = MediaDelivery(directory)
    async with delivery.deliver(plan, {"a": "nnrp-media-n-0", "b": "nnrp-media-n-1"}):
        assert directory.used == len(PNG)  # one file for the frame, named twice
        with pytest.raises(ProfileError) as info:
            async with delivery.deliver(plan, {"a": "nnrp-media-n-0"}):
                pass
        assert info.value.code == "scheduler_rejected"
        assert info.value.retry_after_ms == 1000
        assert len(_files(tmp_path)) == 1
    assert directory.used == 0 and _files(tmp_path) == []


# ------------------------------------------------------------------ D5: spills


def test_a_spill_is_an_unlinked_file_counted_as_its_blocks_come_while_it_lives(
        tmp_path: Path) -> None:
    """D5: nothing in the directory's listing (a crash leaves nothing); its blocks, and
    its count under --media-dir-bytes, come GROW_STEP ahead of its bytes (a header
    alone costs nothing), and go with its last view."""
    import gc

    directory = MediaDirectory(tmp_path, capacity=64 << 20)
    spill = directory.spill(10 << 20)
    assert isinstance(spill, nnrp.SpillMap) and len(spill) == 10 << 20
    assert directory.spilled == 0 and list(tmp_path.iterdir()) == []
    assert spill.reserve(4)
    assert directory.spilled == GROW_STEP  # a step ahead
    assert spill.reserve(GROW_STEP) and directory.spilled == GROW_STEP
    assert spill.reserve(GROW_STEP + 1) and directory.spilled == 2 * GROW_STEP
    assert spill.reserve(10 << 20) and directory.spilled == 10 << 20  # never past it
    spill[:4] = b"\x89PNG"
    view = memoryview(spill).toreadonly()[:4]
    del spill
    gc.collect()
    assert directory.spilled == 10 << 20  # a view keeps it
    assert view == b"\x89PNG"
    view.release()
    del view
    gc.collect()
    assert directory.spilled == 0


def test_a_spill_is_made_only_with_room_for_it_and_its_frames_file_and_grows_within_it(
        tmp_path: Path) -> None:
    """D5: a spill is made where the bound has room for it and the file its frame
    becomes (D2), and grows only within the bound: a step past it is refused (the
    decoder then moves the packet into memory), and counts nothing."""
    mib = 1 << 20
    directory = MediaDirectory(tmp_path, capacity=16 * mib)
    assert directory.spill(8 * mib + 1) is None  # it fits; its file after it would not
    first = directory.spill(8 * mib)
    assert first is not None and first.reserve(8 * mib)
    second = directory.spill(4 * mib)  # a check, not a reservation: 8 + 8 <= 16
    assert second is not None
    directory.used = 5 * mib  # files in flight (D2) count too
    assert not second.reserve(4 * mib)  # 8 + 5 + 4 > 16
    assert directory.spilled == 8 * mib
    directory.used = 0
    assert second.reserve(4 * mib) and directory.spilled == 12 * mib


@pytest.mark.parametrize("failure", ["no_tmpfile", "no_room"])
def test_a_spill_on_a_directory_that_cannot_hold_it_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    """Without O_TMPFILE the file is made and unlinked at once; a disk with no room for
    a step (the blocks are allocated before the bytes: _spill S1) refuses the step,
    and counts nothing."""
    if failure == "no_tmpfile":
        monkeypatch.delattr(os, "O_TMPFILE")
    else:
        def full(fd: int, offset: int, length: int) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", full)
    directory = MediaDirectory(tmp_path)
    spill = directory.spill(1 << 20)
    assert spill is not None and list(tmp_path.iterdir()) == []
    assert spill.reserve(1 << 20) == (failure == "no_tmpfile")
    assert directory.spilled == (1 << 20 if failure == "no_tmpfile" else 0)


def test_a_frame_written_from_a_spill_is_read_a_slice_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """D2 from a spill (S3): the file holds the exact bytes, each slice's pages given
    back before the next is written."""
    monkeypatch.setattr("gateway.pipeline._media.SPILL_SLICE", 1 << 16)
    directory = MediaDirectory(tmp_path)
    data = os.urandom((1 << 18) + 5)
    spill = directory.spill(len(data) + 100)
    assert spill is not None and spill.reserve(len(spill))
    spill[100:] = data
    released: list[int] = []
    release = nnrp.SpillMap.release
    monkeypatch.setattr(nnrp.SpillMap, "release",
                        lambda self: (released.append(1), release(self))[1])
    path = directory.write(memoryview(spill).toreadonly()[100:], "image/png")
    assert path.read_bytes() == data
    assert len(released) == 5
