"""Copying whole KV blocks between paged caches: one launch over a table of rows.

Design decisions:

- A paged cache is many tensors (K and V per layer; dim 0: block), so moving n blocks
  tensor by tensor costs 2 x layers x runs copies: 64 launches for an 8k-token prompt of
  Llama-3.1-8B's shape, and a gather plus a scatter per tensor once the blocks are
  scattered (measured on the H200: 29% and 13% of a device copy of the same bytes).
  ``copy_blocks`` plans the copy as rows instead: one row per tensor and block, each a
  block of one tensor (the same bytes for every tensor of a cache), and one Triton
  kernel (``block_copy_kernel``) copies every row: one launch whatever the layout.
- ``row_table`` is the plan, pure arithmetic on addresses (checked on a CPU): a row is an
  offset pair from one base address per side (the first tensor's), in words. Where the
  tensors lie (``BlockLayout``) is found once per pair of caches and reused: walking 128
  tensors in Python took 0.8 ms on the H200, more than the 1 GiB copy's launch. The word
  is 4, 2 or 1 bytes, the widest that divides every address and the row's size, and the
  kernel is told the offsets' common factor (up to 16 bytes), so on a cache of aligned
  tensors its loads and stores are 16 bytes wide.
- The fused copy runs on a stream of its own and waits only for it: a device-wide
  synchronise would also wait for whatever the engine's thread has queued meanwhile (a
  whole prefill step). So the sources' writes must be finished when it is called; the
  engine's are (a step ends by reading its sampled tokens back).
- ``launch_blocks`` returns as soon as the copy is queued (a ``BlockCopy`` whose event
  marks its end), so a caller on an event loop launches there and waits for the event in
  a thread while the GPU copies: the thread hop overlaps the copy instead of preceding it.
  With a layout, the kernel computes each row's offsets itself from the block ids and the
  tensors' starts (kept on the device per layout): one upload of the ids from pinned
  memory and one launch, no torch ops on the device before it (building the rows there
  took two adds and their views: 0.3 ms per transfer on the H200 host, the launch
  included), no table of rows x 8 bytes built by numpy and uploaded per transfer, and no
  walk over the tensors. ``BlockLayout.rows`` still plans the explicit table (tests,
  ``copy_rows``).
- Every row's block id is checked against its tensor's length first: the kernel writes
  through raw addresses, so an id past the end would land in someone else's memory.
- Without CUDA or Triton (CPU engines, tests), or with tensors on several devices, the
  blocks are copied tensor by tensor as before: slices per run of consecutive blocks,
  one gather per tensor when fragmented.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import torch

MAX_RUNS_AS_SLICES = 64  # per-tensor path: more runs than this, one gather per tensor
MAX_ALIGN_BYTES = 16  # the widest load the kernel is promised


@dataclass(frozen=True)
class RowTable:
    """One launch's work: row i moves ``row_words`` words from ``src_base + src_offsets[i]
    words`` to ``dst_base + dst_offsets[i] words``; every offset is a multiple of
    ``align_words``. Rows run tensor by tensor, block by block."""

    src_base: int
    dst_base: int
    src_offsets: torch.Tensor  # int64, on the CPU or on the device of the copy
    dst_offsets: torch.Tensor
    word_bytes: int  # 4, 2 or 1
    row_words: int
    align_words: int

    @property
    def rows(self) -> int:
        return int(self.src_offsets.numel())

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_words * self.word_bytes


def block_runs(src_ids: Sequence[int], dst_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(source start, destination start, length) of runs consecutive on both sides."""
    if len(src_ids) != len(dst_ids):
        raise ValueError(f"{len(src_ids)} source blocks for {len(dst_ids)} destination blocks")
    runs: list[tuple[int, int, int]] = []
    for src, dst in zip(src_ids, dst_ids, strict=True):
        if runs and runs[-1][0] + runs[-1][2] == src and runs[-1][1] + runs[-1][2] == dst:
            start_src, start_dst, length = runs[-1]
            runs[-1] = (start_src, start_dst, length + 1)
        else:
            runs.append((src, dst, 1))
    return runs


def check_caches(sources: Sequence[torch.Tensor], destinations: Sequence[torch.Tensor]) -> None:
    """``ValueError`` unless both sides hold the same tensors' kind, pairwise."""
    if len(sources) != len(destinations):
        raise ValueError(f"{len(sources)} cache tensors here, {len(destinations)} there")
    for src, dst in zip(sources, destinations, strict=True):
        if src.shape[1:] != dst.shape[1:] or src.dtype != dst.dtype:
            raise ValueError(
                f"cache blocks differ: {src.dtype}{list(src.shape[1:])} here, "
                f"{dst.dtype}{list(dst.shape[1:])} there"
            )


