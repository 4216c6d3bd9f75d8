#!/usr/bin/env python3
"""Judge policy variants of ours on every case at once (issue 19: "any fix must be judged on the
servers, the several-streams cases and the shared traces at once, never on one case"):

    python3 scripts/policy_scorecard.py [--variant SETTINGS]... [--seeds 1-12] [--groups ...]

Each variant is a `vmm-replay --conf expandable=SETTINGS` string (the empty string is ours'
defaults, always included first). Every case runs once, classic, pytorch-expandable and every
variant side by side in one `vmm-replay --min-capacity --json` call (in parallel over the
cases): the 23 shared traces (`../shared/traces/pytorch`, where present) and the generated
workloads of each group, on the seeds given. Prints one Markdown row per group and variant:
cases, min capacity summed (and pytorch-expandable's), on how many cases ours needs more than
pytorch-expandable (and the largest excess), more than classic, more stream synchronizations
and more driver calls at min capacity than pytorch-expandable, and on how many cases the
physical bytes created at min capacity exceed 1.1 x the peak reserved there (pytorch-expandable's
count in parentheses); and, of the run at 80 GiB (no pressure), on how many cases ours makes more
driver calls and reserves more at its peak than pytorch-expandable. Issue 19's goals 1-3 ask for
zero in the last seven columns. With
--cases, one line per case follows the table (what a change moved, case by case). With
--at-bars, one column more: on how many cases ours, whose smallest capacity is at or below a
bar's (classic's or pytorch-expandable's), still fails at that bar's own smallest capacity (the
bisection assumes that what fits a device fits any larger one; a policy's decisions can make
that false, and a user with the bar's device would see the OOM).

With --save FILE, every case's figures go to FILE as JSON; with --against FILE (a --save of an
earlier build or setting, on the same cases), what moved since then follows: per group and
variant, the cases that changed and the change in min capacity summed, in cases above each bar,
and in synchronizations and driver calls summed at min capacity; then each changed case. One
build against another is two runs, e.g. from a worktree of the earlier commit:
`policy_scorecard.py --save /tmp/before.json` there, then `--against /tmp/before.json` here.

Groups: shared, servers (inference-server, inference-server-4), streams (multi-stream,
two-streams, ten-streams), programs (qlora, unet3d-training, empty-cache-training, moe-training), and, only
when asked for with --groups, many (thirty-two-streams, inference-server-32: 32 streams, where
the loss to classic that grows with the number of streams shows; POLICY.md, "Many streams").
"""
import argparse
import glob
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
GROUPS = {
    "servers": ["inference-server", "inference-server-4"],
    "streams": ["multi-stream", "two-streams", "ten-streams"],
    "programs": ["qlora", "unet3d-training", "empty-cache-training", "moe-training"],
    "many": ["thirty-two-streams", "inference-server-32"],
}
# The groups run without --groups: the README's scorecard is these.
DEFAULT_GROUPS = ["shared", "servers", "streams", "programs"]


def seeds(text):
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def figures(run):
    """Min capacity (MiB), synchronizations and driver calls at it, and physical bytes created
    there over the peak reserved (goal 3 asks at most 1.1); then driver calls and peak reserved
    bytes of the run at the capacity asked (80 GiB: no pressure; goals 2 and 3 there)."""
    if run["min_capacity_bytes"] is None:
        sys.exit(f"{run['allocator']} ({run['settings']}): {run.get('min_capacity_note')}")
    at_min = run["at_min_capacity"] or {}
    return (
        run["min_capacity_bytes"] // MIB,
        at_min.get("driver_calls_by_kind", {}).get("cuStreamSynchronize", 0),
        at_min.get("driver_calls", 0),
        at_min.get("bytes_created", 0) / max(at_min.get("peak_reserved_bytes", 0), 1),
        run["driver_calls"],
        run["peak_reserved_bytes"],
    )


