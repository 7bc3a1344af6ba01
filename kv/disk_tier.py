"""The disk tier: KV blocks in a folder, one file per block, bounded in bytes.

Design decisions:

- A file is named by the block's sequence hash (``<hash as 16 hex digits>.kvblock``) in
  a subfolder named by the engine's *layout key* (model, dtype, KV shape): two models
  that share a folder never read each other's KV, whose hashes only depend on tokens.
- A file is written to a temporary name in the same folder and renamed into place
  (``os.replace``), so a reader (or a restart) sees a whole file or none.
- A file holds a fixed magic, a JSON header (hash, parent hash, tokens, dtype, shape,
  payload length, xxh3-64 of the payload) and the payload. The header alone is read at
  start-up to rebuild the index (so the tier survives a restart); every read checks the
  whole file — name, hash, tokens, dtype, shape, length, checksum — and a file that fails
  any check is deleted and reported as a miss: it is recomputed, never served.
- LRU by last use; a restart orders the files by modification time, which a read
  refreshes. Eviction deletes files until the new one fits in ``capacity_bytes``.
- Writes and reads are synchronous, on the engine thread. A write that fails (disk
  full) is logged and counted; the block is simply not kept.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xxhash

from dynask.kv.block_pool import CachedBlock
from dynask.kv.hashing import SequenceHash
from dynask.kv.tier import KVTier

log = logging.getLogger(__name__)

MAGIC = b"DYNASKKV"
VERSION = 1
SUFFIX = ".kvblock"
_PREFIX = struct.Struct("<8sII")  # magic, version, header length


class CorruptBlockFile(ValueError):
    """A block file failed a check; the message says which."""


@dataclass(slots=True)
class _FileEntry:
    block: CachedBlock
    nbytes: int


class DiskTier:
    """KV blocks as files under ``folder/<layout key>``, at most ``capacity_bytes``."""

    tier = KVTier.DISK

    def __init__(
        self,
        folder: Path,
        capacity_bytes: int,
        block_shape: Sequence[int],
        dtype: torch.dtype,
        layout_key: str,
    ) -> None:
        if capacity_bytes < 1:
            raise ValueError(f"DiskTier capacity_bytes must be >= 1, got {capacity_bytes!r}")
        self.block_shape = tuple(block_shape)
        self.dtype = dtype
        self.capacity_bytes = capacity_bytes
        key = f"{layout_key}|{list(self.block_shape)}|{dtype}"
        self.folder = Path(folder) / xxhash.xxh3_64_hexdigest(key.encode())
        self.folder.mkdir(parents=True, exist_ok=True)
        self.corrupt_blocks = 0
        self.failed_writes = 0
        self._files: OrderedDict[SequenceHash, _FileEntry] = OrderedDict()
        self._nbytes = 0
        self._scan()

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block's payload."""
        return torch.Size(self.block_shape).numel() * self.dtype.itemsize

    @property
    def capacity_blocks(self) -> int:
        """About how many block files fit (headers included)."""
        return self.capacity_bytes // (self.block_nbytes + 512)

    @property
    def nbytes(self) -> int:
        """Bytes of the block files held."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._files)

    def holds(self, block_hash: SequenceHash, token_ids: Sequence[int]) -> bool:
        """Whether a file for this hash with exactly these tokens is indexed."""
        entry = self._files.get(block_hash)
        return entry is not None and entry.block.token_ids == tuple(token_ids)

    def blocks(self) -> list[CachedBlock]:
        """Every block held, least recently used first."""
        return [entry.block for entry in self._files.values()]

    def write(self, block: CachedBlock, kv: torch.Tensor) -> list[CachedBlock]:
        """Writes ``block``'s file atomically; returns the blocks evicted to make room."""
        if block.block_hash in self._files:
            self._files.move_to_end(block.block_hash)
            return []
        data = _encode(block, kv.detach().to("cpu", self.dtype).contiguous())
        if len(data) > self.capacity_bytes:
            return []  # a block larger than the whole tier: not kept
        evicted = []
        while self._files and self._nbytes + len(data) > self.capacity_bytes:
            evicted.append(self._delete_oldest())
        temporary = self.folder / f".tmp-{uuid.uuid4().hex}"
        try:
            temporary.write_bytes(data)
            os.replace(temporary, self._path(block.block_hash))
        except OSError as exc:  # a full or broken disk loses the block, not the request
            log.warning("cannot write KV block file in %s (%s); block not kept", self.folder, exc)
            self.failed_writes += 1
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            return evicted
        self._files[block.block_hash] = _FileEntry(_as_disk(block), len(data))
        self._nbytes += len(data)
        return evicted

    def read(self, block_hash: SequenceHash, token_ids: Sequence[int]) -> torch.Tensor | None:
        """The block's KV (``block_shape``, on the CPU), or None if missing or corrupt.

        A corrupt or truncated file is deleted, counted in ``corrupt_blocks`` and logged.
        """
        if block_hash not in self._files:
            return None
        try:
            loaded: torch.Tensor | Exception = self.load(block_hash, token_ids)
        except (OSError, CorruptBlockFile) as exc:
            loaded = exc
        return self.settle(block_hash, loaded)

    def load(self, block_hash: SequenceHash, token_ids: Sequence[int]) -> torch.Tensor:
        """Reads and checks the block's file; touches nothing else, so any thread may call it.

        Raises ``OSError`` or ``CorruptBlockFile``; pass the outcome to ``settle``.
        """
        return self._decode(self._path(block_hash).read_bytes(), block_hash, tuple(token_ids))

    def settle(
        self, block_hash: SequenceHash, loaded: torch.Tensor | Exception
    ) -> torch.Tensor | None:
        """Applies a ``load``'s outcome: marks the block used, or drops a bad file (None)."""
        path = self._path(block_hash)
        if block_hash not in self._files:
            return None  # evicted (and deleted) while it was read
        if isinstance(loaded, Exception):
            log.warning("KV block file %s is unusable (%s); dropped, will recompute", path, loaded)
            self.corrupt_blocks += 1
            self._forget(block_hash)
            path.unlink(missing_ok=True)
            return None
        self._files.move_to_end(block_hash)
        with contextlib.suppress(OSError):
            os.utime(path)  # keeps the LRU order across a restart
        return loaded

    def _decode(
        self, data: bytes, block_hash: SequenceHash, token_ids: tuple[int, ...]
    ) -> torch.Tensor:
        header, payload = _split(data)
        if header.get("hash") != block_hash:
            raise CorruptBlockFile(f"holds hash {header.get('hash')!r}, not {block_hash}")
        if tuple(header.get("tokens", ())) != token_ids:
            raise CorruptBlockFile("holds other tokens than the block's")
        if header.get("dtype") != str(self.dtype) or header.get("shape") != list(self.block_shape):
            raise CorruptBlockFile(f"holds {header.get('dtype')} {header.get('shape')}")
        if xxhash.xxh3_64_intdigest(payload) != header.get("checksum"):
            raise CorruptBlockFile("payload checksum mismatch")
        raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        return raw.view(self.dtype).reshape(self.block_shape)

    def _scan(self) -> None:
        found = []
        for path in self.folder.iterdir():
            if path.name.startswith(".tmp-"):
                path.unlink(missing_ok=True)  # a write cut short by a crash
            elif path.suffix == SUFFIX:
                entry = self._read_header(path)
                if entry is not None:
                    found.append((path.stat().st_mtime_ns, entry))
        for _, entry in sorted(found, key=lambda item: item[0]):
            self._files[entry.block.block_hash] = entry
            self._nbytes += entry.nbytes
        while self._files and self._nbytes > self.capacity_bytes:
            self._delete_oldest()

    def _read_header(self, path: Path) -> _FileEntry | None:
        try:
            with path.open("rb") as file:
                magic, version, length = _PREFIX.unpack(file.read(_PREFIX.size))
                header = json.loads(file.read(length)) if magic == MAGIC else {}
            block = _header_block(header)
            expected = _PREFIX.size + length + int(header["payload_bytes"])
            if version != VERSION or path.name != _file_name(block.block_hash):
                raise CorruptBlockFile(f"version {version} or name does not match its header")
            if path.stat().st_size != expected:
                raise CorruptBlockFile(f"{path.stat().st_size} bytes, expected {expected}")
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            log.warning("KV block file %s is unusable (%s); dropped", path, exc)
            self.corrupt_blocks += 1
            path.unlink(missing_ok=True)
            return None
        return _FileEntry(block, expected)

    def _delete_oldest(self) -> CachedBlock:
        block_hash = next(iter(self._files))
        block = self._files[block_hash].block
        self._forget(block_hash)
        self._path(block_hash).unlink(missing_ok=True)
        return block

    def _forget(self, block_hash: SequenceHash) -> None:
        entry = self._files.pop(block_hash)
        self._nbytes -= entry.nbytes

    def _path(self, block_hash: SequenceHash) -> Path:
        return self.folder / _file_name(block_hash)


