"""`moert explain MODEL -p PROMPT [--token I] [--layer L] [--view walk|attention|lens|routing] [--plot PNG] [--json]`:
one token's walk (explain.py), what it attended to, what each layer would predict, every token's experts
(explain/views.py); `moert experts MODEL -p TEXT|-f FILE [--layer L] [--json]`: the demo's expert table."""

from __future__ import annotations

import argparse
import json
import sys

from moert.errors import MoertError


def cmd_explain(args: argparse.Namespace) -> int:
    from moert.cli.generate import load_from_args
    from moert.explain import explain, format_trace, plot_trace

    model = load_from_args(args.model, args)
    if not model.tokenizer.has_vocab:
        raise MoertError(f"{args.model} has no vocabulary (tokenizer.ggml.model = 'none'); explain needs text "
                         f"to tokenize: use a model with a tokenizer")
    if args.layer is not None and not 0 <= args.layer < model.config.n_layer:
        raise MoertError(f"--layer {args.layer}: the model has layers 0 to {model.config.n_layer - 1}")
    if args.view != "walk":
        from moert.explain.views import attention_view, format_view, logit_lens, routing_view

        d = (routing_view(model, args.prompt) if args.view == "routing" else
             {"attention": attention_view, "lens": logit_lens}[args.view](model, args.prompt, args.token, args.top))
        if args.layer is not None and "layers" in d and isinstance(d["layers"], list):
            d["layers"] = [lt for lt in d["layers"] if lt["layer"] == args.layer]
        print(json.dumps(d, indent=1) if args.json else format_view(d))
        return 0
    trace = explain(model, args.prompt, args.token)
    if args.json:
        d = trace.to_dict()
        if args.layer is not None:
            d["layers"] = [lt for lt in d["layers"] if lt["layer"] == args.layer]
        print(json.dumps(d, indent=1))
    else:
        print(format_trace(trace, args.layer))
    if args.plot:
        print(f"plot: {plot_trace(trace, args.plot)}", file=sys.stderr)
    return 0


def cmd_experts(args: argparse.Namespace) -> int:
    """`moert experts`: explain_views.expert_classes over -p TEXT or -f FILE."""
    from moert.cli.generate import load_from_args, read_prompt_file
    from moert.explain.views import expert_classes, format_view

    text = read_prompt_file(args.file) if args.file else args.prompt
    if not text:
        raise MoertError("no text: give it with -p TEXT or -f FILE")
    model = load_from_args(args.model, args)
    if not model.tokenizer.has_vocab:
        raise MoertError(f"{args.model} has no vocabulary (tokenizer.ggml.model = 'none'); the table needs text")
    d = expert_classes(model, text, args.layer)
    print(json.dumps(d, indent=1) if args.json else format_view(d))
    return 0


def add_commands(sub) -> None:
    """Register explain on the top-level subparsers."""
    from moert.cli.common import add_hardware_arg, add_model_arg, add_ray_args
    from moert.cli.placement import add_placement_args

    e = sub.add_parser("explain", help="follow one token through the model: router, experts, devices, bytes, time",
                       allow_abbrev=False)
    add_model_arg(e)
    e.add_argument("-p", "--prompt", required=True, help="the text; its tokens run through the model")
    e.add_argument("--token", type=int, default=-1, metavar="I", help="which token of the prompt to follow "
                   "(an index, negative from the end; default: -1, the last)")
    e.add_argument("--layer", type=int, default=None, metavar="L", help="show only layer L (default: all)")
    e.add_argument("--plot", default=None, metavar="PNG", help="save the router probabilities and residual "
                   "updates per layer as a picture (needs matplotlib: the `plot` extra)")
    e.add_argument("--view", choices=("walk", "attention", "lens", "routing"), default="walk",
                   help="walk (default): the token through every layer; attention: the earlier tokens it attended to, "
                        "per layer and KV head; lens: what the residual after each layer would predict (logit lens); "
                        "routing: the experts every prompt token chose, a row per token, a column per layer")
    e.add_argument("--top", type=int, default=5, metavar="N", help="--view attention/lens: show N (default: 5)")
    e.add_argument("--json", action="store_true", help="print the trace (or the view) as JSON")
    e.add_argument("-t", "--threads", type=int, default=None, help="CPU threads for the kernels")
    e.set_defaults(func=cmd_explain, batch_size=512, warmup=True, act_quant="none", mmap=True)
    add_placement_args(e)
    add_hardware_arg(e)
    add_ray_args(e)

    x = sub.add_parser("experts", help="which experts each kind of token (word, number, string, ...) goes to, over "
                       "any text: the demo's table for any model", allow_abbrev=False)
    add_model_arg(x)
    x.add_argument("-p", "--prompt", default=None, help="the text to route")
    x.add_argument("-f", "--file", default=None, help="read the text from a file")
    x.add_argument("--layer", type=int, default=None, metavar="L", help="the layer (default: the last)")
    x.add_argument("--json", action="store_true", help="print JSON")
    x.add_argument("-t", "--threads", type=int, default=None, help="CPU threads for the kernels")
    x.set_defaults(func=cmd_experts, batch_size=512, warmup=False, act_quant="none", mmap=True)
    add_placement_args(x)
    add_ray_args(x)
