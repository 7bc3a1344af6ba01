"""The built-in engine: throughput and TTFT against HF transformers (CPU or CUDA),
the floors of a decode step, the step profile on a GPU."""
