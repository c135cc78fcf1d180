"""Prediction across machines: a model's experts spread over the hosts of a cluster (moert/cluster/actors.py runs it).

    c = cluster("4x(epyc-9354+ram-192GiB)", "25gbe")     # hosts (each a preset machine + its RAM) and the network
    r = predict_cluster("zoo:deepseek-v3", c)             # r.decode_tok_s, r.prefill_tok_s, r.bound, print(r.table())

The layout is the one `--ray` runs: host 0 holds the dense tensors (attention, routers, shared experts, the
output) and 1/N of every MoE layer's experts; host h > 0 holds the next 1/N as Ray worker RAY<h-1> (one expert-set
rule per worker, printed as `r.ot`). Per MoE layer the head sends each worker one message, all at once, and
runs its own share meanwhile (moert/experts.py), so a layer takes the slowest host's time:

  host h's experts  read time: E_h x q_B x expert bytes / the host's read rate (DRAM, or GPU if they fit there),
                    with q_B = 1 - (1 - K/E)^B the chance an expert is used by B tokens; or its FLOPs
                    2 x K x B x (E_h/E) x expert params / its rate, whichever is larger (a roofline);
  a worker's call   the Ray call (RAY_CALL_US, plus RAY_EXTRA_US per other worker called at once: Ray's published
                    microbenchmarks for a compiled graph, the default, or plain actor calls) + 2 x the network's
                    one-way latency + the bytes both ways through the head's one NIC / its bandwidth:
                    to each worker 12 + B x (4D + 8K) bytes (4 more, the layer key, in a compiled step), back
                    4 B D + 8 (cluster/worker.py's messages);
  the dense part    the head's dense bytes / its read rate (decode), or FLOPs / its rate (prefill).

It is a roofline composition (no per-op costs, KV reads at depth 0), meant to say which of host DRAM, the
network's latency per layer, or its bandwidth in prefill bounds a cluster, not to the last percent; the network
terms are checked against what moert measures on a local cluster (bench/bench_cluster.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from moert.cost.hardware import Hardware, HardwareError

# What Ray adds to one layer's call of its workers, by how moert calls them (moert/cluster/graph.py):
#   "compiled" (the default): Ray's compiled-graph microbenchmark (python/ray/_private/ray_experimental_perf.py,
#     `execute` of an echo actor + `ray.get`, bytes in and out) as ray-project/ray#41769 published it, one machine:
#     "compiled single-actor DAG calls per second 20931.29" (47.8 us a call) and "compiled scatter-gather DAG calls,
#     n=4 actors per second 8896.79" (112.4 us), so (112.4 - 47.8) / 3 = 21.5 us for each further actor the driver
#     writes to and reads from (serially, on its one thread): 69.3 us for two. Not read from any of moert's
#     measurements (bench/bench_cluster.py's runs neither set nor scale it); chosen after they were known, as the one
#     published figure with several actors, in place of Ray's quickstart's one echo actor (86.7 us, one timed call,
#     https://docs.ray.io/en/latest/ray-core/compiled-graph/quickstart.html), which is higher: the change moved the
#     2-worker prediction away from those runs, not toward them.
#   "plain" (MOERT_RAY_CALLS=plain): the same quickstart's classic actor call + ray.get, 969 us ("the classic Ray
#     Core APIs usually have 1 ms+ system overhead"); each further worker called at once adds the caller's share of
#     "1:n actor calls async", 18,694/s on the machine of ray-project/ray#16222 (~53 us). Neither read from
#     bench/bench_cluster.py's runs; 969 us replaced the 500 us below after its first runs were known.
# (Round trips, not throughput: Ray's "1:1 actor calls sync" ~2,000/s microbenchmark rate, 0.5 ms, is a loop of
# calls on a many-core machine and predicted 50-53% under what bench/bench_cluster.py measured here.)
RAY_CALL_US = {"compiled": 1e6 / 20931.29, "plain": 969.0}
RAY_EXTRA_US = {"compiled": (1e6 / 8896.79 - 1e6 / 20931.29) / 3, "plain": 1e6 / 18694}
# A worker that runs kernels in a call costs more than an echo of the same message plus its kernels. moert's own
# measurement, a 16-core host, `bench/bench_cluster.py --workers 2 --rounds 5` (min / median ms): compiled graph
# 0.438 / 0.558 added per MoE layer against 0.189 predicted without this term, so 0.249 / 0.369 more; Ray's compiled
# floor 0.104 / 0.116 echoing, 0.347 / 0.392 with the actors spinning as long as a worker's kernels (0.255). The
# min's excess, 0.25 ms a layer call, is the term (a woken worker's caches and thread pool); read from that one run
# (in sample for it), with each of its 3 processes on 16 kernel threads on the 16 cores (the bench now splits them).
WORKER_BUSY_US = 250.0


@dataclass(frozen=True)
class Net:
    """The network between the hosts: line rate, the payload share TCP gets, and one-way latency of a Ray call."""

    name: str
    gbs: float                 # line rate, GB/s (1e9 B/s)
    latency_us: float          # one way, added to a Ray call on one machine (RAY_CALL_US)
    source: str
    efficiency: float = 0.9    # TCP payload share of the line rate (assumed)

    @property
    def payload_gbs(self) -> float:
        return self.gbs * self.efficiency


# Line rates: IEEE 802.3ab/ae/by/bj (1, 10, 25, 100 Gb/s), InfiniBand HDR 4x = 200 Gb/s. Latency of a Ray call
# across the network: ray-project/ray#7550 measured a local actor call at ~0.7 ms and a remote one over 10 Gb at
# "larger than 1 ms", i.e. ~0.15 ms each way on 10 GbE; the others are assumed around it (Ray speaks gRPC over TCP,
# so its per-call software cost, not the wire, dominates: IPoIB on InfiniBand, no RDMA).
NETS: dict[str, Net] = {n.name: n for n in (
    Net("local", 10.0, 0.0, "one machine: loopback, the object store in shared memory (moert's own measurement)"),
    Net("1gbe", 0.125, 200.0, "IEEE 802.3ab line rate; latency assumed: 10 GbE's + slower frames"),
    Net("10gbe", 1.25, 150.0, "IEEE 802.3ae line rate; latency from ray-project/ray#7550 (remote vs local actor call)"),
    Net("25gbe", 3.125, 120.0, "IEEE 802.3by line rate; latency assumed (between 10 and 100 GbE)"),
    Net("100gbe", 12.5, 100.0, "IEEE 802.3bj line rate; latency assumed (kernel TCP + gRPC dominate)"),
    Net("ib-hdr", 25.0, 50.0, "InfiniBand HDR 4x 200 Gb/s line rate; latency assumed (IPoIB: Ray does not use RDMA)"),
)}


@dataclass(frozen=True)
class Host:
    """One machine of the cluster: its CPU (and GPUs), and its RAM (None: not checked)."""

    hardware: Hardware
    ram_bytes: int | None = None

    @property
    def name(self) -> str:
        ram = f"+ram-{self.ram_bytes / 2**30:g}GiB" if self.ram_bytes else ""
        return f"{self.hardware.name}{ram}"


@dataclass(frozen=True)
class Cluster:
    hosts: tuple[Host, ...]
    net: Net

    @property
    def name(self) -> str:
        names = [h.name for h in self.hosts]
        if len(set(names)) == 1:
            return f"{len(names)}x({names[0]}) over {self.net.name}"
        return f"{', '.join(names)} over {self.net.name}"


_GROUP = re.compile(r"^\s*(?:(\d+)\s*x\s*)?\(?([^()]*?)\)?\s*$")
_RAM = re.compile(r"^ram-([0-9.]+\s*[A-Za-z]*)$", re.IGNORECASE)


def cluster(spec: str, net: str = "25gbe") -> Cluster:
    """Hosts from '4x(epyc-9354+ram-192GiB)' or 'epyc-9554+ram-384GiB,3x(epyc-9354+ram-192GiB)' (the first host is
    the head), each a preset machine (moert/cost/machines.py) with an optional ram-SIZE part (else its CPU part's
    mem_gib, when a JSON part gives one); `net` a NETS name."""
    from moert.cost.machines import preset
    from moert.devices import parse_size

    if net not in NETS:
        raise HardwareError(f"--net {net!r} is not a network preset; one of {', '.join(NETS)}")
    hosts: list[Host] = []
    for group in _split(spec):
        m = _GROUP.match(group)
        if not m or not m.group(2):
            raise HardwareError(f"--cluster {spec!r}: {group!r} is not [Nx](machine[+ram-SIZE]), e.g. "
                                f"4x(epyc-9354+ram-192GiB)")
        count = int(m.group(1) or 1)
        parts = [p.strip() for p in m.group(2).split("+")]
        rams = [p for p in parts if _RAM.match(p)]
        machine = "+".join(p for p in parts if not _RAM.match(p))
        if not machine or len(rams) > 1 or not 1 <= count <= 256:
            raise HardwareError(f"--cluster {spec!r}: {group!r} needs one machine (a CPU preset, GPUs with it), at "
                                f"most one ram-SIZE, and 1 to 256 hosts")
        hw = preset(machine)
        ram = parse_size(_RAM.match(rams[0]).group(1)) if rams else (int(hw.cpu.mem_gib * 2**30) or None)
        hosts += [Host(hw, ram)] * count           # no ram-SIZE: the CPU part's mem_gib, if it has one
    return Cluster(tuple(hosts), NETS[net])


def _split(spec: str) -> list[str]:
    """Split on commas outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in spec:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [g for g in (*out, cur) if g.strip()]