def replay(binary, inputs, variants):
    """Per trace: classic's and pytorch-expandable's figures, and each variant's, in order."""
    cmd = [binary, *inputs, "--min-capacity", "--json"]
    for v in variants:
        cmd += ["--conf", f"expandable={v}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    cases = []
    for t in json.loads(out)["traces"]:
        runs = t["allocators"]
        by = {a["allocator"]: a for a in runs}
        ours = [a for a in runs if a["allocator"] == "expandable"]
        if len(ours) != len(variants):
            sys.exit(f"{t['trace']}: {len(ours)} runs of ours for {len(variants)} variants")
        cases.append((figures(by["classic"]), figures(by["pytorch-expandable"]),
                      [figures(a) for a in ours], t["trace"]))
    return cases


def fails_at(binary, inputs, variants, capacity_mib):
    """Per variant: whether ours raises an OOM replaying `inputs` at `capacity_mib`."""
    cmd = [binary, *inputs, "--capacity", f"{capacity_mib}MiB", "--allocators", "expandable",
           "--json"]
    for v in variants:
        cmd += ["--conf", f"expandable={v}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    runs = json.loads(out)["traces"][0]["allocators"]
    return [a["ooms"] > 0 for a in runs if a["allocator"] == "expandable"]


def at_bars(binary, inputs, case, variants):
    """Per variant: whether ours fails at the smallest capacity of a bar it claims to beat."""
    cl, pt, ours, _ = case
    failed = [False] * len(variants)
    for bar in sorted({cl[0], pt[0]}):
        asked = [i for i, o in enumerate(ours) if o[0] <= bar]
        if asked:
            got = fails_at(binary, inputs, [variants[i] for i in asked], bar)
            for i, f in zip(asked, got):
                failed[i] = failed[i] or f
    return failed


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", action="append", default=[],
                   help="settings of ours to judge beside its defaults (repeatable)")
    p.add_argument("--seeds", type=seeds, default=seeds("1-12"),
                   help="seeds of the generated workloads (default 1-12)")
    p.add_argument("--groups", nargs="+", default=DEFAULT_GROUPS,
                   choices=["shared", *GROUPS])
    p.add_argument("--cases", action="store_true",
                   help="also print one line per case: classic's and pytorch-expandable's min "
                        "capacity (MiB), then each variant's, with its synchronizations (s), "
                        "driver calls (c) and bytes created over peak reserved (x) at min "
                        "capacity; * marks more than pytorch-expandable, ! a failure at a "
                        "bar's capacity (with --at-bars)")
    p.add_argument("--at-bars", action="store_true",
                   help="also replay ours at each bar's smallest capacity it claims to beat, "
                        "and count the cases where it fails there")
    p.add_argument("--save", metavar="FILE",
                   help="write every case's figures to FILE (JSON), for a later --against")
    p.add_argument("--against", metavar="FILE",
                   help="compare with the figures an earlier --save wrote: per group and "
                        "variant what moved, then each case that changed")
    args = p.parse_args()
    earlier = None
    if args.against:
        with open(args.against) as f:
            earlier = json.load(f)
    variants = ["", *args.variant]
    subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "vmm-replay"],
                   cwd=ROOT, check=True)
    binary = os.path.join(ROOT, "target", "release", "vmm-replay")
    jobs = []  # (group, inputs)
    if "shared" in args.groups:
        traces = sorted(glob.glob(os.path.join(ROOT, "..", "shared", "traces", "pytorch",
                                               "*.pickle")))
        if traces:
            jobs.append(("shared", traces))
        else:
            print("no ../shared/traces/pytorch: the shared group is left out", file=sys.stderr)
    for group in args.groups:
        for w in GROUPS.get(group, []):
            jobs += [(group, ["--workload", w, "--seed", str(s)]) for s in args.seeds]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda j: replay(binary, j[1], variants), jobs))
        # Per job, per case (a shared-traces job holds many: each replayed alone), per variant.
        bars = None
        if args.at_bars:
            def alone(inputs, case):
                # A trace file's case is the file named after it; a workload's, the job.
                files = [i for i in inputs if os.path.splitext(os.path.basename(i))[0] == case[3]]
                return files or inputs
            work = [(alone(inputs, c), c) for (_, inputs), r in zip(jobs, results) for c in r]
            flat = list(pool.map(lambda w: at_bars(binary, w[0], w[1], variants), work))
            bars, k = [], 0
            for r in results:
                bars.append(flat[k:k + len(r)])
                k += len(r)
    extra = " | fails at a bar's capacity" if bars else ""
    print("| group | variant | cases | Σ min MiB (pt-exp) | > pt-exp (worst MiB) | > classic "
          "| syncs > pt-exp | calls > pt-exp | created > 1.1 × reserved (pt-exp) "
          f"| @80 GiB: calls > pt-exp | @80 GiB: reserved > pt-exp{extra} |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|" + ("--:|" if bars else ""))
    for group in dict.fromkeys(g for g, _ in jobs):
        cases = [c for (g, _), r in zip(jobs, results) if g == group for c in r]
        for i, v in enumerate(variants):
            ours = [(cl, pt, o[i]) for cl, pt, o, _ in cases]
            excess = [o[0] - pt[0] for _, pt, o in ours if o[0] > pt[0]]
            row = [
                group, f"`{v}`" if v else "defaults", str(len(ours)),
                f"{sum(o[0] for _, _, o in ours):,} ({sum(pt[0] for _, pt, _ in ours):,})",
                f"{len(excess)} ({max(excess, default=0)})",
                str(sum(o[0] > cl[0] for cl, _, o in ours)),
                str(sum(o[1] > pt[1] for _, pt, o in ours)),
                str(sum(o[2] > pt[2] for _, pt, o in ours)),
                f"{sum(o[3] > 1.1 for _, _, o in ours)} ({sum(pt[3] > 1.1 for _, pt, _ in ours)})",
                str(sum(o[4] > pt[4] for _, pt, o in ours)),
                str(sum(o[5] > pt[5] for _, pt, o in ours)),
            ]
            if bars:
                failed = [f[i] for (g, _), b in zip(jobs, bars) if g == group for f in b]
                row.append(str(sum(failed)))
            print("| " + " | ".join(row) + " |")
    if args.cases:
        print()
        flags = [f for b in bars for f in b] if bars else None
        for k, (cl, pt, ours, name) in enumerate(c for r in results for c in r):
            failed = flags[k] if flags else [False] * len(ours)
            cells = [f"{o[0]}{'*' if o[0] > pt[0] else ''}{'!' if f else ''} s{o[1]} c{o[2]} "
                     f"x{o[3]:.2f}" for o, f in zip(ours, failed)]
            print(f"{name:44} classic {cl[0]:6} pt-exp {pt[0]:6} s{pt[1]} c{pt[2]} | "
                  + " | ".join(cells))
    if args.save or earlier is not None:
        now = saved(jobs, results, variants)
        if args.save:
            with open(args.save, "w") as f:
                json.dump(now, f, indent=1)
        if earlier is not None:
            print_against(now, earlier, args.against)


