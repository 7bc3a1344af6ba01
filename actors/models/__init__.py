"""Model files, whatever the engine: a model argument resolved to a local HF folder
(``model_source``), a GGUF file converted once into one (``gguf_conversion``), and the
tokenizer read from a folder (``tokenizer_folder``).

Every backend and the control plane use them, so importing them loads no torch (only a
GGUF conversion does). Imports nothing of the project.
"""
