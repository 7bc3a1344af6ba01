"""Reading disk-tier blocks in the background, so other requests keep running meanwhile.

Design decisions:

- One reader thread per engine. The engine thread asks for blocks (``request``) when a
  waiting request's prefix continues on disk; the request stays waiting (the scheduler
  admits nothing past it, as when blocks run out) while running requests keep stepping.
  When every block it needs has been read, the engine is woken (``on_ready``) and the
  request is admitted with the KV already in memory.
- The reader only reads and checks files (``DiskTier.load``: bytes, header, checksum);
  the tier's index is touched by the engine thread alone, when it takes a result
  (``DiskTier.settle``), so the tier needs no lock.
- Results are kept until taken, at most ``max_results`` of them (oldest dropped: a read
  nobody took, e.g. of an aborted request, is simply done again if needed). One request
  waits for at most half of that (``max_blocks_per_request``), so its reads can always
  all be ready at once; a longer disk hit is cut there and the rest recomputed.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from dynask.kv.block_pool import CachedBlock
from dynask.kv.disk_tier import CorruptBlockFile, DiskTier
from dynask.kv.hashing import SequenceHash

log = logging.getLogger(__name__)

Loaded = torch.Tensor | Exception


class DiskPrefetcher:
    """Reads ``DiskTier`` block files on a thread of its own."""

    def __init__(
        self,
        disk: DiskTier,
        on_ready: Callable[[], None] | None = None,
        max_results: int = 4096,
    ) -> None:
        self._disk = disk
        self._on_ready = on_ready or (lambda: None)
        self._max_results = max_results
        self._lock = threading.Lock()
        self._pending: set[SequenceHash] = set()
        self._results: OrderedDict[SequenceHash, Loaded] = OrderedDict()
        self._jobs: queue.SimpleQueue[list[CachedBlock] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="dynask-kv-prefetch", daemon=True)
        self._thread.start()

    @property
    def max_blocks_per_request(self) -> int:
        """Disk blocks one request may wait for: all of them must fit among the results."""
        return self._max_results // 2

    def set_on_ready(self, on_ready: Callable[[], None]) -> None:
        """Called (on the reader thread) after each batch of reads."""
        self._on_ready = on_ready

    def request(self, blocks: Sequence[CachedBlock]) -> None:
        """Starts reading the blocks not read or being read already."""
        with self._lock:
            wanted = [
                b
                for b in blocks
                if b.block_hash not in self._pending and b.block_hash not in self._results
            ]
            self._pending.update(b.block_hash for b in wanted)
        if wanted:
            self._jobs.put(wanted)

    def ready(self, block_hash: SequenceHash) -> bool:
        """Whether the block was read (successfully or not) and not taken yet."""
        with self._lock:
            return block_hash in self._results

    def take(self, block_hash: SequenceHash) -> Loaded | None:
        """The block's read outcome (a tensor or the error), or None if not read yet."""
        with self._lock:
            return self._results.pop(block_hash, None)

    def close(self) -> None:
        """Stops the reader thread once the reads asked for are done."""
        self._jobs.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while (blocks := self._jobs.get()) is not None:
            for block in blocks:
                try:
                    loaded: Loaded = self._disk.load(block.block_hash, block.token_ids)
                except (OSError, CorruptBlockFile) as exc:
                    loaded = exc
                except Exception as exc:  # anything else too: a waiting request must hear
                    log.exception("reading KV block file %s failed", block.block_hash)
                    loaded = exc
                self._keep(block.block_hash, loaded)
            self._on_ready()

    def _keep(self, block_hash: SequenceHash, loaded: Loaded) -> None:
        with self._lock:
            self._pending.discard(block_hash)
            self._results[block_hash] = loaded
            while len(self._results) > self._max_results:
                self._results.popitem(last=False)
