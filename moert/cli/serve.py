"""`moert serve MODEL`: the model behind an OpenAI-compatible HTTP server (moert/serve/server.py), as llama-server.

    moert serve MODEL [placement and sampling flags] [--host 127.0.0.1] [--port 8080] [--queue 16]
                      [-np 1] [--max-body 8388608] [--metrics] [--chat-template T] [--jinja]
                      [--override-kv KEY=TYPE:VALUE,...] [--ray ... --ray-idle-seconds 5]
"""

from __future__ import annotations

import argparse
import sys


def cmd_serve(args: argparse.Namespace) -> int:
    from moert.cli.generate import load_from_args
    from moert.errors import MoertError

    try:
        import uvicorn

        from moert.serve.app import create_app
        from moert.serve.server import Server, listen
    except ImportError as e:
        raise MoertError(f"moert serve needs FastAPI and uvicorn ({e}); pip install 'moert[serve]'") from None
    try:
        sock = listen(args.host, args.port)       # bound before loading: a taken port fails fast
    except OSError as e:
        raise MoertError(listen_error(args.host, args.port, e)) from None
    model = load_from_args(args.model, args, announce=True, trace=args.trace)
    server = Server(model, name=args.alias or model.gguf.path.name, queue_size=args.queue,
                    defaults=_defaults(args), chat_template=args.chat_template, max_body=args.max_body,
                    n_parallel=args.parallel, ray_idle_s=args.ray_idle_seconds)
    host, port = sock.getsockname()[:2]
    print(f"moert serve: {server.name} on http://{host}:{port} (OpenAI API under /v1; /health, /props, "
          f"/completion, /tokenize, /detokenize, /stats, /placement, /trace{', /metrics' if args.metrics else ''}); "
          f"{server.n_parallel} slot{'s' if server.n_parallel > 1 else ''} of {server.n_ctx_slot} tokens; "
          f"{_idle_note(server)}Ctrl-C stops", file=sys.stderr, flush=True)
    try:
        app = create_app(server, metrics=args.metrics)
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    finally:
        server.close()
        model.close()
    return 0


def _idle_note(server) -> str:
    if not server.idle.graphs:
        return ""
    return f"Ray workers' compiled graph released after {server.idle.seconds:g} s idle; "


def _idle_seconds(value: str) -> float:
    try:
        s = float(value)
    except ValueError:
        s = -2.0
    if not (s >= 0 or s == -1):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, or -1 (never release), got {value!r}")
    return s


def listen_error(host: str, port: int, e: OSError) -> str:
    """What went wrong binding --host/--port, and the flag to change."""
    import errno
    import socket

    if isinstance(e, socket.gaierror):
        return (f"--host {host}: no such address ({e.strerror}); give an address of this machine: --host "
                f"127.0.0.1 (this machine only) or --host 0.0.0.0 (every interface)")
    if e.errno == errno.EADDRNOTAVAIL:
        return (f"--host {host} is not an address of this machine ({e.strerror}); use --host 127.0.0.1 (this "
                f"machine only) or --host 0.0.0.0 (every interface)")
    if e.errno == errno.EADDRINUSE:
        return f"--port {port} on {host} is taken ({e.strerror}); pick another --port, or --port 0 for a free one"
    if e.errno == errno.EACCES:
        return f"--port {port}: not allowed ({e.strerror}; ports below 1024 need root); pick --port 8080"
    return f"cannot listen on --host {host} --port {port} ({e.strerror or e})"


def _port(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0..65535 (0: a free one), got {value!r}")
    return n


def _defaults(args: argparse.Namespace) -> dict:
    """The sampling flags, as the defaults of requests that do not set them."""
    from moert.cli.args import sampling

    return dict(max_tokens=args.n_predict, **sampling(args))


def add_commands(sub) -> None:
    """Register serve on the top-level subparsers."""
    from moert.cli.args import add_sampling_args, positive
    from moert.cli.common import add_model_arg, add_offload_arg, add_ray_args
    from moert.cli.llama_flags import add_chat_template_args, add_override_kv_arg
    from moert.cli.placement import add_placement_args
    from moert.serve.server import IDLE_S, MAX_BODY

    s = sub.add_parser("serve", help="serve the model over HTTP: OpenAI's API and llama.cpp server's endpoints",
                       description="One model; requests run in arrival order, up to -np at a time (their tokens "
                       "decoded together, one forward per step); a reused prompt prefix is not recomputed; the "
                       "sampling flags are the defaults of requests that do not set them. One log line per "
                       "request goes to stderr.")
    add_model_arg(s)
    g = s.add_argument_group("server (llama-server's flags)")
    g.add_argument("--trace", action="store_true", help="record every token's routing; GET /trace returns it")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine "
                   "only)")
    g.add_argument("--port", type=_port, default=8080, help="port to listen on; 0: a free one (default: 8080)")
    g.add_argument("--queue", type=positive, default=16, metavar="N",
                   help="requests that may wait for a slot; one more gets 503 (default: 16)")
    g.add_argument("-np", "--parallel", type=positive, default=1, metavar="N",
                   help="slots: requests generated at the same time, their tokens decoded together in one "
                   "forward per step (an expert chosen by several is read once); the context (-c) is divided "
                   "among them, as llama-server's (default: 1)")
    g.add_argument("--max-body", type=positive, default=MAX_BODY, metavar="BYTES",
                   help=f"largest request body; a larger one gets 413 (default: {MAX_BODY:,}, 8 MiB)")
    g.add_argument("--metrics", action="store_true", help="answer GET /metrics: llama-server's Prometheus "
                   "counters (llamacpp:prompt_tokens_total, ...)")
    g.add_argument("-a", "--alias", default=None, metavar="NAME", help="the model's name in the API "
                   "(default: the file name)")
    g.add_argument("--ray-idle-seconds", type=_idle_seconds, default=IDLE_S, metavar="SECONDS",
                   help="with experts on Ray workers (--ray): release their compiled graph after SECONDS without "
                   "a request, so that idle workers stop polling their channels (a third of a core or more each); "
                   "the next request compiles it again (0.1-0.2 s more on its first token, more on a busy "
                   "machine). 0: after every request; -1: never (named after llama-server's "
                   f"--sleep-idle-seconds, which unloads the model) (default: {IDLE_S:g})")
    add_chat_template_args(g, "/v1/chat/completions's")
    add_override_kv_arg(g)
    add_sampling_args(s, n_predict=-1)
    add_placement_args(s)
    add_offload_arg(s)
    add_ray_args(s)
    s.set_defaults(func=cmd_serve, json=False)


__all__ = ["add_commands", "cmd_serve"]
