"""The built-in engine's CUDA-only parts: the step's device inputs and CUDA-graph replays,
decode bursts, and the Triton kernels (paged attention, fused small ops). Imported only
where a CUDA device serves.
"""
