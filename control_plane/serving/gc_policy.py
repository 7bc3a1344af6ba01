"""The control plane's garbage collector, set for a process with a large, long-lived heap.

Design decisions:

- Measured on the Mooncake replay (``bench/routing/control_plane_cpu.py``): a quarter of
  the control plane's CPU went to the cyclic garbage collector. Full (generation 2)
  collections walked every object alive, most of them there since start-up (modules,
  the tokenizer, Dask's client and scheduler state), and the router's indices (a node,
  two dicts and a list per KV block) made the young generations fill every few hundred
  blocks.
- So once the engines are up (``settle_heap``), what is alive then is collected once and
  frozen (``gc.freeze``): later collections never walk it again. The first threshold is
  raised from 700 to ``YOUNG_THRESHOLD`` allocations: cycles are still found, a little
  later, for a little more memory. Nothing is switched off.
- Called again (a control plane that adds engines later), it freezes what is alive by
  then; nothing frozen is ever freed, so it is called at start-up, not per request.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000


def settle_heap() -> None:
    """Collects once, freezes what is alive, and raises the young generation's threshold."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
