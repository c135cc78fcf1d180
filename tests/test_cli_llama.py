"""`moert run` and `moert fit` as a llama.cpp user types them: -c beyond the trained context, --seed -1, -p "",
Ctrl-C, the llama-cli flags moert accepts, "did you mean", messages naming flags, f16 KV by default, the
shortest fit flags, and a stated --gpu-mem planned without a GPU."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import moert
from moert.cli.llama_flags import parse_override_kv, parse_override_kv_list, process_escapes

DEMO = Path(moert.__file__).parent / "data" / "demo-qwen3moe.gguf"       # trained context 256, add_bos false
FAST = ["--no-warmup", "-t", "1", "--temp", "0"]


def cli(*args: str, stdin: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moert", *args], capture_output=True, text=True, timeout=timeout,
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)


@pytest.mark.parametrize("args, what", [
    (["run", str(DEMO), "--cpu-moee"], "unrecognized arguments: --cpu-moee; did you mean --cpu-moe?"),
    (["run", str(DEMO), "--temperature", "0.5"], "did you mean --temp?"),
    (["inspect", str(DEMO), "--no-tensor"], "did you mean --no-tensors?"),
    (["run", str(DEMO), "--n-cpu-mo", "2"], "did you mean --n-cpu-moe?"),
    (["run", str(DEMO), "--seeed", "2"], "did you mean --seed?"),
    (["run", str(DEMO), "-p", "x", "--override-kv", "a.b=int:x"], "--override-kv: 'a.b=int:x': 'x' is not a int"),
    (["run", str(DEMO), "-p", "x", "--numa", "everywhere"], "--numa: invalid choice: 'everywhere'"),
])
def test_usage_errors_name_the_flag_and_suggest(args, what):
    r = cli(*args)
    assert r.returncode == 2 and what in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("args, what", [
    (["-c", "-5"], "-c must be an integer in [0, 16,777,216], got -5"),
    (["-np", "0"], "-np 0: give a number of parallel sequences >= 1"),
])
def test_bad_values_name_the_flag_not_the_argument(args, what):
    r = cli("run", str(DEMO), "-p", "x", "-n", "1", *FAST, *args)
    assert r.returncode == 1 and what in r.stderr and "context_size" not in r.stderr, r.stderr


def test_a_context_beyond_the_trained_one_is_honoured_with_llama_cpps_warning():
    prompt = "def f(x):\n    return x\n" * 40                   # ~400 tokens: more than the 256 trained
    r = cli("run", str(DEMO), "-c", "600", "-p", prompt, "-n", "2", *FAST, "--no-display-prompt", "--json")
    assert r.returncode == 0, r.stderr
    assert "warning: -c 600 > the 256 tokens the model was trained for: possible training context overflow" in r.stderr
    assert json.loads(r.stdout)["timings"]["prompt_tokens"] > 256


def test_seed_minus_one_is_random_and_an_empty_prompt_starts_from_bos():
    r = cli("run", str(DEMO), "-p", "", "-n", "3", "--seed", "-1", "--no-warmup", "-t", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert "the prompt is empty; starting from the BOS token '<|endoftext|>' alone" in r.stderr
    assert json.loads(r.stdout)["timings"]["prompt_tokens"] == 1


def test_the_accepted_llama_cpp_flags_and_override_kv():
    base = cli("run", str(DEMO), "-p", "import os", "-n", "6", *FAST, "--json")
    same = cli("run", str(DEMO), "-p", "import os", "-n", "6", *FAST, "--json", "--jinja", "-nkvo", "-np", "2",
               "--numa", "distribute")
    one = cli("run", str(DEMO), "-p", "import os", "-n", "6", *FAST, "--json",
              "--override-kv", "qwen3moe.expert_used_count=int:1")
    assert base.returncode == same.returncode == one.returncode == 0, (same.stderr, one.stderr)
    assert json.loads(same.stdout)["text"] == json.loads(base.stdout)["text"]     # no effect, as --help says
    assert json.loads(one.stdout)["text"] != json.loads(base.stdout)["text"]      # one expert per token: changed


def test_escapes_as_llama_cpp_processes_them():
    assert process_escapes(r"a\nb\t\"c\" \\n \x41 \q") == 'a\nb\t"c" \\n A \\q'
    assert parse_override_kv("x.y=bool:true") == ("x.y", "BOOL", True)
    assert parse_override_kv("x.y=str:a=b") == ("x.y", "STRING", "a=b")
    # llama.cpp's comma list; a comma inside a str value stays when no KEY=TYPE: follows it
    assert parse_override_kv_list("a.b=int:1,c=str:x,y,d=bool:false") == [("a.b", "INT64", 1), ("c", "STRING", "x,y"),
                                                                          ("d", "BOOL", False)]


@pytest.mark.parametrize("command", ["run", "chat"])
def test_e_processes_escapes_in_p_and_every_r_once_and_no_escape_keeps_them(command):
    """llama.cpp's -e (on by default) processes -p, --in-prefix/--in-suffix, each -r and DRY's breakers
    (common/arg.cpp); moert has -p and -r of those. -sys stays as written, as llama.cpp leaves it."""
    from moert.cli.llama_flags import apply_escapes
    from moert.cli.main import build_parser

    extra = ["-p", r"a\tb"] if command == "run" else ["-sys", r"keep\n"]
    args = build_parser().parse_args([command, str(DEMO), *extra, "-r", r"\n\n", "-r", r"x\x41"])
    apply_escapes(args)
    assert args.stop == ["\n\n", "xA"] and getattr(args, "prompt", "a\tb") == "a\tb"
    assert getattr(args, "system_prompt", None) in (None, r"keep\n")
    apply_escapes(args)                                   # `run -cnv` calls chat with the same args: no twice
    assert args.stop == ["\n\n", "xA"]
    args = build_parser().parse_args([command, str(DEMO), *extra, "-r", r"\n", "--no-escape"])
    apply_escapes(args)
    assert args.stop == [r"\n"] and getattr(args, "prompt", r"a\tb") == r"a\tb"


def test_an_escaped_r_stops_generation_at_a_real_newline():
    """-r '\\n' is a newline once -e processed it: generation stops at the first one (the demo writes Python)."""
    runs = {flag: json.loads(cli("run", str(DEMO), "-p", r"import os\n", "-r", r"\n", "-n", "40", *FAST, "--json",
                                 *flag).stdout) for flag in ((), ("--no-escape",))}
    escaped, literal = runs[()], runs[("--no-escape",)]
    assert escaped["prompt"] == "import os\n" and literal["prompt"] == r"import os\n"
    assert escaped["stop_reason"] == "stop" and "\n" not in escaped["text"]      # stopped at it (and dropped it)
    assert literal["stop_reason"] != "stop" and "\n" in literal["text"]     # newlines, but never the two chars


def test_conversation_mode_chats_with_p_as_the_system_prompt():
    r = cli("run", str(DEMO), "-cnv", "-p", "You write Python.", "-n", "4", *FAST, stdin="import\n")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr


def test_ctrl_c_exits_130():
    # the demo fills its 256 positions in ~50 ms on the CPU alone; through the sim GPU (~3 ms a token) the whole
    # context takes ~0.75 s, so the signal, sent as soon as the first token shows, lands mid-generation
    # warmed up (no --no-warmup): on a cold Numba cache the kernels compile at load, not under the signal
    p = subprocess.Popen([sys.executable, "-m", "moert", "run", str(DEMO), "-p", "def", "-n", "-1", "-t", "1",
                          "--temp", "0", "-c", "256", "--gpu-backend", "sim", "--cpu-moe"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         # as a terminal gives it: a job started in the background (`cmd &` in a script) inherits
                         # SIGINT ignored, and Python then never raises KeyboardInterrupt
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert p.stdout.read(3)                              # generation has started
        time.sleep(0.02)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, err


def test_inspect_and_fit_size_an_f16_cache_by_default():
    r = cli("inspect", str(DEMO), "--no-tensors", "--plan")
    assert "memory at context 256 (KV f16, batch 512)" in r.stdout, r.stdout
    r = cli("inspect", str(DEMO), "--no-tensors", "--plan", "-ctk", "f32", "-ctv", "f32")
    assert "(KV f32, batch 512)" in r.stdout


@pytest.mark.parametrize("order, flags, kw", [
    ("last", "--n-cpu-moe 2 --n-cpu-moe-from last -c 256", dict(n_cpu_moe=2, n_cpu_moe_from="last")),
    ("first", "--n-cpu-moe 2 -c 256", dict(n_cpu_moe=2)),
])
def test_fit_prints_the_shortest_flags_and_plans_gpu_mem_without_a_gpu(order, flags, kw):
    r = cli("fit", str(DEMO), "--gpu-mem", "12MiB", "--expert-order", order)
    assert r.returncode == 0, r.stderr
    assert "planning for a simulated GPU of --gpu-mem 12MiB" in r.stderr            # no --gpu-backend sim needed
    assert f"  flags: {flags}\n" in r.stdout and "-ot" not in r.stdout.split("flags:")[1].split("\n")[0]
    js = json.loads(cli("fit", str(DEMO), "--gpu-mem", "12MiB", "--expert-order", order, "--json").stdout)
    fitted = moert.plan(str(DEMO), js["overrides"], gpu_backend="sim", gpu_memory="12MiB")
    short = moert.plan(str(DEMO), gpu_backend="sim", gpu_memory="12MiB", **kw)
    assert {e.name: e.device for e in short} == {e.name: e.device for e in fitted}


def test_calibrates_table_prints_a_dash_not_nan(monkeypatch, capsys):
    from argparse import Namespace

    from moert.cli import hardware as cli_hw
    from moert.cost import calibrate as cal
    from moert.cost.hardware import CPU

    cpu = CPU("local", 2, 10.0, ghz=1.0, flops_per_cycle=1, kernel_gbs=(("Q4_K", 2.5), ("Q4_K/int16", 3.0)),
              kernel_gflops=(("Q4_K", 20.0),), bw_1thread_gbs=5.0)
    monkeypatch.setattr(cal, "calibrate", lambda **kw: cpu)
    assert cli_hw.cmd_hardware(Namespace(action="calibrate", json=False, long=False, threads=None)) == 0
    out = capsys.readouterr().out
    assert "nan" not in out and "Q4_K/int16         3.00                         -" in out


@pytest.mark.parametrize("message, flags", [
    ("context_size must be an integer in [0, 16,777,216], got -5", "-c must be an integer in [0, 16,777,216], got -5"),
    ("n_batch must be an integer in [1, 65,536], got 0", "-b must be an integer in [1, 65,536], got 0"),
    ("gpu_memory=nan: invalid size nan", "--gpu-mem nan: invalid size nan"),
    ("overrides=42: expected an -ot string", "-ot 42: expected an -ot string"),
    ("no tensor 'x' (Plan.explain() lists them)", "no tensor 'x' (moert inspect MODEL --plan lists them)"),
    ("Pass template= to use another one.", "Pass --chat-template to use another one."),
    ("a split of rows", "a split of rows"),                     # an English word stays
])
def test_messages_name_flags_not_api_arguments(message, flags):
    from moert.cli.common import flagify

    assert flagify(message) == flags


def test_chat_takes_a_chat_template():
    r = cli("chat", str(DEMO), "--chat-template", "chatml", "-n", "3", *FAST, stdin="import\n")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    r = cli("chat", str(DEMO), "--chat-template", "{% if %}", "-n", "3", *FAST, stdin="import\n")      # not Jinja
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr


def test_seed_minus_one_means_random_in_the_api_too():
    from moert.text.sampling import SamplingError, SamplingParams

    assert SamplingParams(seed=-1).seed is None and SamplingParams(seed=7).seed == 7
    with pytest.raises(SamplingError, match="use a non-negative integer, or -1 / None for a random seed"):
        SamplingParams(seed=-2)


def test_a_ctrl_c_a_finalizer_swallowed_still_stops_the_stream(capsys):
    """Python raises KeyboardInterrupt wherever the main thread is; inside a finalizer it is printed as "Exception
    ignored" and lost. The streaming loop keeps it and raises it at the next token."""
    from types import SimpleNamespace

    from moert.cli import generate

    class Stream:
        stats = None

        def __iter__(self):
            yield "a"
            try:                                         # as a weakref.finalize callback running when SIGINT lands
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                pass                                     # the interpreter's "Exception ignored in ..."
            yield "b"
            yield "c"

        def close(self):
            pass

    model = SimpleNamespace(stream=lambda *a, **k: Stream())
    args = SimpleNamespace(n_predict=3, json=False, temp=0.0, top_k=40, top_p=0.95, min_p=0.05, seed=-1,
                           repeat_penalty=1.0, repeat_last_n=64, presence_penalty=0.0, frequency_penalty=0.0,
                           stop=None)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a terminal (a job run with `&`
    try:                                                                  # inherits SIGINT ignored)
        with pytest.raises(KeyboardInterrupt):
            generate._stream_to_stdout(model, "p", args)
        assert capsys.readouterr().out == "a"            # stopped before "b"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # the handler put back
    finally:
        signal.signal(signal.SIGINT, before)
