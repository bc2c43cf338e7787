#!/usr/bin/env python3
"""tables.py: the Markdown tables of the README and docs/bench.md, from the JSON lines that
scripts/bench/figures.sh writes under docs/bench/ (and compare.sh's).

    python3 scripts/bench/tables.py readme            # the README's one table of figures
    python3 scripts/bench/tables.py bench             # docs/bench.md's tables, part by part
    python3 scripts/bench/tables.py compare FILE      # compare.sh's builds, before against after
    python3 scripts/bench/tables.py gpu               # the GPU figures (docs/bench/gpu-*: the device command's files)
    python3 scripts/bench/tables.py update            # rewrite the tables in README.md, docs/bench.md and docs/gpu.md
                                                      # (between their <!-- begin/end ... --> lines)
    python3 scripts/bench/tables.py reproduce FILE... # whether other runs of figures.sh cross-host (OUT=dir) fall
                                                      # within the spread of docs/bench/cross-host.jsonl

Every number printed is read from a file; nothing is typed in by hand.
"""
import json
import os
import re
import statistics
import sys

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "bench")


def load(name):
    """The stamp line and the records of docs/bench/NAME.jsonl ([] where it is missing)."""
    return load_file(os.path.join(DIR, name + ".jsonl"))


def load_file(path):
    """The first stamp line and the records of a file of JSON lines ([] where it is missing)."""
    if not os.path.exists(path):
        return "", []
    stamp, recs = "", []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("#"):
                stamp = stamp or line.lstrip("# ")
            elif line.startswith("{"):
                recs.append(json.loads(line))
    return stamp, recs


