#!/usr/bin/env python3
"""Condenses an Nsight Compute source page (`ncu -i r.ncu-rep --page source
--print-source sass --csv`, written by bench/profile_kernels.sh) into executed
instructions and stall samples per opcode, to compare two kernels.

    python3 bench/sass_profile.py ours-sass.csv [theirs-sass.csv]
    python3 bench/sass_profile.py --stall wait ours-sass.csv [theirs-sass.csv]
    python3 bench/sass_profile.py --listing [--stall wait] ours-sass.csv

--listing prints one kernel's main loop instruction by instruction, in
address order, with its samples (and those of REASON): the instructions
executed as often as most of the hot ones (the loop's count, found as the
most common count among those executed at least 1 % as often as the top
one, within 5 %), so that an outlier (a producer's spin loop) does not
hide the consumers' step (session 36: where the MUFU waited, between
which instructions the dependent chains run).

With --stall REASON (a `stall_*` column without its prefix: wait, barrier,
long_sb, math, ...) the samples column counts that reason alone, which says
where a kernel waits for it (session 24: MUFU.EX2 held 9.2 k of our 30 k
`wait` samples against 0.5 k in cuDNN's kernel).
"""
import collections
import csv
import sys


def read_source_page(path):
    """The page's column index by name and its instruction rows."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header = rows[header_at]
    col = {name: i for i, name in enumerate(header)}
    return col, [r for r in rows[header_at + 1:] if len(r) >= len(header)]


def load(path):
    col, body = read_source_page(path)
    stalls = [h for h in col if h.startswith("stall_") and "Not Issued" not in h]
    per_op = collections.defaultdict(lambda: collections.Counter())
    for r in body:
        words = r[col["Source"]].split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if not words:
            continue
        op = words[0].split(".")[0]
        c = per_op[op]
        c["inst"] += int(float(r[col["Instructions Executed"]] or 0))
        for s in stalls:
            c[s] += int(float(r[col[s]] or 0))
    return per_op, stalls


def listing(path, only):
    col, body = read_source_page(path)
    if only is not None and only not in col:
        sys.exit(f"sass_profile: no column {only} in {path}")
    executed = [int(float(r[col["Instructions Executed"]] or 0)) for r in body]
    top = max(executed, default=0)
    hot = collections.Counter(e for e in executed if e >= top / 100 and e > 0)
    if not hot:
        sys.exit(f"sass_profile: no executed instructions in {path}")
    loop_count = hot.most_common(1)[0][0]
    in_loop = [(r, e) for r, e in zip(body, executed) if abs(e - loop_count) <= loop_count / 20]
    total = sum(int(float(r[col["Warp Stall Sampling (All Samples)"]] or 0)) for r, _ in in_loop)
    print(f"{len(in_loop)} instructions executed ~{loop_count:,} times; {total:,} samples")
    print(f"{'samples':>8}{only[6:] if only else '':>8}  source")
    for r, _ in in_loop:
        samples = int(float(r[col["Warp Stall Sampling (All Samples)"]] or 0))
        reason = f"{int(float(r[col[only]] or 0)):>8}" if only else " " * 8
        print(f"{samples:>8}{reason}  {r[col['Source']].strip()}")


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        sys.exit(__doc__)
    show_listing = args[:1] == ["--listing"]
    if show_listing:
        args = args[1:]
    only = None
    if args[:1] == ["--stall"]:
        only, args = "stall_" + args[1], args[2:]
    if show_listing:
        for p in args:
            listing(p, only)
        return
    tables = [load(p) for p in args]
    if only is not None:
        missing = [p for p, (_, stalls) in zip(args, tables) if only not in stalls]
        if missing:
            sys.exit(f"sass_profile: no column {only} in {', '.join(missing)}")
        tables = [(t, [only]) for t, _ in tables]
    ops = sorted({op for t, _ in tables for op in t}, key=lambda o: -sum(t[o]["inst"] for t, _ in tables))
    print("opcode".ljust(10) + "".join(f"{'inst ' + str(i):>14}{'samples ' + str(i):>12}" for i in range(len(tables))))
    for op in ops[:30]:
        line = op.ljust(10)
        for t, stalls in tables:
            c = t.get(op, collections.Counter())
            line += f"{c['inst']:>14,}{sum(c[s] for s in stalls):>12,}"
        print(line)
    for i, (t, stalls) in enumerate(tables):
        total = collections.Counter()
        for c in t.values():
            total.update(c)
        print(f"[{i}] total inst {total['inst']:,}; stalls: " +
              ", ".join(f"{s[6:]} {total[s]:,}" for s in sorted(stalls, key=lambda s: -total[s])[:8]))


if __name__ == "__main__":
    main()