FIGURE_NAMES = ["min_mib", "syncs", "calls", "created_ratio", "calls_80", "reserved_80"]


def saved(jobs, results, variants):
    """Every case's figures, by case name: its group, classic's, pytorch-expandable's and each
    variant's (by its settings string, "" for the defaults)."""
    out = {}
    for (group, _), r in zip(jobs, results):
        for cl, pt, ours, name in r:
            out[name] = {
                "group": group,
                "classic": dict(zip(FIGURE_NAMES, cl)),
                "pytorch-expandable": dict(zip(FIGURE_NAMES, pt)),
                "ours": {v: dict(zip(FIGURE_NAMES, o)) for v, o in zip(variants, ours)},
            }
    return out


def print_against(now, earlier, path):
    """What moved since `earlier` (an earlier --save): per group and variant, then per case."""
    common = [n for n in now if n in earlier]
    missing = len(now) - len(common)
    print(f"\nAgainst {path} ({len(common)} cases in both"
          + (f"; {missing} not in it" if missing else "") + "):\n")
    print("| group | variant | cases changed | Δ Σ min MiB | Δ cases > pt-exp | Δ cases > classic "
          "| Δ Σ syncs | Δ Σ calls |")
    print("|---|---|--:|--:|--:|--:|--:|--:|")
    changed = []
    groups = dict.fromkeys(now[n]["group"] for n in common)
    for group in groups:
        names = [n for n in common if now[n]["group"] == group]
        variants = [v for v in now[names[0]]["ours"] if all(v in earlier[n]["ours"] for n in names)]
        for v in variants:
            d = {"n": 0, "min": 0, "pt": 0, "cl": 0, "syncs": 0, "calls": 0}
            for n in names:
                a, b = earlier[n]["ours"][v], now[n]["ours"][v]
                pt, cl = now[n]["pytorch-expandable"]["min_mib"], now[n]["classic"]["min_mib"]
                if a != b:
                    d["n"] += 1
                    changed.append((n, v, a, b))
                d["min"] += b["min_mib"] - a["min_mib"]
                d["pt"] += (b["min_mib"] > pt) - (a["min_mib"] > pt)
                d["cl"] += (b["min_mib"] > cl) - (a["min_mib"] > cl)
                d["syncs"] += b["syncs"] - a["syncs"]
                d["calls"] += b["calls"] - a["calls"]
            print(f"| {group} | {f'`{v}`' if v else 'defaults'} | {d['n']} of {len(names)} "
                  f"| {d['min']:+,} | {d['pt']:+} | {d['cl']:+} | {d['syncs']:+,} "
                  f"| {d['calls']:+,} |")
    if changed:
        print()
    for n, v, a, b in changed:
        moved = [f"{k} {a[k]:.2f} -> {b[k]:.2f}" if k == "created_ratio" else
                 f"{k} {a[k]:,} -> {b[k]:,}" for k in FIGURE_NAMES if a[k] != b[k]]
        print(f"{n:44} {v or 'defaults'}: " + ", ".join(moved))


if __name__ == "__main__":
    main()