def _file_name(block_hash: SequenceHash) -> str:
    return f"{block_hash:016x}{SUFFIX}"


def _encode(block: CachedBlock, kv: torch.Tensor) -> bytes:
    payload = kv.view(torch.uint8).numpy().tobytes()
    header = {
        "hash": block.block_hash,
        "parent": block.parent_hash,
        "tokens": list(block.token_ids),
        "dtype": str(kv.dtype),
        "shape": list(kv.shape),
        "payload_bytes": len(payload),
        "checksum": xxhash.xxh3_64_intdigest(payload),
    }
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return _PREFIX.pack(MAGIC, VERSION, len(encoded)) + encoded + payload


def _split(data: bytes) -> tuple[dict[str, Any], bytes]:
    if len(data) < _PREFIX.size:
        raise CorruptBlockFile(f"only {len(data)} bytes")
    magic, version, length = _PREFIX.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise CorruptBlockFile(f"bad magic {magic!r} or version {version}")
    try:
        header = json.loads(data[_PREFIX.size : _PREFIX.size + length])
    except ValueError as exc:
        raise CorruptBlockFile(f"unreadable header ({exc})") from None
    if not isinstance(header, dict):
        raise CorruptBlockFile("header is not an object")
    payload = data[_PREFIX.size + length :]
    if len(payload) != header.get("payload_bytes"):
        raise CorruptBlockFile(f"payload has {len(payload)} bytes, header says otherwise")
    return header, payload


def _header_block(header: dict[str, Any]) -> CachedBlock:
    parent = header.get("parent")
    return CachedBlock(
        SequenceHash(int(header["hash"])),
        None if parent is None else SequenceHash(int(parent)),
        tuple(int(t) for t in header["tokens"]),
        KVTier.DISK,
    )


def _as_disk(block: CachedBlock) -> CachedBlock:
    return CachedBlock(block.block_hash, block.parent_hash, block.token_ids, KVTier.DISK)
