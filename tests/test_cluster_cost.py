"""The cost model across machines (moert/cost/cluster.py) and `moert compare --cluster`: no Ray needed."""

from __future__ import annotations

import json

import pytest

from moert import gguf
from moert.cost.cluster import NETS, cluster, network_seconds, predict_cluster
from moert.cost.hardware import HardwareError
from moert.placement.rules import parse_overrides
from moert.testing import write_qwen3moe


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_qwen3moe(tmp_path_factory.mktemp("cc") / "m.gguf", n_layer=4, n_embd=128, n_expert=8,
                          n_expert_used=2, n_ff_exp=256)


def test_cluster_specs_and_their_errors():
    c = cluster("4x(epyc-9354+ram-192GiB)", "25gbe")
    assert len(c.hosts) == 4 and c.hosts[0].ram_bytes == 192 << 30 and c.hosts[3].hardware.cpu.cores == 32
    assert c.net.gbs == 3.125 and c.name == "4x(epyc-9354+ram-192GiB) over 25gbe"
    mixed = cluster("epyc-9554+ram-384GiB,2x(epyc-9354)", "ib-hdr")
    assert [h.hardware.cpu.name for h in mixed.hosts] == ["epyc-9554", "epyc-9354", "epyc-9354"]
    assert mixed.hosts[1].ram_bytes is None
    for bad in ("4x()", "0x(epyc-9354)", "epyc-9354+ram-1GiB+ram-2GiB", "4x(ram-192GiB)", "4x(no-such-cpu)"):
        with pytest.raises(HardwareError):
            cluster(bad, "25gbe")
    with pytest.raises(HardwareError, match="network preset"):
        cluster("epyc-9354", "5gbe")


def test_network_seconds_by_hand():
    net = NETS["10gbe"]                        # 1.25 GB/s x 0.9, 150 us each way
    D, K, B = 7168, 8, 1
    sent, back = 12 + 4 * D + 8 * K, 4 * D + 8
    # 3 workers at once, plain actor calls: 969 us + 2 x 53.5 us of Ray (the quickstart's classic call, and 1:n
    # async calls), 2 x 150 us of wire latency, 3 x both messages at 1.125 GB/s
    wire = 300e-6 + 3 * (sent + back) / 1.125e9
    want = (969 + 2 * 1e6 / 18694) * 1e-6 + wire
    assert network_seconds(net, 3, D, K, B, calls="plain") == pytest.approx(want, rel=1e-12)
    # a compiled graph (the default): the quickstart's 86.7 us, none added per further worker
    assert network_seconds(net, 3, D, K, B) == pytest.approx(86.7e-6 + wire, rel=1e-12)
    assert network_seconds(net, 0, D, K, B) == 0.0
    with pytest.raises(HardwareError, match="calls='rpc'"):
        network_seconds(net, 1, D, K, B, calls="rpc")
    one = (1000 + 300) * 1e-6 + (sent + back) / 1.125e9
    assert network_seconds(net, 1, D, K, B, call_us=1000) == pytest.approx(one)


def test_one_host_is_bound_by_its_dram_by_hand(path):
    g = gguf.open(path)
    t = g.tensors
    experts = sum(x.nbytes for n, x in t.items() if "_exps" in n)
    dense = sum(x.nbytes for n, x in t.items() if "_exps" not in n) - t["token_embd.weight"].nbytes
    rate = 0.75 * 12 * 4800 * 8 / 1e3 * 1e9    # epyc-9354: 12 channels DDR5-4800 at the 0.75 share, B/s
    r = predict_cluster(str(path), cluster("epyc-9354", "25gbe"))
    # decode: the dense bytes, and per layer the K of E experts one token selects (q = K/E)
    assert 1 / r.decode_tok_s == pytest.approx(dense / rate + experts * 2 / 8 / rate, rel=1e-9)
    assert r.bound("decode").startswith("host DRAM") and r.ot == "" and r.hosts[0]["experts"] == 8


def test_hosts_split_the_experts_and_the_network_bounds_decode(path):
    rs = {n: predict_cluster(str(path), cluster("3x(epyc-9354+ram-1GiB)", n)) for n in NETS if n != "local"}
    r = rs["25gbe"]
    assert [h["experts"] for h in r.hosts] == [3, 3, 2] and r.fits
    rules = parse_overrides(r.ot)
    assert [x.device for x in rules] == ["ray:0", "ray:1"] and rules[0].experts == (3, 4, 5)
    assert rules[1].experts == (6, 7)
    assert r.bound("decode") == "network latency per layer"   # a tiny model: Ray's calls dominate
    assert r.terms["decode"]["network latency per layer"] == pytest.approx(
        4 * network_seconds(NETS["25gbe"], 2, 128, 2, 1) + 4 * _worker_read(path, 3), rel=1e-6)
    order = [rs[n].decode_tok_s for n in ("1gbe", "10gbe", "25gbe", "100gbe", "ib-hdr")]
    assert order == sorted(order)                              # faster networks, faster decode
    assert not predict_cluster(str(path), cluster("2x(epyc-9354+ram-1MiB)", "25gbe")).fits


def _worker_read(path, n_experts: int) -> float:
    g = gguf.open(path)
    per_expert = sum(x.nbytes for n, x in g.tensors.items() if "_exps" in n) / 4 / 8
    return n_experts * (2 / 8) * per_expert / (0.75 * 460.8e9)


def test_compare_cluster_command(path, capsys):
    from moert.cli.main import main

    assert main(["compare", str(path), "--cluster", "2x(epyc-9354+ram-192GiB)", "--net", "10gbe", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["nets"]) == {"1gbe", "10gbe", "25gbe", "100gbe", "ib-hdr"} and out["ot"].startswith(r"\.ffn_")
    assert main(["compare", str(path), "--cluster", "2x(epyc-9354+ram-192GiB)"]) == 0
    assert "25gbe" in capsys.readouterr().out


def test_predict_of_one_machine_refuses_a_plan_with_ray_workers(path):
    import moert
    from moert.cost.machines import preset
    from moert.errors import PlacementError

    p = moert.plan(str(path), r"blk\.0\.ffn_.*_exps=RAY0", gpu_layers=0)
    with pytest.raises(PlacementError, match="Ray workers.*--cluster"):
        moert.predict(p, preset("ryzen-7950x"))
