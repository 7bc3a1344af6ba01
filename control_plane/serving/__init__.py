"""The request pipeline: served models, prompts and tokenization, placing a request on an
actor, actor handles and their load, submit batching, admission, metrics.
"""
