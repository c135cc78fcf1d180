"""llama.cpp's flags parse exactly as llama.cpp's tools parse them: never a prefix, never read as another flag."""

from __future__ import annotations

import pytest

from moert.cli.common import LLAMA_COMMON_FLAGS, flagify, physical_cores
from moert.cli.main import build_parser, main
from moert.testing import write_qwen3moe

COMMANDS = ("run", "chat", "bench", "serve", "inspect", "fit")


@pytest.fixture(scope="module")
def parser():
    return build_parser()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_qwen3moe(tmp_path_factory.mktemp("flags") / "m.gguf", n_layer=3, n_expert=4)


def parse(parser, *argv):
    return parser.parse_args([str(a) for a in argv])


def test_every_parser_knows_every_common_flag_whole(parser):
    """Each flag of llama.cpp's common set is an exact option of every command (taken or refused), so argparse
    never reads it as a prefix or as a short flag with a glued value."""
    sub = parser._subparsers._group_actions[0].choices
    for cmd in COMMANDS:
        p = sub[cmd]
        assert not p.allow_abbrev, cmd
        missing = [f for f in LLAMA_COMMON_FLAGS if f not in p._option_string_actions]
        assert not missing, (cmd, missing)


@pytest.mark.parametrize("argv, dest, value", [
    (["run", "m.gguf", "-ts", "3,1"], "tensor_split", [3.0, 1.0]),
    (["run", "m.gguf", "-ts", "3/1"], "tensor_split", [3.0, 1.0]),
    (["run", "m.gguf", "-t", "2"], "threads", 2),
    (["run", "m.gguf", "-c", "128"], "ctx", 128),
    (["run", "m.gguf", "-ctk", "f32"], "cache_type_k", "f32"),
    (["run", "m.gguf", "-fa", "off"], "flash_attn", "off"),
    (["run", "m.gguf", "-ctk", "f16"], "cache_type_k", "f16"),          # argparse alone reads this as -c tk
    (["run", "m.gguf", "-ctv", "q8_0"], "cache_type_v", "q8_0"),
    (["run", "m.gguf", "-fa", "on"], "flash_attn", "on"),               # ... and this as -f a
    (["run", "m.gguf", "-mg", "1"], "main_gpu", 1),
    (["run", "m.gguf", "-dev", "sim:0,sim:1"], "device", ["sim:0", "sim:1"]),
    (["run", "m.gguf", "-ub", "64"], "ubatch_size", 64),
    (["run", "m.gguf", "--fit", "on"], "fit", True),
    (["run", "m.gguf", "-fitt", "1024,512"], "fit_target", [1024, 512]),
    (["run", "m.gguf", "--fit-ctx", "1024"], "fit_ctx", 1024),
    (["run", "m.gguf", "-v"], "verbose", True),
    (["run", "m.gguf", "-ncmoe", "2"], "n_cpu_moe", 2),
    (["run", "m.gguf", "-r", "STOP"], "stop", ["STOP"]),
    (["run", "-m", "m.gguf"], "model_flag", "m.gguf"),
    (["bench", "m.gguf", "-r", "2"], "repetitions", 2),
])
def test_flags_mean_what_they_mean_in_llama_cpp(parser, argv, dest, value):
    assert getattr(parse(parser, *argv), dest) == value


