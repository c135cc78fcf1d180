"""llama-cli's flags beyond placement and sampling, as `moert run` and `moert chat` take them (`moert serve`
takes --override-kv, --jinja and --chat-template from here too, as llama-server does).

    -e / --no-escape        process \\n, \\t, \\', \\", \\\\ in -p and -r (llama.cpp: on by default)
    --override-kv K=T:V,... change GGUF metadata keys before the model is read (T: int, float, bool, str)
    -cnv / --conversation   run: chat instead (-p becomes the system prompt, as llama-cli's conversation mode)
    --chat-template T       chat: a built-in template name or Jinja source instead of the model's
    --jinja, -nkvo, -np N, --numa T   accepted with llama.cpp's meaning; each says in --help why it changes
                            nothing in moert

Values are checked here, so a bad one is an error naming the flag before anything is loaded.
"""

from __future__ import annotations

import argparse
import re
import sys

from moert.errors import MoertError

_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f",
            "v": "\v", "?": "?"}
_ESCAPE_RE = re.compile(r"\\(x[0-9a-fA-F]{2}|.)", re.DOTALL)


def process_escapes(text: str) -> str:
    """llama.cpp's string_process_escapes: \\n, \\t, \\xNN ... become the characters; an unknown one stays."""
    def one(m: re.Match) -> str:
        e = m.group(1)
        if len(e) == 3 and e[0] == "x":
            return chr(int(e[1:], 16))
        return _ESCAPES.get(e, m.group(0))
    return _ESCAPE_RE.sub(one, text)


def apply_escapes(args: argparse.Namespace) -> None:
    """-e (on by default): escapes processed in -p and in every -r, as llama.cpp's common_params_parse does
    (also in --in-prefix / --in-suffix and DRY's sequence breakers, which moert has not; -sys it takes as
    written, and so does moert). Once: `run -cnv` hands the same args on to chat."""
    if not getattr(args, "escape", False):
        return
    if getattr(args, "prompt", None) is not None:
        args.prompt = process_escapes(args.prompt)
    args.stop = [process_escapes(s) for s in getattr(args, "stop", None) or []]
    args.escape = False                    # processed: a second call leaves the text as it is now


_KV_RE = re.compile(r"^([^=]+)=(int|float|bool|str):(.*)$", re.DOTALL)


def parse_override_kv_list(value: str) -> list[tuple[str, str, object]]:
    """KEY=TYPE:VALUE,KEY=TYPE:VALUE,... (llama.cpp's --override-kv takes a comma list) -> parse_override_kv's
    tuples. A comma starts the next override only where KEY=TYPE: follows, so a str value may hold commas."""
    return [parse_override_kv(item) for item in _KV_SPLIT.split(value)]


_KV_SPLIT = re.compile(r",(?=[^=,]+=(?:int|float|bool|str):)")


def parse_override_kv(item: str) -> tuple[str, str, object]:
    """KEY=TYPE:VALUE (llama.cpp's --override-kv) -> (key, GGUF type name, value)."""
    m = _KV_RE.match(item)
    if not m:
        raise argparse.ArgumentTypeError(f"{item!r}: write KEY=TYPE:VALUE with TYPE int, float, bool or str, e.g. "
                                         f"qwen3moe.expert_used_count=int:4")
    key, typ, raw = m.groups()
    try:
        if typ == "int":
            return key, "INT64", int(raw)
        if typ == "float":
            return key, "FLOAT64", float(raw)
        if typ == "bool":
            if raw not in ("true", "false"):
                raise ValueError
            return key, "BOOL", raw == "true"
        return key, "STRING", raw
    except ValueError:
        raise argparse.ArgumentTypeError(f"{item!r}: {raw!r} is not a {typ}"
                                         + (" (true or false)" if typ == "bool" else "")) from None


