"""Teaching views of one forward pass: what a token's trip through the layers costs and where it goes.

    walk.py      explain(model, prompt): one token followed through the model, layer by layer (`moert explain`)
    views.py     logit lens, attention, routing and expert-class views (`moert explain --view ...`)
    summary.py   what is in a GGUF file, for `moert inspect`: hyperparameters, tensors, totals by type, layer, role

A wing above the runtime: it reads a loaded Model and its devices; the runtime imports nothing from here.
"""

from moert.explain.walk import LayerTrace, Recorder, Trace, explain, format_layer, format_trace, host_array, plot_trace

__all__ = ["LayerTrace", "Recorder", "Trace", "explain", "format_layer", "format_trace", "host_array", "plot_trace"]
