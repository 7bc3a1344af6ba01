"""The KV transports (``kv.transfer`` names their interface and picks one by name):
``tcp`` and ``ucxx_tensor`` move one tensor per transfer; ``cuda_ipc`` and
``ucxx_blocks`` write a sender's paged blocks straight into a receiver's reserved ones,
over ``control``'s protocol."""
