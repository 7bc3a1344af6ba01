"""``out=vllm``: vLLM's async engine behind dynask's engine protocol, its arguments, its KV
events and its stats.
"""
