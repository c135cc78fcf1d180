"""Hardware from JSON files (moert/cost/machines.py): a part beside presets, a whole machine, a calibrated CPU, and
every way a file can be wrong."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

import moert
from moert import cost
from moert.cli.main import main
from moert.cost.hardware import HardwareError

RTX3080 = {"name": "rtx3080", "mem_gib": 10, "bw_gbs": 760, "fp16_tflops": 59.5, "int8_tops": 238}


def _write(tmp_path, name: str, obj) -> str:
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(p)


def test_a_gpu_file_beside_a_preset_cpu_is_costed_like_a_preset(tmp_path):
    hw = cost.preset(_write(tmp_path, "my-3080.json", RTX3080) + "+ryzen-7950x")
    assert hw.name == "rtx3080+ryzen-7950x" and hw.cpu is cost.CPUS["ryzen-7950x"]
    (g,) = hw.gpus
    assert (g.mem_gib, g.bw_gbs, g.fp16_tflops, g.int8_tops) == (10, 760, 59.5, 238)
    assert g.bw_efficiency == cost.GPUS["rtx3090"].bw_efficiency           # defaults as for presets
    assert hw.link.name == "pcie4x16"                                          # the presets' PCIe rule
    two = cost.preset("2x " + str(tmp_path / "my-3080.json") + "+epyc-9554")
    assert len(two.gpus) == 2 and two.name == "2x rtx3080+epyc-9554"


def test_a_machine_file_mixes_preset_names_and_fields(tmp_path):
    box = {"name": "my box", "cpu": "ryzen-7950x", "gpus": [RTX3080, "rtx3090"], "link": "pcie4x16"}
    hw = cost.preset(_write(tmp_path, "box.json", box))
    assert hw.name == "my box" and [g.name for g in hw.gpus] == ["rtx3080", "rtx3090"]
    assert hw.link is cost.LINKS["pcie4x16"] and hw.cpu.name == "ryzen-7950x"
    cpu_only = cost.preset(_write(tmp_path, "cpu-box.json", {"cpu": {"name": "c", "cores": 8, "mem_bw_gbs": 76.8}}))
    assert cpu_only.gpus == () and cpu_only.link is None and cpu_only.cpu.read_gbs() == pytest.approx(0.7 * 76.8)


def test_every_preset_part_and_a_calibrated_cpu_round_trip_through_json(tmp_path):
    from moert.cost import machines as hardware_json

    for kind, parts in (("cpu", cost.CPUS), ("gpu", cost.GPUS), ("link", cost.LINKS)):
        for p in parts.values():
            assert hardware_json.part(json.loads(json.dumps(asdict(p))), kind) == p
    cpu = moert.CPU("local (test)", 2, 15.0, kernel_gbs=(("Q4_K", 2.5),), kernel_gflops=(("KV", 12.0),),
                    bw_1thread_gbs=10.0)
    path = _write(tmp_path, "here.json", asdict(cpu))          # what `moert hardware calibrate --json` writes
    assert hardware_json.read(path) == cpu
    assert cost.preset("rtx3090+" + path).cpu == cpu


@pytest.mark.parametrize("content, message", [
    ('{"name": "x", "mem_gib": "10", "bw_gbs": 760, "fp16_tflops": 59.5}', "mem_gib must be a number, got '10'"),
    ('{"name": "x", "mem_gib": true, "bw_gbs": 760, "fp16_tflops": 59.5}', "mem_gib must be a number"),
    ('{"name": "x", "mem_gib": 10, "bw_gbs": 760, "fp16_tflop": 59.5}', "unknown field(s) 'fp16_tflop'"),
    ('{"name": "x", "mem_gib": 10, "bw_gbs": 760}', "missing fp16_tflops"),
    ('{"name": "x", "mem_gib": 10, "bw_gbs": 0, "fp16_tflops": 59.5}', "bw_gbs must be > 0"),
    ('{"name": "c", "cores": 8.5, "mem_bw_gbs": 80}', "cores must be a whole number"),
    ('{"name": "c", "cores": 8, "mem_bw_gbs": 80, "kernel_gbs": [["Q4_K", -1]]}', "list of [name, rate > 0] pairs"),
    ('{"name": "x", "mem_gib": 10, "bw_gbs": NaN, "fp16_tflops": 59.5}', "bw_gbs must be a number"),
    ("[1, 2]", "holds a list; give an object"),
    ("{nope", "is not JSON"),
    ('{"foo": 1}', "cannot tell what part this is"),
    ('{"cpu": "ryzen-0000"}', "unknown cpu 'ryzen-0000'"),
    ('{"cpu": "ryzen-7950x", "gpus": "rtx3090"}', '"gpus" must be a list'),
    ('{"cpu": "ryzen-7950x", "gpus": [7]}', "a gpu is a preset name or an object of fields"),
    ('{"gpus": ["rtx3090"]}', 'a machine needs a "cpu"'),
    ('{"cpu": "ryzen-7950x", "gpu": ["rtx3090"]}', "unknown field(s) 'gpu'"),
])
def test_a_wrong_file_is_a_hardware_error_saying_what_and_where(tmp_path, content, message):
    path = _write(tmp_path, "bad.json", content)
    with pytest.raises(HardwareError) as e:
        cost.preset(path if content.startswith(('{"cpu"', '{"gpus"')) else path + "+ryzen-7950x")
    assert message in str(e.value) and "bad.json" in str(e.value)


def test_files_that_are_missing_huge_or_a_machine_among_parts_are_refused(tmp_path):
    from moert.cost import machines as hardware_json

    with pytest.raises(HardwareError, match="No such file"):
        cost.preset(str(tmp_path / "none.json") + "+ryzen-7950x")
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(hardware_json.MAX_BYTES + 1)                             # sparse: nothing is written or read
    with pytest.raises(HardwareError, match="a description of a machine is a few hundred"):
        cost.preset(str(huge) + "+ryzen-7950x")
    box = _write(tmp_path, "box.json", {"cpu": "ryzen-7950x", "gpus": ["rtx3090"]})
    with pytest.raises(HardwareError, match="describes a whole machine; give it alone"):
        cost.preset(box + "+rtx3090")


def test_the_readmes_two_commands_calibrate_to_a_file_and_compare_with_it(tmp_path, capsys, monkeypatch):
    from moert.cost import calibrate as cal

    monkeypatch.setattr(cal, "read_bandwidth", lambda mib, rounds, threads: 7.5)     # calibrate's parts, made fast
    monkeypatch.setattr(cal, "kernel_rates", lambda mib, rounds: ({"Q4_K": 2.5}, {"Q4_K": 20.0, "*": 30.0}))
    monkeypatch.setattr(cal, "call_overhead_us", lambda n: 3.0)
    monkeypatch.setattr(cal, "model_overheads", lambda steps, detail=False: {
        "layer_us": 100.0, "token_us": 50.0, "layer_us_spread": (100.0, 100.0), "busy": False, "median_over_min": 1.0,
        "negative_slope": False})
    monkeypatch.setattr(cal, "attention_gflops", lambda rounds: 12.0)
    assert main(["hardware", "calibrate", "-t", "1", "--json"]) == 0              # > here.json
    here = _write(tmp_path, "here.json", capsys.readouterr().out)
    gpu = _write(tmp_path, "my-3080.json", RTX3080)
    assert main(["compare", "zoo:olmoe-1b-7b", "--hardware", f"{gpu}+{here}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hardware"].startswith("rtx3080+local (") and any(r["best"] for r in out["rows"])


def test_hostile_files_and_figures_end_in_hardware_errors(tmp_path):
    from moert.cost import machines as hardware_json

    deep = _write(tmp_path, "deep.json", "[" * 100_000)                       # under the cap, too deep to parse
    with pytest.raises(HardwareError, match="is not JSON"):
        hardware_json.read(deep)
    with pytest.raises(HardwareError, match="over 1,048,576 bytes"):           # no size to stat: read up to the cap
        hardware_json.read("/dev/zero")
    huge_int = '{"name": "c", "cores": 1' + "0" * 400 + ', "mem_bw_gbs": 80}'
    with pytest.raises(HardwareError, match="cores must be a number"):
        hardware_json.read(_write(tmp_path, "int.json", huge_int))
    for fields, message in (({"pcie_gen": 2}, "pcie_gen must be one of 3, 4, 5"), ({"pcie_lanes": 0}, "pcie_lanes"),
                            ({"launch_us": -1}, "launch_us must be >= 0"), ({"reserved_gib": -2}, "reserved_gib")):
        with pytest.raises(HardwareError, match=message):
            cost.preset(_write(tmp_path, "g.json", {**RTX3080, **fields}) + "+ryzen-7950x")
    with pytest.raises(HardwareError, match="latency_us must be >= 0"):
        hardware_json.read(_write(tmp_path, "l.json", {"bw_gbs": 31.5, "latency_us": -100}))
    with pytest.raises(HardwareError, match="bw_1thread_gbs must be >= 0"):
        hardware_json.read(_write(tmp_path, "c.json", {"name": "c", "cores": 8, "mem_bw_gbs": 80,
                                                       "bw_1thread_gbs": -5}))
    for gpus in ({}, 0, False, ""):                                             # falsy, still not a list
        with pytest.raises(HardwareError, match='"gpus" must be a list'):
            hardware_json.read(_write(tmp_path, "m.json", {"cpu": "ryzen-7950x", "gpus": gpus}))
    with pytest.raises(HardwareError, match="at most 64"):
        hardware_json.read(_write(tmp_path, "many.json", {"cpu": "ryzen-7950x", "gpus": ["rtx3090"] * 65}))


def test_a_count_goes_before_a_gpu_or_a_cpu_and_is_bounded(tmp_path):
    cpu = _write(tmp_path, "cpu.json", {"name": "c", "cores": 8, "mem_bw_gbs": 80})
    for name in ("0x rtx3090+ryzen-7950x", "100000000x rtx3090+ryzen-7950x", "rtx3090+9x " + cpu,
                 "rtx3090+2x pcie4x16"):
        with pytest.raises(HardwareError, match="a count .* goes before a GPU, from 1 to 64, or before a CPU, its "
                                                "sockets, from 1 to 8"):
            cost.preset(name)
    two = cost.preset("rtx3090+2x " + cpu).cpu                  # before a CPU: its sockets, one NUMA node each
    assert (two.cores, two.mem_bw_gbs, two.numa_nodes) == (16, 160.0, 2)
    assert cost.preset("2x ryzen-7950x").cpu.numa_nodes == 2
    with pytest.raises(HardwareError, match="unknown part '2.5x rtx3090'"):
        cost.preset("2.5x rtx3090+ryzen-7950x")
    assert len(cost.preset("3x rtx3090+ryzen-7950x").gpus) == 3
