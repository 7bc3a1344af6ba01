"""A step's logits around the draw: processing before it (penalties, logit_bias,
min_tokens: ``processing``) and logprobs after it (``logprobs``); and what a request that
leaves sampling fields out gets (``defaults``: the model's generation_config.json). Imports
only torch and ``actors.api``; the draw itself is ``actors.engine.sampling``."""