def layout(r):
    """'2 ranks' on one node, 'N x R' on nodes of equal size, else the ranks over the nodes."""
    n, p = r["nodes"], r["ranks"]
    if n == 1:
        return f"1 node x {p}"
    if p % n == 0:
        return f"{n} x {p // n}"
    big = -(-p // n)
    sizes = [big] * (p - (big - 1) * n) + [big - 1] * (n - (p - (big - 1) * n))
    return "+".join(map(str, sizes))


def ms(us):
    """A time in us, printed with three significant digits or more."""
    for unit, scale in (("s", 1e6), ("ms", 1e3), ("us", 1)):
        if us >= scale or unit == "us":
            v = us / scale
            return f"{v:.0f} {unit}" if v >= 100 else f"{v:.1f} {unit}" if v >= 10 else f"{v:.2f} {unit}"


def where(r):
    return layout(r) + (" hosts" if r["nodes"] > 1 else "")


def x(v):
    return f"{v:.2f}x"


def what(r):
    mode = {"ll": "LL decode", "ht": "HT prefill"}[r["mode"]]
    return f"{mode}, {r['tokens']} token{'s' * (r['tokens'] != 1)}"


def total(r, pre=""):
    return r[pre + "dispatch_us"] + r[pre + "combine_us"]


# A figure over runs: the median, the lowest and the highest. Across the emulated hosts one run
# moves by up to 1.5x (the hosts share two cores with their TCP stacks), so each figure there is
# taken over several runs, and a spread (highest over lowest) above NOISY is said in the tables.
NOISY = 1.5


def runs_of(recs):
    """Records grouped by configuration (mode, tokens, hosts, experts, baseline or not), in the
    order first seen: each group holds one record per run."""
    groups = {}
    for r in recs:
        groups.setdefault(config_key(r), []).append(r)
    return list(groups.values())


def config_key(r):
    return (r["mode"], r["tokens"], layout(r), r["nodes"], r["experts"], bool(r.get("alltoallv_dispatch_us")))


# The cross-host figures the tables print over runs: name, how to read it from a record (None
# where the record has no such figure) and how to print it.
XH_FIGURES = (
    ("ep, dispatch + combine", lambda r: total(r), ms),
    ("alltoallv by hand", lambda r: total(r, "alltoallv_") if r.get("alltoallv_dispatch_us") else None, ms),
    ("wire floor", lambda r: floor_total(r) if r.get("floor_dispatch_us") else None, ms),
    ("speedup over alltoallv", lambda r: r.get("speedup_vs_alltoallv") or None, x),
    ("ep x floor", lambda r: r.get("x_floor") or None, x),
)


def reproduce(paths):
    """Whether the medians of other runs of figures.sh cross-host (each file one run of it, its
    configurations RUNS times) fall within the lowest and highest run of docs/bench/cross-host.jsonl,
    figure by figure."""
    stamp, ref = load("cross-host")
    others = [runs_of(load_file(p)[1]) for p in paths]
    rows, inside, count = [], 0, 0
    for rs in runs_of(ref):
        key = config_key(rs[0])
        for name, get, fmt in XH_FIGURES:
            vals = [get(r) for r in rs]
            if None in vals:
                continue
            med, lo, hi = stat(vals)
            cells = []
            for groups in others:
                g = [g for g in groups if config_key(g[0]) == key]
                if not g:
                    cells.append("not run")
                    continue
                m = statistics.median(get(r) for r in g[0])
                ok = lo <= m <= hi
                inside, count = inside + ok, count + 1
                cells.append(fmt(m) + ("" if ok else " (outside)"))
            rows.append((what(rs[0]), layout(rs[0]), name, f"{fmt(med)} ({fmt(lo)}-{fmt(hi)}, {len(rs)} runs)", *cells))
    print(f"The medians of {len(paths)} other run(s) of figures.sh cross-host against the spread of "
          f"docs/bench/cross-host.jsonl ({stamp}):\n")
    table(["config", "ranks", "figure", "the tables: median (lowest-highest)"] +
          [f"run {i + 1}: median" for i in range(len(paths))], rows)
    print(f"{inside} of {count} medians within the tables' spread.")


def stat(vals):
    """(median, lowest, highest) of vals."""
    v = sorted(vals)
    return statistics.median(v), v[0], v[-1]


def spread_note(vals):
    """', spread 1.62x' where the highest run is more than NOISY times the lowest, else ''."""
    _, lo, hi = stat(vals)
    return f", spread {hi / lo:.2f}x" if lo > 0 and hi / lo > NOISY else ""


def ms_span(vals):
    """'44.2 ms (41.0-47.3)': the median over runs, the lowest and the highest (one run: the value)."""
    med, lo, hi = stat(vals)
    if len(vals) == 1:
        return ms(med)
    return f"{ms(med)} ({ms(lo).split()[0] if ms(lo).split()[1] == ms(hi).split()[1] else ms(lo)}-{ms(hi)}{spread_note(vals)})"


def x_span(vals):
    """'1.53x (1.40x-1.60x)': a ratio's median over runs, the lowest and the highest."""
    med, lo, hi = stat(vals)
    if len(vals) == 1:
        return x(med)
    return f"{x(med)} ({x(lo)}-{x(hi)}{spread_note(vals)})"


def floor_total(r):
    return r["floor_dispatch_us"] + r["floor_combine_us"]


def readme():
    rows = []
    cmd = "scripts/bench/figures.sh"
    _, one = load("one-node")
    for r in one:
        rows.append((what(r), layout(r), ms(total(r)), "alltoallv by hand " + ms(total(r, "alltoallv_")),
                     x(r["speedup_vs_alltoallv"]) + " faster", cmd + " one-node"))
    _, lat = load("latency")
    for r in lat:
        if r["tokens"] in (1, 128):
            rows.append((f"LL decode rounds back to back, {r['tokens']} token{'s' * (r['tokens'] > 1)} "
                          f"(hidden {r['hidden']}, top-{r['topk']} of {r['experts']} experts)",
                         layout(r), ms(r["steady_round_us"]),
                         "alltoallv by hand " + ms(r["alltoallv_steady_round_us"]) + "; the data round trip " +
                         ms(r["data_round_trip_us"]),
                         x(r["alltoallv_steady_round_us"] / r["steady_round_us"]) + " faster; " +
                         x(r["steady_round_us"] / r["data_round_trip_us"]) + " the data round trip's time",
                         cmd + " latency"))
    _, xh = load("cross-host")
    for rs in runs_of(xh):
        r = rs[0]
        ref = []
        if r.get("alltoallv_dispatch_us"):
            ref.append("alltoallv by hand " + ms_span([total(q, "alltoallv_") for q in rs]))
        if r.get("floor_dispatch_us"):
            ref.append("wire floor " + ms_span([floor_total(q) for q in rs]))
        ratio = []
        if r.get("speedup_vs_alltoallv"):
            ratio.append(x_span([q["speedup_vs_alltoallv"] for q in rs]) + " faster")
        if r.get("x_floor"):
            ratio.append(f"{x_span([q['x_floor'] for q in rs])} the floor's time")
        runs = f" ({len(rs)} runs)" if len(rs) > 1 else ""
        rows.append((what(r) + runs, where(r), ms_span([total(q) for q in rs]), "; ".join(ref), "; ".join(ratio),
                     cmd + " cross-host"))
    _, fp8 = load("fp8")
    groups = {}
    for r in fp8:
        kind = "combine" if r.get("combine_wire") == "fp8" else "dispatch" if r["dtype"] == "fp8" else None
        if kind:
            groups.setdefault((kind, where(r)), []).append(r)
    for (kind, place), rs in groups.items():
        t = [r[kind + "_us"] for r in rs]
        b = [r["bf16_" + kind + "_us"] for r in rs]
        sp = sorted(r["fp8_" + kind + "_speedup"] for r in rs)
        rows.append((f"LL FP8 {kind}, 128 tokens" + (f" ({len(rs)} runs)" if len(rs) > 1 else ""), place,
                     f"{kind} " + ", ".join(ms(v) for v in t), f"bf16 {kind} " + ", ".join(ms(v) for v in b),
                     (x(sp[0]) if len(sp) == 1 else f"{x(sp[0])}-{x(sp[-1])}") + " bf16's speed", cmd + " fp8"))
    _, lay = load("layouts")
    for r in lay:
        rows.append((f"HT expert-major zones (align {r['expert_alignment']}), {r['tokens']} tokens", where(r), ms(total(r)),
                     "flat + the user's permutation " + ms(r["flat_permute_dispatch_us"] + r["flat_permute_combine_us"]),
                     x(r["expert_major_speedup"]) + " faster", cmd + " layouts"))
    train = train_rows() + serve_rows() + capi_rows()
    print("| what | ranks | goep | reference, same run | goep against it | command |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows + train:
        print("| " + " | ".join(row) + " |")
    print()
    print(measured())


def stamps():
    out = []
    for part in ("one-node", "latency", "cross-host", "fp8", "layouts"):
        s, _ = load(part)
        if s:
            out.append((part, s))
    for part in ("train.txt", "serve.txt"):
        t = text(part)
        if t:
            out.append((part[:-4], t[0].lstrip("# ")))
    s, _ = load("capi")
    if s:
        out.append(("capi", s))
    return out


def train_text():
    return text("train.txt")


def train_runs():
    """{device: [(tokens/s, the summary's speed line, its copies line), ...]} from train.txt."""
    runs, dev = {}, None
    for line in train_text():
        m = re.match(r"== device (\w+)", line)
        if m:
            dev = m.group(1)
            runs.setdefault(dev, []).append([0.0, "", ""])
            continue
        if dev is None:
            continue
        m = re.search(r"speed\s+([0-9.]+)(k?) tokens/s", line)
        if m:
            runs[dev][-1][0] = float(m.group(1)) * (1000 if m.group(2) else 1)
            runs[dev][-1][1] = line.strip()
        elif line.strip().startswith("copies"):
            runs[dev][-1][2] = line.strip()
    return {d: [r for r in rs if r[0] > 0] for d, rs in runs.items()}


def kspan(runs):
    v = sorted(r[0] / 1000 for r in runs)
    return f"{v[0]:.1f}k" if len(v) == 1 or f"{v[0]:.1f}" == f"{v[-1]:.1f}" else f"{v[0]:.1f}k-{v[-1]:.1f}k"


def train_rows():
    runs = train_runs()
    if not runs.get("cpu") or not runs.get("emulate"):
        return []
    ratio = statistics.median(r[0] for r in runs["emulate"]) / statistics.median(r[0] for r in runs["cpu"])
    return [("main job: moe-train, LL, f32", "1 node x 4", "CPU engine " + kspan(runs["cpu"]) + " tokens/s",
             "the GPU engine on the emulated device " + kspan(runs["emulate"]) + " tokens/s",
             "the emulated device at " + x(ratio) + " the CPU engine's speed", "scripts/bench/figures.sh train")]


def measured():
    """One sentence: the commit(s), the machine, the time span and each part's load."""
    parts = stamps()
    if not parts:
        return ""
    rx = re.compile(r"commit (\S+), (.*), (\d+) cores, (\S+), load (\S+)")
    commits, machines, times, loads = set(), set(), [], []
    for part, st in parts:
        m = rx.match(st)
        if not m:
            loads.append(f"{part}: {st}")
            continue
        commits.add(m.group(1))
        machines.add(f"{m.group(2)}, {m.group(3)} cores")
        times.append(m.group(4))
        loads.append(f"{part} {m.group(5)}")
    for i, (part, st) in enumerate(parts):  # a part of several passes: the load at each
        if part == "cross-host":
            passes = pass_loads("cross-host")
            if len(passes) > 1:
                loads = [f"cross-host {min(passes)}-{max(passes)} ({len(passes)} passes)" if l.startswith("cross-host ")
                         else l for l in loads]
    times.sort()
    # the end's date too where the parts were measured on different days
    end = times[-1][11:16] if times and times[-1][:10] == times[0][:10] else times[-1].replace('T', ' ')[:16] if times else ""
    span = f"{times[0].replace('T', ' ')[:16]} to {end} UTC" if times else ""
    return (f"Measured at commit {', '.join(sorted(commits))} on {'; '.join(sorted(machines))}, {span}; the "
            f"load (1-minute average) as each part began: {', '.join(loads)}.")


def pass_loads(name, path=None):
    """The 1-minute load as each pass of docs/bench/NAME.jsonl began: its stamp's, then each
    '# run K: ..., load L ...' line's."""
    path = path or os.path.join(DIR, name + ".jsonl")
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            m = re.match(r"#.* load (\S+)", line)
            if m:
                out.append(m.group(1))
    return out


def text(name):
    path = os.path.join(DIR, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().splitlines()


def serve_runs():
    """[(workload, where, overlap, decode p50, decode p99, tokens/s per rank)] from serve.txt."""
    runs, cur = [], None
    for line in text("serve.txt"):
        if line.startswith("== "):
            w, where, ov = [p.strip() for p in line[3:].split("|")]
            cur = [w, where, ov.split()[-1] == "true", "", "", ""]
            runs.append(cur)
        elif cur is not None:
            m = re.match(r"\s+decode\s+p50 (\S+ \S+)\s+p90 \S+ \S+\s+p99 (\S+ \S+)", line)
            if m:
                cur[3], cur[4] = m.group(1), m.group(2)
            m = re.match(r"\s+tokens/s\s+\S+ in all, (\S+) per rank", line)
            if m:
                cur[5] = m.group(1)
    return [tuple(r) for r in runs if r[5]]


def serve_rows():
    """One row per workload and place: overlap on and off side by side."""
    rows, seen = [], {}
    for w, where, ov, p50, p99, tps in serve_runs():
        seen.setdefault((w, where), {})[ov] = (p50, p99, tps)
    for (w, where), by in seen.items():
        if True not in by or False not in by:
            continue
        on, off = by[True], by[False]
        rows.append((f"serving (moe-serve), {w}", where,
                     f"overlap on: decode p50 {on[0]}, p99 {on[1]}, {on[2]} tokens/s per rank",
                     f"overlap off: p50 {off[0]}, p99 {off[1]}, {off[2]} tokens/s per rank",
                     "overlap on at " + x(float(on[2]) / float(off[2])) + " off's tokens/s", "scripts/bench/figures.sh serve"))
    return rows


def capi_rows():
    """One row per LL round size: the C and Python interfaces against the same round in Go, in place
    (against their zero-copy rounds) and with the copies a caller's own arrays cost (against their
    rounds into plain arrays)."""
    _, recs = load("capi")
    by = {}
    for r in recs:
        a = by.setdefault((r["mode"], r["tokens"], layout(r)), {"go": [], "go-copies": []})
        if r["api"] in ("go", "go-copies"):
            a[r["api"]].append(r["round_us"])  # the C program's run, then the Python program's
        else:
            a[r["api"]] = r
    rows = []
    for (mode, tokens, where), a in by.items():
        if mode != "ll" or not all(k in a for k in ("c", "c-zero-copy", "python", "python-zero-copy")):
            continue
        c, czc, py, pyzc = a["c"], a["c-zero-copy"], a["python"], a["python-zero-copy"]
        if a["go-copies"]:
            ref = ("the same round in Go in each program, in place: " + " / ".join(ms(v) for v in a["go"]) +
                   "; with the copies: " + " / ".join(ms(v) for v in a["go-copies"]))
            ratio = (f"at Go's speed times: C {x(1 / c['vs_go_copies'])} Go with the copies (zero-copy "
                     f"{x(1 / czc['vs_go'])} Go in place), Python {x(1 / py['vs_go_copies'])} (zero-copy "
                     f"{x(1 / pyzc['vs_go'])})")
        else:  # runs from before the copied Go round
            ref = "the same round in Go in each program: " + " / ".join(ms(v) for v in a["go"])
            ratio = (f"at Go's speed times: C {x(1 / c['vs_go'])} (zero-copy {x(1 / czc['vs_go'])}), "
                     f"Python {x(1 / py['vs_go'])} (zero-copy {x(1 / pyzc['vs_go'])})")
        rows.append((f"C and Python interfaces, an LL round of {tokens} token{'s' * (tokens > 1)}", where,
                     f"C {ms(c['round_us'])} (zero-copy {ms(czc['round_us'])}); "
                     f"Python {ms(py['round_us'])} (zero-copy {ms(pyzc['round_us'])})",
                     ref, ratio, "scripts/bench/figures.sh capi"))
    return rows


# Published figures of the peers, for scale (../shared/REFERENCE.md): 8 GPUs, not one.
PEERS = ("NCCL EP (8 x H100, LL 128 tokens, hidden 7168, top-8 of 256 experts): dispatch 224 GB/s, combine 185 GB/s "
         "per GPU; DeepEP V1 (EP8 on H800, LL 128 tokens): dispatch 77 us, combine 114 us")


def gpu_stamp():
    s, _ = load("gpu-bench")
    return s


def by_config(recs, key):
    """Records grouped by key(record), in the order each key first appears."""
    groups = {}
    for r in recs:
        groups.setdefault(key(r), []).append(r)
    return groups


def count_runs(recs):
    """How many runs the records come from (their "run" field; one run where there is none)."""
    return len({r.get("run", 0) for r in recs})


def gpu():
    """The GPU figures: ep on one rank of a GPU against the CPU engine in the same run (the median
    of the runs, with the lowest and highest), the kernels against a device copy, an NCCL group's
    cost, and the training on both devices."""
    stamp, bench = load("gpu-bench")
    if not bench:
        print("No GPU figures yet: run bin/gpu/run-on-device.sh on a GPU machine and copy its files to docs/bench/gpu-*.")
        return
    rows = []
    for rs in by_config(bench, lambda r: (r["mode"], r["tokens"])).values():
        rows.append((what(rs[0]),
                     ms_span([r["dispatch_device_us"] for r in rs]) + " + " + ms_span([r["combine_device_us"] for r in rs]),
                     ms_span([r["dispatch_device_us"] + r["combine_device_us"] for r in rs]),
                     ms_span([total(r) for r in rs]),
                     ms_span([r["cpu_dispatch_us"] + r["cpu_combine_us"] for r in rs]),
                     x_span([(r["cpu_dispatch_us"] + r["cpu_combine_us"]) / total(r) for r in rs])))
    print(f"ep on the GPU backend, one rank (`-device cuda`), against ep's CPU engine on the same machine in the same "
          f"run, whose results the GPU's are checked against; bf16, hidden 7168, top-8 of 64 experts; each run the "
          f"median of 20 rounds, each figure the median of {count_runs(bench)} runs with the lowest and highest "
          f"({stamp}):\n")
    table(["config", "device time (events): dispatch + combine", "device time, the round", "host time, the round",
           "CPU engine, host time", "GPU against the CPU engine (host time)"], rows)
    kstamp, ks = load("gpu-kernels")
    if ks:
        krows = []
        for k in ks:
            krows.append((k["kernel"], k["case"].upper(), f"{k['bytes'] / 1e6:.2f} MB", ms(k["kernel_us"]), ms(k["copy_us"]),
                          f"{100 * k['of_copy']:.0f}%"))
        print("Every kernel against `cuMemcpyDtoDAsync` of the same bytes (read plus written, over two) on the same "
              "stream, device time from events, medians of 20; LL: 128 tokens, HT: 4096 (1024 and 32768 rows of "
              f"14336 bytes) ({kstamp}):\n")
        table(["kernel", "case", "bytes", "kernel", "copy", "kernel at % of the copy's speed"], krows)
    _, nc = load("gpu-nccl")
    if nc:
        print("What an NCCL group costs the host, from posting it to its completion, one rank sending to itself, "
              "medians of 50:\n")
        table(["path", "bytes", "host time"], [(n["path"], str(n["bytes"]), ms(n["host_us"])) for n in nc])
    t = "\n".join(text("gpu-train.txt"))
    if t:
        speeds = re.findall(r"speed\s+(\S+) tokens/s", t)
        losses = re.findall(r"last step loss (\S+), aux loss (\S+) ", t)
        if len(speeds) == 2 and len(losses) == 2:
            same = "equal bit for bit" if losses[0] == losses[1] else f"cuda {losses[0]}, cpu {losses[1]}"
            print(f"The main job, `moe-train` (make run's model, LL, f32, 300 steps, one rank): `-device cuda` "
                  f"{speeds[0]} tokens/s against `-device cpu` {speeds[1]} tokens/s; the last step's loss and aux loss "
                  f"{same} ({losses[0][0]}, {losses[0][1]}).\n")
    print(f"For scale, not a comparison: {PEERS}. One rank on one GPU moves every row within the GPU's own memory; "
          "their figures are 8 GPUs exchanging over NVLink.\n")
    istamp, ipc = load("gpu-ipc")
    if ipc:
        irows = []
        for rs in by_config(ipc, lambda r: (r["mode"], r["ranks"])).values():
            r = rs[0]
            moved, full = r.get("transfer_bytes_per_round", 0), r.get("transfer_full_bytes_per_round", 0)
            irows.append((what(r), str(r["ranks"]),
                          ms_span([q["dispatch_device_us"] + q["combine_device_us"] for q in rs]),
                          ms_span([total(q) for q in rs]), ms_span([q["cpu_dispatch_us"] + q["cpu_combine_us"] for q in rs]),
                          f"{moved / 1e6:.1f} MB of {full / 1e6:.1f} MB ({100 * moved / full:.0f}%)" if full else "none (one rank)"))
        print(f"Several ranks on one GPU over CUDA IPC (`-device cuda-ipc`, epgpu.CUDAIPC): the ranks share the GPU's "
              f"time (no MPS: their kernels take turns) and its memory bandwidth, so these are not the speed of ranks on "
              f"GPUs of their own; each run the median of 10 rounds, each figure the median of {count_runs(ipc)} runs with "
              f"the lowest and highest ({istamp}):\n")
        table(["config", "ranks on the GPU", "device time, dispatch + combine", "host time", "CPU engine, host time",
               "bytes the IPC transport moved per round (all ranks), of what fixed-size transfers move"], irows)


def gpu_readme():
    """The README's GPU rows: a short table with the stamp."""
    stamp, bench = load("gpu-bench")
    if not bench:
        print("No GPU figures yet.")
        return
    rows = []
    for rs in by_config(bench, lambda r: (r["mode"], r["tokens"])).values():
        ratios = [(r["cpu_dispatch_us"] + r["cpu_combine_us"]) / total(r) for r in rs]
        med = stat(ratios)[0]
        rows.append((what(rs[0]),
                     ms_span([r["dispatch_device_us"] + r["combine_device_us"] for r in rs]) + " device, " +
                     ms_span([total(r) for r in rs]) + " host",
                     "CPU engine " + ms_span([r["cpu_dispatch_us"] + r["cpu_combine_us"] for r in rs]),
                     (x_span(ratios) + " faster") if med >= 1 else (x_span([1 / v for v in ratios]) + " slower")))
    _, ks = load("gpu-kernels")
    movers = [k for k in ks if k["kernel"] in ("PackRows", "CopyRows", "ReduceRows", "ToBF16", "FromBF16")]
    if movers:
        lo, hi = min(k["of_copy"] for k in movers), max(k["of_copy"] for k in movers)
        rows.append(("the row kernels (pack, copy, reduce, convert), LL and HT sizes", f"{100 * lo:.0f}%-{100 * hi:.0f}% of a device copy's speed",
                     "cuMemcpyDtoDAsync of the same bytes", ""))
    t = "\n".join(text("gpu-train.txt"))
    speeds = re.findall(r"speed\s+(\S+) tokens/s", t) if t else []
    losses = re.findall(r"last step loss (\S+), aux loss (\S+) ", t) if t else []
    if len(speeds) == 2 and len(losses) == 2:
        rows.append(("main job: moe-train, LL, f32, 300 steps", f"-device cuda {speeds[0]} tokens/s",
                     f"-device cpu {speeds[1]} tokens/s",
                     "losses equal bit for bit" if losses[0] == losses[1] else "losses differ"))
    table(["what (one rank, bf16, hidden 7168, top-8 of 64 experts; median of the runs, lowest-highest)",
           "goep on the GPU", "reference, same run", "against it"], rows)
    print(f"Measured by `bin/gpu/run-on-device.sh`: {stamp}. For scale only: {PEERS}; one GPU is not their 8.")


def table(head, rows):
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join("---" for _ in head) + " |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()


def bench():
    s, one = load("one-node")
    if one:
        print(f"### One node\n\n`scripts/bench/figures.sh one-node` ({s}):\n")
        table(["config", "ranks", "ep dispatch / combine", "alltoallv by hand", "speedup", "memcpy GB/s per rank",
               "ep as % of memcpy (dispatch / combine)"],
              [(what(r), layout(r), f"{ms(r['dispatch_us'])} / {ms(r['combine_us'])}",
                f"{ms(r['alltoallv_dispatch_us'])} / {ms(r['alltoallv_combine_us'])}", x(r["speedup_vs_alltoallv"]),
                f"{r['memcpy_gbps']:.2f}",
                f"{100 * r['dispatch_memcpy_frac']:.0f}% / {100 * r['combine_memcpy_frac']:.0f}%") for r in one])
    s, lat = load("latency")
    if lat:
        print(f"### Decode latency\n\n`scripts/bench/figures.sh latency` ({s}):\n")
        table(["tokens per rank", "ep round", "x flag round trip", "x data round trip", "alltoallv round", "ep speedup",
               "flag round trip", "data round trip"],
              [(str(r["tokens"]), ms(r["steady_round_us"]), x(r["steady_round_us"] / r["flag_round_trip_us"]),
                x(r["steady_round_us"] / r["data_round_trip_us"]), ms(r["alltoallv_steady_round_us"]),
                x(r["alltoallv_steady_round_us"] / r["steady_round_us"]), ms(r["flag_round_trip_us"]),
                ms(r["data_round_trip_us"])) for r in lat])
    s, xh = load("cross-host")
    if xh:
        passes = pass_loads("cross-host")
        n = max(len(rs) for rs in runs_of(xh))
        intro = s if len(passes) < 2 else f"{s}; {len(passes)} passes, the load as each began {', '.join(passes)}"
        print(f"### Across emulated hosts\n\n`scripts/bench/figures.sh cross-host` ({intro}):\n")
        if n > 1:
            print(f"Each configuration ran {n} times, once per pass; a figure is the median over the runs, then the "
                  f"lowest and highest run in brackets, with the spread (highest over lowest) where it is over "
                  f"{NOISY}x. Dispatch / combine, processor time and bytes are medians.\n")
        rows = []
        for rs in runs_of(xh):
            r = rs[0]
            med = lambda key: statistics.median(q[key] for q in rs)
            a2a = ms_span([total(q, "alltoallv_") for q in rs]) if r.get("alltoallv_dispatch_us") else "not run"
            sp = x_span([q["speedup_vs_alltoallv"] for q in rs]) if r.get("speedup_vs_alltoallv") else ""
            by = f"{r['network_bytes_per_call'] / 1e6:.0f} MB" if r.get("network_bytes_per_call") else ""
            if by and r.get("flat_network_bytes_per_call"):
                by += f" / {r['flat_network_bytes_per_call'] / 1e6:.0f} MB"
            floor = r.get("floor_dispatch_us")
            rows.append((what(r), layout(r), str(len(rs)), f"{ms(med('dispatch_us'))} / {ms(med('combine_us'))}",
                         ms_span([total(q) for q in rs]), a2a,
                         ms_span([floor_total(q) for q in rs]) if floor else "not run", sp,
                         x_span([q["x_floor"] for q in rs]) if floor else "",
                         f"{ms(med('cpu_per_round_us'))} / {ms(med('floor_cpu_per_round_us'))}" if floor else "", by))
        table(["config", "hosts x ranks", "runs", "ep dispatch / combine", "ep, dispatch + combine",
               "alltoallv by hand", "wire floor", "speedup over alltoallv", "ep x floor",
               "processor time per round, ep / floor", "bytes across hosts per call, ep / flat"], rows)
    s, fp8 = load("fp8")
    if fp8:
        print(f"### FP8\n\n`scripts/bench/figures.sh fp8` ({s}):\n")
        rows = []
        for r in fp8:
            if r.get("combine_wire") == "fp8":
                rows.append(("FP8 combine", where(r), ms(r["combine_us"]), ms(r["bf16_combine_us"]),
                             x(r["fp8_combine_speedup"]), f"{r['combine_bytes_per_rank'] / 1e6:.1f} MB",
                             f"{r['network_bytes_per_call'] / 1e6:.1f} / {r['bf16_network_bytes_per_call'] / 1e6:.1f} MB"
                             if r.get("bf16_network_bytes_per_call") else ""))
            else:
                rows.append(("FP8 dispatch", where(r), ms(r["dispatch_us"]), ms(r["bf16_dispatch_us"]),
                             x(r["fp8_dispatch_speedup"]),
                             f"{r['bytes_per_rank'] / 1e6:.1f} / {r['bf16_bytes_per_rank'] / 1e6:.1f} MB", ""))
        table(["LL 128 tokens", "ranks", "FP8", "bf16, same rounds", "FP8's speed over bf16's",
               "bytes per rank (FP8 / bf16)", "bytes across hosts per call (FP8 / bf16)"], rows)
    s, lay = load("layouts")
    if lay:
        print(f"### Receive layouts\n\n`scripts/bench/figures.sh layouts` ({s}):\n")
        table(["HT 4096 tokens", "ranks", "expert-major dispatch / combine", "flat + permutation dispatch / combine",
               "speedup (total)", "speedup (dispatch)", "the permutation / the sums back alone"],
              [(f"align {r['expert_alignment']}", where(r),
                f"{ms(r['dispatch_us'])} / {ms(r['combine_us'])}",
                f"{ms(r['flat_permute_dispatch_us'])} / {ms(r['flat_permute_combine_us'])}",
                x(r["expert_major_speedup"]), x(r["expert_major_dispatch_speedup"]),
                f"{ms(r['permute_us'])} / {ms(r['unpermute_us'])}") for r in lay])
    runs = train_runs()
    if runs:
        print(f"### The main job\n\n`scripts/bench/figures.sh train` ({train_text()[0].lstrip('# ')}):\n")
        def clean(line):
            return re.sub(r"^(speed|copies)\s+", "", line)
        table(["device", "speed, and dispatch / combine per step", "host-device copies"],
              [(d, clean(r[1]), clean(r[2]) or "none") for d, rs in runs.items() for r in rs])
    serve_table()


def serve_table():
    runs = serve_runs()
    if runs:
        print(f"### Serving\n\n`scripts/bench/figures.sh serve` ({text('serve.txt')[0].lstrip('# ')}):\n")
        table(["workload", "ranks", "overlap", "decode p50", "decode p99", "tokens/s per rank"],
              [(w, where, "on" if ov else "off", p50, p99, tps) for w, where, ov, p50, p99, tps in runs])


# compare.sh's verdict needs this many pairs at least: five pairs all on one side of 1 happen by
# chance once in 16 (a sign test, both sides), fewer pairs too often to tell a change from noise.
MIN_PAIRS = 5


def verdict(pairs):
    """Whether the builds' pairs (before's time over after's, each pair run in turn) tell a change
    from the machine's noise: every pair on one side of 1, with MIN_PAIRS pairs or more."""
    lo, hi = min(pairs), max(pairs)
    if len(pairs) < MIN_PAIRS:
        return f"cannot tell: {len(pairs)} pairs, {MIN_PAIRS} needed"
    if lo > 1:
        return f"faster in every pair ({x(lo)}-{x(hi)})"
    if hi < 1:
        return f"slower in every pair ({x(lo)}-{x(hi)})"
    return f"no change told from noise: the pairs span {x(lo)}-{x(hi)}"


def compare(path):
    stamp, recs = "", []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                stamp = stamp or line.lstrip("# ").strip()
            elif line.startswith("{"):
                recs.append(json.loads(line))
    groups = {}
    for r in recs:
        key = (what(r), where(r))
        groups.setdefault(key, {"before": [], "after": []})[r["build"]].append(r)
    rows = []
    for (w, place), g in groups.items():
        if not g["before"] or not g["after"]:
            continue
        tb = [total(r) for r in g["before"]]
        ta = [total(r) for r in g["after"]]
        sb = [r.get("speedup_vs_alltoallv", 0) for r in g["before"]]
        sa = [r.get("speedup_vs_alltoallv", 0) for r in g["after"]]
        # each after run beside the before run just ahead of it: the pairs share the machine's state
        pairs = [b / a for b, a in zip(tb, ta)]
        rows.append((w, place, ms_span(tb), ms_span(ta), x(statistics.median(pairs)), verdict(pairs),
                     x_span(sb) if all(sb) else "", x_span(sa) if all(sa) else ""))
    print(f"compare.sh ({stamp}):\n")
    print("Times are medians over the rounds (lowest-highest); a pair is a before run and the after run that "
          f"followed it, and a change is told from noise only when all of {MIN_PAIRS} or more pairs agree.\n")
    table(["config", "ranks", "ep before (dispatch+combine)", "ep after", "after's speed over before's, median of the pairs",
           "told from noise?", "before: speedup over alltoallv", "after: speedup over alltoallv"], rows)


def update():
    import contextlib
    import io
    root = os.path.join(DIR, "..", "..")
    for doc, kind, fn in (("README.md", "figures", readme), (os.path.join("docs", "bench.md"), "tables", bench),
                          ("README.md", "gpu", gpu_readme), (os.path.join("docs", "gpu.md"), "gpu", gpu)):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            fn()
        path = os.path.join(root, doc)
        with open(path) as f:
            s = f.read()
        begin = f"<!-- begin {kind}: python3 scripts/bench/tables.py update -->\n"
        end = f"<!-- end {kind} -->\n"
        if begin not in s or end not in s:
            sys.exit(f"tables.py: {doc} has no {begin.strip()} ... {end.strip()} lines")
        head, rest = s.split(begin, 1)
        _, tail = rest.split(end, 1)
        with open(path, "w") as f:
            f.write(head + begin + "\n" + buf.getvalue().rstrip("\n") + "\n\n" + end + tail)
        print(f"tables.py: {doc} updated")


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("readme", "bench", "gpu", "compare", "update", "reproduce"):
        sys.exit("usage: tables.py readme | bench | gpu | compare FILE | update | reproduce FILE...")
    if sys.argv[1] == "reproduce":
        if len(sys.argv) < 3:
            sys.exit("usage: tables.py reproduce FILE...")
        reproduce(sys.argv[2:])
    elif sys.argv[1] == "update":
        update()
    elif sys.argv[1] == "gpu":
        gpu()
    elif sys.argv[1] == "readme":
        readme()
    elif sys.argv[1] == "bench":
        bench()
    else:
        if len(sys.argv) != 3:
            sys.exit("usage: tables.py compare FILE")
        compare(sys.argv[2])


if __name__ == "__main__":
    main()
