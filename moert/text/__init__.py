"""Text in, text out: the tokenizer read from the GGUF, chat templates, sampling, and the generation loop.

    tokenizer.py        the GGUF's tokenizer (BPE / SentencePiece via the `tokenizers` package), typed errors
    tokenizer_keys.py   the tokenizer.ggml.* keys, read and checked
    chat.py             the GGUF's chat template (jinja2), rendered as llama.cpp does
    sampling.py         temperature, top-k / top-p / min-p, penalties, seeded
    generate.py         generate / stream / chat on a Model (Model.generate is this module's TextAPI)

Part of the runtime's pipeline (moert.model uses TextAPI); it imports moert.errors and nothing of the serving,
cluster, explain, cost or CLI wings.
"""