@pytest.mark.parametrize("argv, says", [
    (["run", "m.gguf", "-ctk", "q4_0"], "-ctk"),
    (["run", "m.gguf", "-fa", "maybe"], "on, off or auto"),
    (["run", "m.gguf", "-tb", "4"], "-tb"),
    (["inspect", "m.gguf", "--no-mmap"], "--no-mmap is for the commands that run a model"),
    (["run", "m.gguf", "--mlock"], "--mlock"),
    (["inspect", "m.gguf", "-p", "hi"], "not a flag of `moert inspect`"),
    (["run", "m.gguf", "-ctx", "5"], "unrecognized arguments: -ctx"),   # no flag is split into -c tx
    (["run", "m.gguf", "--ctx-s", "5"], "unrecognized arguments: --ctx-s"),   # no prefixes
    (["run", "m.gguf", "-c5"], "unrecognized arguments: -c5"),
    (["run", "m.gguf", "--fit", "maybe"], "on or off"),
])
def test_unsupported_or_unknown_flags_fail_clearly(parser, capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        parse(parser, *argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_model_as_positional_or_dash_m(model, capsys):
    assert main(["inspect", "-m", str(model), "--no-tensors"]) == 0
    assert "qwen3moe" in capsys.readouterr().out
    assert main(["inspect", "--no-tensors"]) == 2
    assert "no model given: pass MODEL or -m MODEL" in capsys.readouterr().err
    assert main(["inspect", str(model), "-m", "other.gguf"]) == 2
    assert "two models given" in capsys.readouterr().err


def test_fit_without_gpu_says_which_backend_it_assumed(model, capsys):
    assert main(["fit", str(model), "--gpu-mem", "2GiB"]) == 0      # a stated size: planned on a sim GPU
    assert "planning for a simulated GPU of --gpu-mem 2GiB" in capsys.readouterr().err
    assert main(["fit", str(model)]) == 0
    assert "no GPU: --gpu-backend auto found none" in capsys.readouterr().out


def test_fit_target_is_a_margin_per_gpu_in_mib(model, capsys):
    import json

    assert main(["fit", str(model), "--gpu-backend", "sim", "--gpu-mem", "1GiB,1GiB", "-fitt", "0,1024",
                 "--json"]) == 1                                  # all of sim:1 kept free: nothing fits there
    msg = json.loads(capsys.readouterr().out)["message"]
    assert "sim:1 needs" in msg and "margin 1.00 GiB" in msg and "sim:0 needs" not in msg
    assert main(["fit", str(model), "--gpu-backend", "sim", "--gpu-mem", "1GiB,1GiB", "-fitt", "1"]) == 0


def test_main_gpu_with_split_none_and_device_selection(model, capsys):
    assert main(["inspect", str(model), "--gpu-backend", "sim", "--gpu-mem", "1GiB,1GiB", "-sm", "none",
                 "-mg", "1", "--json"]) == 0
    import json

    plan = json.loads(capsys.readouterr().out)["plan"]
    devs = {t["device"] for t in plan["tensors"] if t["name"].startswith("blk.")}
    assert devs == {"sim:1"}
    assert main(["inspect", str(model), "-dev", "sim:1", "--gpu-mem", "1GiB"]) == 1
    assert "-dev sim:1: no such device; devices that exist: cpu, sim:0" in capsys.readouterr().err


def test_verbose_prints_each_override_as_llama_cpp(model, capsys):
    assert main(["inspect", str(model), "--gpu-backend", "sim", "-cmoe", "-v", "--no-tensors"]) == 0
    err = capsys.readouterr().err
    assert "tensor blk.0.ffn_up_exps.weight (0 MiB Q8_0) buffer type overridden to CPU" in err


def test_messages_name_flags_not_arguments():
    assert flagify("pass gpu_backend='sim' to simulate a GPU, or gpu_layers=0 to plan") == \
        "pass --gpu-backend sim to simulate a GPU, or -ngl 0 to plan"


def test_version_and_list_devices(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("moert 0.")
    assert main(["--list-devices", ]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Available devices:") and "  CPU: " in out and "sim:0: simulated GPU (24576 MiB" in out


def test_default_threads_are_physical_cores():
    import os

    assert 1 <= physical_cores() <= len(os.sched_getaffinity(0))


def test_demo_help_says_the_real_default(parser, capsys):
    sub = parser._subparsers._group_actions[0].choices
    assert sub["demo"].parse_args([]).n_predict == 48
    assert "default: 48" in sub["demo"].format_help()


def test_load_warnings_are_one_line_naming_flags_before_the_progress_bar(model):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "moert", "run", str(model), "-p", "1 2 3", "-n", "2", "-t", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    gpu, first = r.stderr.splitlines()[:2]                # the GPU line, then the plan's warning
    assert gpu.startswith("GPU: none (no CUDA device: ") and "--gpu-backend sim" in gpu, r.stderr
    assert first.startswith("warning: no usable GPU backend") and "--gpu-backend sim" in first, r.stderr
    assert "PlacementWarning" not in r.stderr and "gpu_backend=" not in r.stderr and ".py:" not in r.stderr


def test_fit_on_places_what_fits_before_loading(model, capsys):
    args = ["run", str(model), "-p", "1 2 3", "-n", "2", "-t", "1", "--gpu-backend", "sim", "--gpu-mem", "4MiB",
            "-c", "0", "-v", "--no-warmup", "-ctk", "f32", "-ctv", "f32"]
    assert main(args + ["--fit", "on"]) == 0
    err = capsys.readouterr().err
    assert "tensor blk.2.ffn_up_exps.weight" in err and "overridden to CPU" in err      # fit's rules, logged by -v
    assert main(args + ["--fit", "on", "--fit-target", "2"]) == 1                       # 2 of 4 MiB kept free
    assert "--fit on: does not fit" in capsys.readouterr().err


def test_tensor_split_shares_the_gpu_layers(model, capsys):
    import json

    assert main(["inspect", str(model), "--gpu-backend", "sim", "--gpu-mem", "1GiB,1GiB", "-ts", "1,3",
                 "--json"]) == 0
    layer_dev = {t["name"].split(".")[1]: t["device"] for t in json.loads(capsys.readouterr().out)["plan"]["tensors"]
                 if t["name"].startswith("blk.")}
    assert layer_dev == {"0": "sim:0", "1": "sim:1", "2": "sim:1"}       # 4 layers (output too) split 1:3


def test_no_mmap_is_a_run_flag(parser):
    """--no-mmap reads the model into memory (moert.load(mmap=False)) for the commands that run a model."""
    assert parser.parse_args(["run", "m.gguf", "--no-mmap"]).mmap is False
    assert parser.parse_args(["run", "m.gguf"]).mmap is True