def network_seconds(net: Net, workers: int, D: int, K: int, B: int, call_us: float | None = None,
                    calls: str = "compiled") -> float:
    """The network's and Ray's time for one MoE layer with `workers` remote workers called at once, B tokens.
    calls: "compiled" (a Ray Compiled Graph, moert's default) or "plain" (actor calls); call_us: Ray's cost of
    calling them all on one machine, if measured (default: Ray's published figure for `calls`)."""
    if workers <= 0:
        return 0.0
    if calls not in RAY_CALL_US:
        raise HardwareError(f"calls={calls!r}: one of {', '.join(RAY_CALL_US)}")
    sent, back = 12 + B * (4 * D + 8 * K), 4 * B * D + 8
    call = RAY_CALL_US[calls] + (workers - 1) * RAY_EXTRA_US[calls] if call_us is None else call_us
    return ((call + 2 * net.latency_us) * 1e-6
            + workers * (sent + back) / (net.payload_gbs * 1e9))


def busiest_share(E: int, K: int, workers: int) -> float:
    """Expected experts of one token on the busiest of `workers` holders of E's experts in even shares (as
    predict_cluster splits them), the router's K distinct experts drawn uniformly: a multivariate hypergeometric,
    exact (P(max <= m) from the product of each holder's C(share, c) with c <= m, counted at degree K)."""
    from math import comb

    if not 1 <= K <= E or not 1 <= workers <= E:
        raise HardwareError(f"busiest_share(E={E}, K={K}, workers={workers}): needs 1 <= K <= E, 1 <= workers <= E")
    shares = [E // workers + (1 if w < E % workers else 0) for w in range(workers)]
    expected = 0.0
    for m in range(K):                        # E[max] = sum over m of P(max > m)
        ways = [1] + [0] * K                  # ways[k]: draws of k experts with at most m from each holder so far
        for s in shares:
            ways = [sum(ways[k - c] * comb(s, c) for c in range(min(m, s, k) + 1)) for k in range(K + 1)]
        expected += 1 - ways[K] / comb(E, K)
    return expected


def local_added(workers: int, D: int, K: int, E: int, expert_s: float, fused_s: float = 0.0, glue_s: float = 0.0,
                calls: str = "compiled") -> dict[str, float]:
    """What bench/bench_cluster.py measures: the seconds per MoE layer of one decoded token that moving a layer's
    experts to `workers` Ray workers on this machine (E/workers each) adds over running them in this process, by
    term (their sum under "total"):
      ray       network_seconds over NETS["local"]: Ray's published call for this many workers + the messages;
      kernels   the workers run their shares at once, so the layer waits for the busiest one's experts
                (busiest_share of the K) instead of all K on the host: (busiest - K) x expert_s, one expert's
                kernel seconds for one token (the same kernels, measured on the host);
      fused     fused_s: what the single process saves per layer by running a decode step's layer as one fused
                kernel call (moert/fused.py), which a layer with remote experts cannot use;
      glue      glue_s: the host's own work per layer call (masks, one message per worker, the partial sums);
      busy      WORKER_BUSY_US: what a worker running kernels adds beyond them and Ray's echo.
    expert_s, fused_s and glue_s are moert's own CPU work on the machine, measured apart from the added cost.
    Ray's figures are from a machine with a core for each process: on one with fewer cores than the host and its
    workers, the measured cost is several times this (bench/RESULTS.md, ray_schedule.py; bench/HISTORY.md,
    2026-11-25 01:37-02:18)."""
    t = dict(ray=network_seconds(NETS["local"], workers, D, K, 1, calls=calls),
             kernels=(busiest_share(E, K, workers) - K) * expert_s, fused=fused_s, glue=glue_s,
             busy=WORKER_BUSY_US * 1e-6 if workers else 0.0)
    t["total"] = sum(t.values())
    return t


@dataclass
class ClusterPrediction:
    """Predicted speed of a model's experts spread over a cluster, with every term kept."""

    model: str
    cluster: Cluster
    decode_tok_s: float
    prefill_tok_s: float
    terms: dict[str, dict[str, float]]          # phase -> term -> seconds (per token / per prompt)
    hosts: list[dict] = field(default_factory=list)   # per host: experts, weight bytes, RAM, fits
    ot: str = ""

    def bound(self, phase: str = "decode") -> str:
        """What bounds a phase: the largest term."""
        t = self.terms[phase]
        return max(t, key=t.get)

    @property
    def fits(self) -> bool:
        return all(h["fits"] for h in self.hosts)

    def table(self) -> str:
        lines = [f"{self.model} on {self.cluster.name}: decode {self.decode_tok_s:.2f} tok/s (bound: "
                 f"{self.bound('decode')}), prefill {self.prefill_tok_s:.1f} tok/s (bound: {self.bound('prefill')})"]
        for phase, unit in (("decode", "ms/token"), ("prefill", "ms/prompt")):
            lines.append(f"  {phase:<8} " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in self.terms[phase].items())
                         + f" ({unit})")
        for i, h in enumerate(self.hosts):
            ram = f"{h['ram_gib']:.0f} GiB RAM" if h["ram_gib"] else "RAM unchecked"
            lines.append(f"  host {i} ({'head' if i == 0 else f'RAY{i - 1}'}): {h['experts']} experts/layer, "
                         f"{h['gib']:.1f} GiB of weights, {ram}{'' if h['fits'] else '  DOES NOT FIT'}")
        return "\n".join(lines)


