"""Model files, whatever the engine: a model argument resolved to a local HF folder
(``model_source``), whether one can be loaded here without loading it (``model_check``),
a GGUF file converted once into an HF folder (``gguf_conversion``), and the tokenizer read
from a folder (``tokenizer_folder``).

Every backend and the control plane use them, so importing them loads no torch (only a
GGUF conversion does). Imports nothing of the project.
"""
