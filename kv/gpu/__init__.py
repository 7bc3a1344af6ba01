"""KV work that runs on the GPU itself: the fused block copy (``block_copy``: the plan,
checked on a CPU; ``block_copy_kernel``: its Triton kernel, imported only where CUDA and
Triton exist). Imports only ``torch``, ``numpy`` and Triton.
"""