@dataclass(frozen=True, eq=False)
class BlockLayout:
    """Where the tensors of two caches lie, found once per pair of caches (the Python
    walk over 2 x 64 tensors costs more than the copy it plans; ``rows`` then only
    turns block ids into offsets)."""

    sources: tuple[torch.Tensor, ...]  # held: the addresses stay theirs
    destinations: tuple[torch.Tensor, ...]
    src_starts: np.ndarray  # int64 words from the first tensor's address, per tensor
    dst_starts: np.ndarray
    src_blocks: int  # the shortest tensor's blocks: ids must stay below
    dst_blocks: int
    row_bytes: int
    word_bytes: int  # 4, 2 or 1
    align_words: int
    fused_on: torch.device | None  # the one CUDA device of every tensor, with Triton
    _device_starts: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, repr=False
    )

    @classmethod
    def of(
        cls, sources: Sequence[torch.Tensor], destinations: Sequence[torch.Tensor]
    ) -> BlockLayout | None:
        """None when the caches do not fit one table (a tensor that is not contiguous,
        or blocks of different sizes across tensors); ``ValueError`` for caches that
        differ pairwise."""
        check_caches(sources, destinations)
        tensors = [*sources, *destinations]
        if not tensors or not all(t.dim() >= 1 and t.is_contiguous() for t in tensors):
            return None
        row_bytes = {t.stride(0) * t.element_size() for t in tensors}
        if len(row_bytes) != 1:
            return None
        (row,) = row_bytes
        addresses = [t.data_ptr() for t in tensors]
        common = math.gcd(row, *addresses)
        word = 4 if common % 4 == 0 else 2 if common % 2 == 0 else 1
        n = len(sources)
        return cls(
            sources=tuple(sources),
            destinations=tuple(destinations),
            src_starts=np.array([(a - addresses[0]) // word for a in addresses[:n]], np.int64),
            dst_starts=np.array([(a - addresses[n]) // word for a in addresses[n:]], np.int64),
            src_blocks=min(t.shape[0] for t in sources),
            dst_blocks=min(t.shape[0] for t in destinations),
            row_bytes=row,
            word_bytes=word,
            align_words=math.gcd(common, MAX_ALIGN_BYTES) // word,
            fused_on=sources[0].device if _fusable(sources, destinations) else None,
        )

    def fits(self, sources: Sequence[torch.Tensor], destinations: Sequence[torch.Tensor]) -> bool:
        """True when these are the very tensors the layout was found for."""
        return (
            len(sources) == len(self.sources)
            and len(destinations) == len(self.destinations)
            and all(map(operator.is_, sources, self.sources))
            and all(map(operator.is_, destinations, self.destinations))
        )

    def rows(
        self, src_ids: Sequence[int], dst_ids: Sequence[int], device: torch.device | None = None
    ) -> RowTable:
        """The rows that copy ``src_ids`` of every source into ``dst_ids`` of its
        destination; ``ValueError`` for an id outside its tensor. With ``device``, the
        offsets are computed there, on the current stream (module docstring)."""
        ids = self.checked_ids(src_ids, dst_ids)
        n = len(src_ids)
        row_words = self.row_words
        ids *= row_words
        if device is None:
            src_offsets = _offsets(self.src_starts, ids[:n])
            dst_offsets = _offsets(self.dst_starts, ids[n:])
        else:
            src_offsets, dst_offsets = self._device_offsets(device, ids)
        return RowTable(
            src_base=self.sources[0].data_ptr(),
            dst_base=self.destinations[0].data_ptr(),
            src_offsets=src_offsets,
            dst_offsets=dst_offsets,
            word_bytes=self.word_bytes,
            row_words=row_words,
            align_words=self.align_words,
        )

    @property
    def row_words(self) -> int:
        return self.row_bytes // self.word_bytes

    def checked_ids(self, src_ids: Sequence[int], dst_ids: Sequence[int]) -> np.ndarray:
        """Both sides' ids in one int64 array (the sources', then the destinations');
        ``ValueError`` for an id outside its tensor (the kernel writes through raw
        addresses: an id past the end would land in someone else's memory)."""
        if len(src_ids) != len(dst_ids):
            raise ValueError(f"{len(src_ids)} source blocks for {len(dst_ids)} destination blocks")
        # Checked in numpy: min/max of Python lists cost more than the whole launch.
        ids = np.fromiter((*src_ids, *dst_ids), np.int64, 2 * len(src_ids))
        n = len(src_ids)
        for side, blocks in ((ids[:n], self.src_blocks), (ids[n:], self.dst_blocks)):
            if side.size and (side.min() < 0 or side.max() >= blocks):
                raise ValueError(
                    f"block ids {side.min()}..{side.max()} for caches of {blocks} blocks"
                )
        return ids

    def starts_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each tensor's start in words from its side's first tensor, on ``device``
        (uploaded once per layout and device)."""
        starts = self._device_starts.get(device)
        if starts is None:
            src, dst = (torch.from_numpy(s).to(device) for s in (self.src_starts, self.dst_starts))
            starts = self._device_starts[device] = (src, dst)
        return starts

    def _device_offsets(
        self, device: torch.device, words: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``_offsets`` of both sides on ``device`` (``words``: the source blocks' words,
        then the destination's), computed there."""
        src, dst = self.starts_on(device)
        blocks = torch.from_numpy(words).to(device, non_blocking=True).unsqueeze(0)
        n = len(words) // 2
        return (
            (src.unsqueeze(1) + blocks[:, :n]).view(-1),
            (dst.unsqueeze(1) + blocks[:, n:]).view(-1),
        )


def row_table(
    sources: Sequence[torch.Tensor],
    src_ids: Sequence[int],
    destinations: Sequence[torch.Tensor],
    dst_ids: Sequence[int],
) -> RowTable | None:
    """``BlockLayout.of(sources, destinations).rows(src_ids, dst_ids)``, or None when
    the caches do not fit one table."""
    layout = BlockLayout.of(sources, destinations)
    return None if layout is None else layout.rows(src_ids, dst_ids)


def _offsets(starts: np.ndarray, blocks: np.ndarray) -> torch.Tensor:
    """Words from the first tensor's address to each (tensor, block) row, tensor-major
    (``blocks``: each block's words from its tensor's start; numpy: a tenth of torch's
    cost on arrays this small)."""
    return torch.from_numpy(np.add.outer(starts, blocks).ravel())


@dataclass(frozen=True, eq=False)
class BlockCopy:
    """A block copy under way (``launch_blocks``): ``wait`` returns once it is done."""

    layout: BlockLayout | None  # the layout it used (None: tensor by tensor)
    done: torch.cuda.Event | None = None  # recorded after the launch; None: done already

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()  # type: ignore[no-untyped-call]


def launch_blocks(
    sources: Sequence[torch.Tensor],
    src_ids: Sequence[int],
    destinations: Sequence[torch.Tensor],
    dst_ids: Sequence[int],
    layout: BlockLayout | None = None,
) -> BlockCopy:
    """Queues the copy of blocks ``src_ids`` of every source into ``dst_ids`` of its
    destination: one fused launch on a GPU (module docstring), returning at once; tensor
    by tensor elsewhere, returning when it is done. Pass the returned layout again with
    the same caches."""
    if layout is None or not layout.fits(sources, destinations):
        layout = BlockLayout.of(sources, destinations) if _fusable(sources, destinations) else None
    if layout is None or layout.fused_on is None:
        copy_blocks_per_tensor(sources, src_ids, destinations, dst_ids)
        return BlockCopy(None)
    ids = layout.checked_ids(src_ids, dst_ids)
    device = layout.fused_on
    with _on_copy_stream(device):
        if ids.size:
            src_starts, dst_starts = layout.starts_on(device)
            # Pinned (the host allocator's cache): the upload is queued, not waited for,
            # and the buffer is not reused before the copy stream has read it.
            on_device = torch.from_numpy(ids).pin_memory().to(device, non_blocking=True)
            _kernels().launch_ids(
                sources[0], destinations[0], src_starts, dst_starts, on_device,
                layout.word_bytes, layout.row_words, layout.align_words,
            )  # fmt: skip
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record()
    return BlockCopy(layout, done)


def copy_blocks(
    sources: Sequence[torch.Tensor],
    src_ids: Sequence[int],
    destinations: Sequence[torch.Tensor],
    dst_ids: Sequence[int],
    layout: BlockLayout | None = None,
) -> BlockLayout | None:
    """``launch_blocks``, then waits until the copy is finished; returns the layout it
    used (None: tensor by tensor), for the caller to pass again with the same caches."""
    started = launch_blocks(sources, src_ids, destinations, dst_ids, layout)
    started.wait()
    return started.layout


def _fusable(sources: Sequence[torch.Tensor], destinations: Sequence[torch.Tensor]) -> bool:
    """One CUDA device holds every tensor (an IPC-opened cache of the same GPU counts),
    and Triton is there."""
    if not sources or sources[0].device.type != "cuda":
        return False
    device = sources[0].device
    return all(t.device == device for t in (*sources, *destinations)) and _kernel() is not None


def copy_rows(table: RowTable, src_base: torch.Tensor, dst_base: torch.Tensor) -> None:
    """Runs ``table`` in one launch on ``src_base``'s device, on a stream of its own, and
    returns when it is done; the bases are the tensors at the table's base addresses."""
    device = src_base.device
    with torch.cuda.device(device), torch.cuda.stream(_copy_stream(device)):
        done = _launch_on_current_stream(table, src_base, dst_base)
    done.synchronize()  # type: ignore[no-untyped-call]


def _launch_on_current_stream(
    table: RowTable, src_base: torch.Tensor, dst_base: torch.Tensor
) -> torch.cuda.Event:
    """Launches ``table`` on the current stream; the event recorded after it."""
    kernel = _kernel()
    if kernel is None or (src_base.data_ptr(), dst_base.data_ptr()) != (
        table.src_base,
        table.dst_base,
    ):
        raise ValueError("copy_rows needs CUDA, Triton and the table's own base tensors")
    if table.rows:
        device = src_base.device
        src_offsets = table.src_offsets.to(device, non_blocking=True)
        dst_offsets = table.dst_offsets.to(device, non_blocking=True)
        kernel(table, src_base, dst_base, src_offsets, dst_offsets)
    done = torch.cuda.Event()  # type: ignore[no-untyped-call]
    done.record()
    return done


@cache
def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


@contextmanager
def _on_copy_stream(device: torch.device) -> Iterator[None]:
    """Makes ``device``'s copy stream (and so the device) current in this thread, and
    the previous stream (and its device) again after: what ``torch.cuda.device`` and
    ``torch.cuda.stream`` do together, with a few calls instead of their device-index
    and stream lookups (prominent in the launch's profile on the H200 host,
    ``bench/results/disagg-ipc-launch-h200.json``)."""
    previous = torch.cuda.current_stream()
    torch.cuda.set_stream(_copy_stream(device))  # sets the stream's device current too
    try:
        yield
    finally:
        torch.cuda.set_stream(previous)


@cache
def _kernels() -> Any:
    """The module ``block_copy_kernel`` (its launchers), or None without CUDA or Triton."""
    if not torch.cuda.is_available():
        return None
    try:
        from dynask.kv.gpu import block_copy_kernel
    except ImportError:
        return None
    return block_copy_kernel


def _kernel() -> Any:
    """The launcher of the row kernel, or None without CUDA or Triton."""
    kernels = _kernels()
    return None if kernels is None else kernels.launch


def copy_blocks_per_tensor(
    sources: Sequence[torch.Tensor],
    src_ids: Sequence[int],
    destinations: Sequence[torch.Tensor],
    dst_ids: Sequence[int],
) -> None:
    """Copies blocks tensor by tensor (slices per run, or one gather when fragmented) on
    the current stream and waits until the copies finished."""
    check_caches(sources, destinations)
    runs = block_runs(src_ids, dst_ids)
    gather = len(runs) > MAX_RUNS_AS_SLICES
    if gather:  # the indices go to the devices once, not once per tensor
        src_index = torch.tensor(list(src_ids), device=sources[0].device)
        dst_index = torch.tensor(list(dst_ids), device=destinations[0].device)
    for src, dst in zip(sources, destinations, strict=True):
        if gather:  # rows of whole blocks: one gather and one scatter per tensor
            rows = src.view(src.shape[0], -1).index_select(0, src_index)
            dst.view(dst.shape[0], -1).index_copy_(0, dst_index, rows.to(dst.device))
        else:
            for s, d, n in runs:
                dst[d : d + n].copy_(src[s : s + n], non_blocking=True)
    for tensor in (*sources[:1], *destinations[:1]):
        if tensor.device.type == "cuda":
            torch.cuda.synchronize(tensor.device)
