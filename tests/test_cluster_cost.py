"""The cost model across machines (moert/cost/cluster.py) and `moert compare --cluster`: no Ray needed."""

from __future__ import annotations

import json

import pytest

from moert import gguf
from moert.cost.cluster import NETS, busiest_share, cluster, local_added, network_seconds, predict_cluster
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
    # a compiled graph (the default): ray-project/ray#41769's 20,931.29 calls/s of one actor, and 8,896.79/s of 4
    # at once, so (112.40 - 47.78) / 3 = 21.54 us for each further actor: 47.78 + 2 x 21.54 = 90.85 us for 3
    assert network_seconds(net, 3, D, K, B) == pytest.approx(90.85e-6 + wire, rel=1e-4)
    assert network_seconds(NETS["local"], 1, D, K, B) == pytest.approx(47.78e-6 + (sent + back) / 9e9, rel=1e-4)
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
        4 * (network_seconds(NETS["25gbe"], 2, 128, 2, 1) + 250e-6) + 4 * _worker_read(path, 3), rel=1e-6)
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


def test_busiest_share_by_hand():
    # E 16 in halves, K 4: P(a half holds 0, 1, 2, 3, 4 of them) = (70, 448, 784, 448, 70) / 1820 (C(8,c) C(8,4-c)
    # over C(16,4)), so the busier half expects (2 x 70 x 4 + 2 x 448 x 3 + 784 x 2) / 1820 = 4816 / 1820
    assert busiest_share(16, 4, 2) == pytest.approx(4816 / 1820, rel=1e-12)
    # E 5 as shares 3 and 2, K 2: (2, 0) in 3 ways, (1, 1) in 6, (0, 2) in 1 of 10: (3 x 2 + 6 x 1 + 1 x 2) / 10
    assert busiest_share(5, 2, 2) == pytest.approx(1.4, rel=1e-12)
    assert busiest_share(16, 4, 1) == 4.0 and busiest_share(16, 1, 4) == 1.0
    assert busiest_share(8, 8, 8) == 1.0                 # every expert, one on each worker
    with pytest.raises(HardwareError, match="K <= E"):
        busiest_share(4, 5, 2)


def test_local_added_sums_its_terms_by_hand():
    D, K, E = 256, 4, 16
    t = local_added(2, D, K, E, expert_s=40e-6, fused_s=50e-6, glue_s=10e-6)
    # Ray: 47.78 + 21.54 us for two workers, and the messages (2 x (1068 + 1032) bytes at 9 GB/s); kernels: the busier
    # half's 4816 / 1820 experts instead of 4, at 40 us each; the fused layer's 50 us and the glue's 10 us as given
    assert t["ray"] == pytest.approx(69.32e-6 + 2 * 2100 / 9e9, rel=1e-4)
    assert t["kernels"] == pytest.approx((4816 / 1820 - 4) * 40e-6, rel=1e-12)
    assert (t["fused"], t["glue"], t["busy"]) == (50e-6, 10e-6, 250e-6)     # busy: the 16-core run's excess
    assert t["total"] == pytest.approx(t["ray"] + t["kernels"] + 310e-6, rel=1e-12)
    plain = local_added(2, D, K, E, 40e-6, calls="plain")
    assert plain["ray"] == pytest.approx((969 + 1e6 / 18694) * 1e-6 + 2 * 2100 / 9e9, rel=1e-9)