def predict_cluster(model: str, c: Cluster, n_prompt: int = 512, n_ubatch: int = 512) -> ClusterPrediction:
    """Decode and prefill tok/s of `model` (a GGUF path or zoo:NAME) with its experts spread over c's hosts."""
    from moert.cost.zoo import resolve
    from moert.placement.plan import _has_expert_axis, model_info

    info = model_info(resolve(model))
    md, arch = info.metadata, info.arch
    D, E, K = (int(md[f"{arch}.{k}"]) for k in ("embedding_length", "expert_count", "expert_used_count"))
    held = sum(nb for n, (_, shape, nb) in info.tensors.items() if not _has_expert_axis(n, shape))
    dense = held - info.tensors.get("token_embd.weight", (0, 0, 0))[2]    # read per token (embd: a row lookup)
    experts = {n: nb for n, (_, shape, nb) in info.tensors.items() if _has_expert_axis(n, shape)}
    layers = sorted({int(n.split(".")[1]) for n in experts})
    per_expert = sum(experts.values()) / len(layers) / E             # bytes of one expert of one layer
    params_per_expert = per_expert / _bytes_per_param(info.tensors, experts)
    N = len(c.hosts)
    share = [E // N + (1 if h < E % N else 0) for h in range(N)]     # experts per layer on each host
    B = min(n_ubatch, n_prompt)

    def experts_s(h: int, tokens: int) -> float:
        host = c.hosts[h]
        q = 1 - (1 - K / E) ** tokens
        read = share[h] * q * per_expert / (_read_gbs(host, share[h] * per_expert * len(layers)) * 1e9)
        flops = 2 * K * tokens * share[h] / E * params_per_expert / (host.hardware.cpu.matmul_gflops("*") * 1e9)
        return max(read, flops)

    head = c.hosts[0]
    terms = {}
    for phase, tokens, reps in (("decode", 1, 1), ("prefill", B, -(-n_prompt // B))):
        net = network_seconds(c.net, N - 1, D, K, tokens) + WORKER_BUSY_US * 1e-6 * (N > 1)
        per_layer = [experts_s(h, tokens) + (net if h else 0.0) for h in range(N)]
        slowest = max(range(N), key=lambda h: per_layer[h])
        dense_s = max(dense / (_read_gbs(head, dense) * 1e9),
                      2 * tokens * dense / _bytes_per_param(info.tensors, {}) / (head.hardware.cpu.matmul_gflops("*")
                                                                                  * 1e9))
        # a layer waits for the slowest host: name the part that is the bigger share of it
        if slowest and net > experts_s(slowest, tokens):
            key = "network latency per layer" if phase == "decode" else "network (latency + bandwidth)"
            ex = {key: reps * len(layers) * per_layer[slowest]}
        else:
            ex = {f"host DRAM (experts, host {slowest})": reps * len(layers) * per_layer[slowest]}
        terms[phase] = {"head dense": reps * dense_s, **ex}
    decode_s = sum(terms["decode"].values())
    prefill_s = sum(terms["prefill"].values())
    hosts = []
    for h, host in enumerate(c.hosts):
        weights = share[h] * per_expert * len(layers) + (held if h == 0 else 0)
        fits = host.ram_bytes is None or weights <= host.ram_bytes * 0.95
        hosts.append(dict(name=host.name, experts=share[h], gib=weights / 2**30,
                          ram_gib=(host.ram_bytes or 0) / 2**30, fits=fits))
    ot = ",".join(rf"\.ffn_.*_exps=RAY{h - 1}@{sum(share[:h])}-{sum(share[:h + 1]) - 1}" for h in range(1, N)
                  if share[h])
    return ClusterPrediction(model, c, 1 / decode_s, n_prompt / prefill_s, terms, hosts, ot)


def _read_gbs(host: Host, nbytes: float) -> float:
    """Where a host reads `nbytes` of weights from: its GPUs' memory if they hold them, else its DRAM."""
    gpus = host.hardware.gpus
    if gpus and nbytes <= sum(g.mem_gib for g in gpus) * 2**30 * 0.9:
        return sum(g.mem_bw_gbs * g.bw_efficiency for g in gpus)
    return host.hardware.cpu.read_gbs()


def _bytes_per_param(tensors: dict, names: dict) -> float:
    """Average bytes per weight of these tensors (all when `names` is empty), from their sizes and shapes."""
    import numpy as np

    sel = [(shape, nb) for n, (_, shape, nb) in tensors.items() if not names or n in names]
    return sum(nb for _, nb in sel) / sum(float(np.prod(s)) for s, _ in sel)


__all__ = ["NETS", "RAY_CALL_US", "RAY_EXTRA_US", "WORKER_BUSY_US", "Cluster", "ClusterPrediction", "Host", "Net",
           "busiest_share", "cluster", "local_added", "network_seconds", "predict_cluster"]
