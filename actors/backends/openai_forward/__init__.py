"""``out=openai:URL``: an engine that forwards each request to an OpenAI-compatible server
someone already runs (``vllm serve`` on a GPU host), its arguments, the request and
stream formats it speaks, and what it learns of the server when it starts.
"""