def apply_override_kv(g, overrides: list[tuple[str, str, object]]) -> None:
    """--override-kv on an open GGUF file: its metadata as the model (config, tokenizer, plan) will read it."""
    for key, typ, value in overrides:
        g.metadata[key] = value
        g.value_types[key] = typ


def add_llama_flags(p: argparse.ArgumentParser, conversation: bool = True) -> None:
    """Register the flags above on `run` (conversation=True) or `chat`."""
    g = p.add_argument_group("llama-cli's other flags")
    g.add_argument("-e", "--escape", dest="escape", action="store_true", default=True,
                   help="process escapes (\\n, \\t, \\', \\\", \\\\, \\xNN) in -p and -r (default: on, as "
                        "llama.cpp; -sys is taken as written, as llama.cpp does)")
    g.add_argument("--no-escape", dest="escape", action="store_false", help="take -p and -r as written")
    add_override_kv_arg(g)
    if conversation:
        g.add_argument("-cnv", "--conversation", action="store_true",
                       help="chat instead of completing -p (which becomes the system prompt): `moert chat`")
    add_chat_template_args(g)
    g.add_argument("-nkvo", "--no-kv-offload", action="store_true",
                   help="accepted, no effect: each layer's KV cache lives where its attention runs (move both with "
                        "-ot 'attn=CPU')")
    g.add_argument("-np", "--parallel", type=int, default=1, metavar="N",
                   help="accepted, no effect here: run and chat decode one sequence (`moert serve -np N` serves N)")
    g.add_argument("--numa", choices=("distribute", "isolate", "numactl"), default=None,
                   help="accepted, no effect: moert does not pin threads to NUMA nodes (run it under numactl)")


def add_override_kv_arg(g) -> None:
    """--override-kv KEY=TYPE:VALUE[,...], repeatable (run, chat, serve): moert.cli.generate.load_from_args
    applies the overrides to the file's metadata before anything reads it."""
    g.add_argument("--override-kv", action="extend", default=[], type=parse_override_kv_list,
                   metavar="KEY=TYPE:VALUE,...", help="override GGUF metadata keys (TYPE int, float, bool or str), "
                   "e.g. qwen3moe.expert_used_count=int:4 or tokenizer.ggml.add_bos_token=bool:false; a comma "
                   "list or repeated, as llama.cpp")


def add_chat_template_args(g, what: str = "chat") -> None:
    """--chat-template and --jinja (run, chat, serve)."""
    g.add_argument("--chat-template", default=None, metavar="NAME|JINJA",
                   help=f"{what} template: a built-in name (chatml, gemma) or Jinja source (default: the model's "
                        f"own, tokenizer.chat_template)")
    g.add_argument("--jinja", action="store_true",
                   help="accepted, no effect: moert always renders the chat template (the GGUF's, or "
                        "--chat-template's) with Jinja2, in a sandbox, as llama.cpp's --jinja does; there is no "
                        "non-Jinja path to turn off")


def bos_if_empty(model, prompt: str) -> str | list[int]:
    """An empty prompt starts from BOS alone (llama-cli: "embd_inp was considered empty and bos was added")."""
    if prompt:
        return prompt
    bos = model.tokenizer.bos_id
    if bos is None:
        raise MoertError("-p '': the prompt is empty and this vocabulary has no BOS token to start from; give a "
                         "prompt (llama.cpp stops here too: 'input is empty')")
    print(f"warning: -p '': the prompt is empty; starting from the BOS token {model.tokenizer.bos_token!r} alone",
          file=sys.stderr)
    return [bos]


def check(args: argparse.Namespace) -> None:
    """The values argparse cannot check alone."""
    if getattr(args, "parallel", 1) < 1:
        raise MoertError(f"-np {args.parallel}: give a number of parallel sequences >= 1")


__all__ = ["add_chat_template_args", "add_llama_flags", "add_override_kv_arg", "apply_escapes", "apply_override_kv",
           "bos_if_empty", "check", "parse_override_kv", "parse_override_kv_list", "process_escapes"]
