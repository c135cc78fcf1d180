"""CUDA graphs for decode: a model's one-token step captured once and replayed, what changes per token in device
memory. decode.py: DecodeGraph (the static buffers, the captured step, the eager fallback that says why); static.py:
the step's layers at a position held in device memory (RoPE angles, attention over the whole cache masked at the
position, MLA's latent attention). The capture itself (CuPy's stream capture, the sim device's recorded tape) is
moert/devices/graph.py. May import the runtime (moert.kvcache, moert.devices); static.py imports numpy and
moert.kvcache only, because moert/layers.py imports it.
"""
