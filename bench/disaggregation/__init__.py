"""Disaggregated prefill/decode: KV transfer between processes and GPUs, and serving."""
