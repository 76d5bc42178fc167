#!/usr/bin/env python3
"""Reads the TMA forward's step timeline (a build with -DCUFLASH_STEP_TIMELINE=ON;
src/cuda/sm90/step_timeline.cuh) and prints, per consumer warpgroup, the
median clocks of each phase of a step (first, middle and last key tile of an
item), of the item's end (drain turn, drain, epilogue) and per item.

    CUFLASH_TIMELINE_OUT=/tmp/tl/d64 CUFLASH_TIMELINE_AT=20 cuflash bench --backend cuda ... --reps 30
    python3 bench/step_timeline.py /tmp/tl/d64-d64-c3-s2.bin
    python3 bench/step_timeline.py --raw /tmp/tl/d128-d128-c2-s2.bin

Under each consumer's line, `next Q`: when the producer issued each item's
Q against when the consumer finished the item before (q_lead). Per file,
`producer`: per recorded CTA the longest wait between two of the producer's
issues (where in the walk, and its share of the CTA's time): medians leave
a one-off wait out (session 44 found one of ~30,000 clocks at the ring's
first wrap at 512 keys, ~8 % of the kernel; the producer's k_wait /
k_free / k_armed stamps around each K issue say whether such a wait is in
the stage's empty barrier, the expect-tx arrival or the TMA issue).
`CTAs`: from every CTA's span (files that have them): the spread of the
CTAs' walks in clocks and of their ends on the global timer, and how much
sooner the kernel would end if every CTA ended at the mean end (a static
walk ends with its slowest CTA; in session 44's timeline a third of the
CTAs took the partial query block in every round and ended ~11 % early).

`consumers' longest wait for data` (files from session 47 on): every CTA's
consumers time their waits for a tile's data (a step's K and pending V, the
drain's last V) and keep the longest in shared memory, written to the CTA's
span at its end, so unstamped CTAs report one with the plain kernel's
timing: how many CTAs had one of 5,000+ clocks, when, where and which.

`producer slot waits`: per tile, the producer's wait for its free K slot
and from K's issue to V's (slot_waits); a build with
-DCUFLASH_STEP_TIMELINE_PRODUCER_ONLY=ON leaves the consumers unstamped (their
stamps slow them ~1.2 x and so hand the producer a lead it lacks in the
plain kernel), and its consumer lines stay empty.

--raw prints every stamp of each recorded CTA's warpgroups instead, in clocks
from that CTA's first stamp: for walks of one item per CTA (small grids),
whose only item is both the first and the last that the medians leave out.

Step phases, each from the previous stamp: loads (the tile's K and pending V
landed), turn (the GEMM turn taken), S (S = Q K^T complete), softmax, tail
(the pending P V waited for, O rescaled). Items walked idle and each CTA's
first and last items are left out. The stamps themselves cost (the timed
kernel ran ~35 % slower in session 34): read the phases against each other,
not as the plain kernel's clocks.
"""
import collections
import statistics
import struct
import sys

EVENTS = {1: "start", 2: "item", 3: "loads", 4: "turn", 5: "S", 6: "softmax", 7: "step", 8: "drain_turn",
          9: "drain", 10: "epilogue", 11: "idle", 12: "load_q", 13: "load_k", 14: "load_v", 15: "end",
          16: "rows", 17: "staged", 18: "staged_all", 19: "k_wait", 20: "k_free", 21: "k_armed"}
STEP_PHASES = ("loads", "turn", "S", "softmax", "tail")
# The item's end: the drain's turn and P V, then the epilogue's phases (rows:
# sums and lse; staged: O written to shared memory; staged_all: fenced and
# the warpgroup synced; epilogue: the store issued, the buffer handed on).
END_PHASES = ("drain_turn", "drain", "rows", "staged", "staged_all", "epilogue")
CTAS = 4  # kTimelineCtas
WARPGROUPS = 4  # kTimelineWarpgroups


# A span's words: "TL01" files have the first five, "TL02" files (session 47)
# also each CTA's longest consumer wait for a tile's data (longest_wait).
SPAN_FIELDS = ("start_ns", "end_ns", "start_clock", "end_clock", "smid", "longest_wait")
SPAN_WORDS = {0x544C3031: 5, 0x544C3032: 6}
WAITS = {0: "step", 1: "drain"}  # step_timeline.cuh's TimelineWait


def read(path):
    """(meta, rows): meta has the header's fields and `spans`, every CTA's
    span (dicts of SPAN_FIELDS) from the section after the rows, or None for
    a file written before spans were recorded; rows are the stamp words."""
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("8i", data[:32])
    if header[0] not in SPAN_WORDS:
        sys.exit(f"{path}: not a step timeline")
    n = SPAN_WORDS[header[0]]
    entries = header[7]
    offset = 32 + 8 * header[6] * entries
    words = struct.unpack(f"{header[6] * entries}Q", data[32:offset])
    rows = [words[r * entries:(r + 1) * entries] for r in range(header[6])]
    meta = dict(zip(("d", "consumers", "stages", "ctas", "items"), header[1:6]))
    meta["spans"] = None
    if len(data) >= offset + 4:
        (count,) = struct.unpack("i", data[offset:offset + 4])
        span_words = struct.unpack(f"{n * count}Q", data[offset + 4:offset + 4 + 8 * n * count])
        meta["spans"] = [dict(zip(SPAN_FIELDS, span_words[n * i:n * i + n])) for i in range(count)]
    return meta, rows


def unpack_wait(word):
    """A CTA's longest wait (step_timeline.cuh's timeline_waited) as (clocks,
    start from the CTA's start, which wait, kv_count), or None where none
    reached kLongWait."""
    if not word:
        return None
    return word >> 40, (word >> 16) & 0xFFFFFF, WAITS[(word >> 15) & 1], word & 0x7FFF


def long_wait_line(spans, over=5000):
    """One line on the CTAs' longest waits for data (files that have them):
    how many CTAs waited `over` clocks or more once, and for those the
    median wait, start, kind and tile. Every CTA records it, the stamping
    ones too (their stamps may cause their own)."""
    waits = [unpack_wait(s["longest_wait"]) for s in spans if "longest_wait" in s]
    if not waits:
        return None
    long = [w for w in waits if w and w[0] >= over]
    line = f"  consumers' longest wait for data: {len(long)} of {len(waits)} CTAs waited {over}+ clocks once"
    if long:
        kinds = collections.Counter(w[2] for w in long)
        line += (f"; those: median {statistics.median(w[0] for w in long):.0f} clocks, starting "
                 f"{statistics.median(w[1] for w in long):.0f} clocks into the walk (min {min(w[1] for w in long)}, "
                 f"max {max(w[1] for w in long)}), at tile {statistics.median(w[3] for w in long):.0f} (median), "
                 + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    return line


def stamps(row):
    """A warpgroup's row as (event name, clock) pairs, up to its first empty word."""
    out = []
    for word in row:
        if word == 0:
            break
        out.append((EVENTS.get(word >> 56, "?"), word & ((1 << 56) - 1)))
    return out


def span_summary(spans):
    """One line on the CTAs' spans: walk clocks and end times (from the
    earliest start) min / median / max, and the share of the kernel a
    balance to the mean end would save. The first CTAS CTAs (those that
    stamp) are left out of it when there are others, and their median walk
    is given beside: their stamps slow them (session 45: ~20 % at D = 64,
    512 keys), so with them in, the spread and the last SMs were theirs."""
    stamping = [s for s in spans[:CTAS] if s["end_ns"] > 0] if len(spans) > CTAS else []
    spans = [s for s in (spans[CTAS:] if stamping else spans) if s["end_ns"] > 0]
    if not spans:
        return None
    t0 = min(s["start_ns"] for s in spans)
    ends = [(s["end_ns"] - t0) / 1e3 for s in spans]
    clocks = [s["end_clock"] - s["start_clock"] for s in spans]
    last = max(ends)
    slowest = sorted(spans, key=lambda s: s["end_ns"])[-3:]
    line = (f"  CTAs ({len(spans)}{', without stamps' if stamping else ''}): walk clocks min {min(clocks)}, "
            f"median {statistics.median(clocks):.0f}, max {max(clocks)}; end us min {min(ends):.1f}, "
            f"median {statistics.median(ends):.1f}, max {last:.1f}; "
            f"ended at the mean end: {100.0 * (1 - statistics.mean(ends) / last):.1f} % sooner; "
            f"last SMs {[s['smid'] for s in reversed(slowest)]}")
    if stamping:
        stamped = statistics.median(s["end_clock"] - s["start_clock"] for s in stamping)
        line += (f"; the {len(stamping)} stamping CTAs' walks median {stamped:.0f} clocks "
                 f"({stamped / statistics.median(clocks):.2f} x)")
    return line


def consumer_items(row):
    """The row's items: lists of (event name, clock), each from its `item` stamp."""
    items = []
    for event, clock in stamps(row):
        if event == "item":
            items.append([])
        if items:
            items[-1].append((event, clock))
    return items


def phases(items):
    out = collections.defaultdict(list)
    for item, following in zip(items[1:-1], items[2:]):
        if any(e == "idle" for e, _ in item):
            continue
        start = prev = item[0][1]
        steps = []
        i = 1
        while i < len(item):
            event, clock = item[i]
            if event == "loads" and i + 4 < len(item):
                clocks = [clock] + [c for _, c in item[i + 1:i + 5]]
                steps.append([clocks[0] - prev] + [b - a for a, b in zip(clocks, clocks[1:])])
                prev = clocks[-1]
                i += 5
                continue
            if event in END_PHASES:
                out[("end", event)].append(clock - prev)
                prev = clock
            i += 1
        for j, step in enumerate(steps):
            where = "first" if j == 0 else "last" if j == len(steps) - 1 else "mid"
            for name, value in zip(STEP_PHASES, step):
                out[(where, name)].append(value)
        out[("item", "clocks")].append(prev - start)
        out[("item", "steps")].append(len(steps))
        out[("item", "to_next")].append(following[0][1] - prev)
    return out


def q_lead(producer_row, consumer_row):
    """Per item after a CTA's first: how long before the consumer finished
    the previous item (its last stamp) the producer issued this item's Q
    (load_q; negative: issued after), and how long the consumer then took to
    start it (its `item` stamp, after the Q's wait): whether a consumer
    waiting for Q waits for the producer or for the load. (No load_q stamps
    where Q has a warp of its own, TmaFwdShape::kQWarp: D >= 128.)"""
    issued = [clock for event, clock in stamps(producer_row) if event == "load_q"]
    items = consumer_items(consumer_row)
    leads, waits = [], []
    for k in range(1, min(len(items), len(issued))):
        if not items[k - 1]:
            continue
        ready = items[k - 1][-1][1]
        leads.append(ready - issued[k])
        waits.append(items[k][0][1] - ready)
    return leads, waits


def last_v_lead(producer_row, consumer_row):
    """Per item (not walked idle): how long before the consumer's drain turn
    (its `drain_turn` stamp, which follows the wait for the item's last V)
    the producer issued that V (the item's last tile's load_v; the
    producer's load_v stamps number the CTA's key tiles in order, the
    consumer's `loads` stamps count each item's tiles), and how long the
    consumer waited from its last step's end to that turn. Items whose last
    V is past the producer's recorded stamps are left out. A short or
    negative lead with a long wait: the drain waits for the V's load."""
    issued = [clock for event, clock in stamps(producer_row) if event == "load_v"]
    leads, waits, tiles = [], [], 0
    for item in consumer_items(consumer_row):
        events = [e for e, _ in item]
        tiles += events.count("loads")
        if "idle" in events or "drain_turn" not in events or not 0 < tiles <= len(issued):
            continue
        k = events.index("drain_turn")
        if k == 0 or events[k - 1] != "step":
            continue
        turn = item[k][1]
        leads.append(turn - issued[tiles - 1])
        waits.append(turn - item[k - 1][1])
    return leads, waits


def pooled(lead, meta, rows, wg):
    """lead(producer row, row of warpgroup wg) (q_lead, last_v_lead; the
    producer's slot_waits with wg 0) over the recorded CTAs, its two lists
    joined."""
    leads, waits = [], []
    for cta in range(min(CTAS, meta["ctas"])):
        lead_part, wait_part = lead(rows[cta * WARPGROUPS], rows[cta * WARPGROUPS + wg])
        leads.extend(lead_part)
        waits.extend(wait_part)
    return leads, waits


def longest_producer_wait(producer_row):
    """The producer's longest gap between consecutive stamps: (clocks, the
    stamp before it, the stamp after it, the gap's start and the walk's
    length, both from the first stamp), or None with fewer than two stamps."""
    row = stamps(producer_row)
    if len(row) < 2:
        return None
    origin = row[0][1]
    gap, before, after = max((b[1] - a[1], a, b) for a, b in zip(row, row[1:]))
    return gap, before[0], after[0], before[1] - origin, row[-1][1] - origin


def slot_waits(producer_row):
    """The producer's wait for each tile's free slots: K (k_wait -> k_free)
    and V (load_k -> load_v, which holds V's empty-barrier wait, its
    expect-tx arrival and its TMA issue) in clocks, as two lists. A wait
    about as short as the stamps' own cost means the slot was free before
    the producer came to it: the consumers were waiting for the producer,
    not it for them (read it in a producer-only build, where the consumers'
    stamps do not slow them)."""
    k_waits, v_waits, waiting_k, loaded_k = [], [], None, None
    for event, clock in stamps(producer_row):
        if event == "k_wait":
            waiting_k = clock
        elif event == "k_free" and waiting_k is not None:
            k_waits.append(clock - waiting_k)
            waiting_k = None
        elif event == "load_k":
            loaded_k = clock
        elif event == "load_v" and loaded_k is not None:
            v_waits.append(clock - loaded_k)
            loaded_k = None
    return k_waits, v_waits


def slot_wait_line(meta, rows, free_below=400):
    """One line on the recorded CTAs' slot waits (slot_waits): medians,
    90th percentiles and the share under `free_below` clocks."""
    k_all, v_all = pooled(lambda producer, _: slot_waits(producer), meta, rows, 0)
    if not k_all or not v_all:
        return None

    def describe(waits):
        ordered = sorted(waits)
        free = sum(w < free_below for w in waits)
        return (f"median {statistics.median(waits):.0f}, p90 {ordered[len(ordered) * 9 // 10]}, "
                f"under {free_below}: {100.0 * free / len(waits):.0f} %")

    return f"  producer slot waits over {len(k_all)} tiles: K {describe(k_all)}; V {describe(v_all)}"


def raw(meta, rows):
    """Each recorded CTA's stamps, per warpgroup, from the CTA's first."""
    for cta in range(min(CTAS, meta["ctas"])):
        by_wg = [stamps(rows[cta * WARPGROUPS + wg]) for wg in range(meta["consumers"] + 1)]
        clocks = [c for wg in by_wg for _, c in wg]
        if not clocks:
            continue
        origin = min(clocks)
        print(f"  CTA {cta}:")
        for wg, row in enumerate(by_wg):
            who = "producer" if wg == 0 else f"consumer {wg - 1}"
            print(f"    {who}: " + ", ".join(f"{e} {c - origin}" for e, c in row))


def main():
    show_raw = "--raw" in sys.argv[1:]
    for path in [a for a in sys.argv[1:] if a != "--raw"]:
        meta, rows = read(path)
        print(f"{path}: D {meta['d']}, {meta['consumers']} consumers, {meta['stages']} stages, "
              f"{meta['ctas']} CTAs, {meta['items']} items")
        if show_raw:
            raw(meta, rows)
            continue
        for line in (span_summary(meta["spans"]), long_wait_line(meta["spans"])) if meta["spans"] else ():
            if line:
                print(line)
        for cta in range(min(CTAS, meta["ctas"])):
            wait = longest_producer_wait(rows[cta * WARPGROUPS])
            if wait:
                gap, before, after, at, length = wait
                print(f"  producer, CTA {cta}: longest wait {gap} clocks ({before} at {at} -> {after}), "
                      f"{100.0 * gap / max(length, 1):.1f} % of its {length} clocks")
        line = slot_wait_line(meta, rows)
        if line:
            print(line)
        for wg in range(1, meta["consumers"] + 1):
            merged = collections.defaultdict(list)
            for cta in range(min(CTAS, meta["ctas"])):
                for key, values in phases(consumer_items(rows[cta * WARPGROUPS + wg])).items():
                    merged[key].extend(values)
            parts = []
            for where, names in (("first", STEP_PHASES), ("mid", STEP_PHASES), ("last", STEP_PHASES),
                                 ("end", END_PHASES), ("item", ("clocks", "to_next", "steps"))):
                shown = [f"{n} {statistics.median(merged[(where, n)]):.0f}" for n in names if merged[(where, n)]]
                if shown:
                    parts.append(f"{where}: " + ", ".join(shown))
            print(f"  consumer {wg - 1}: " + " | ".join(parts))
            leads, waits = pooled(q_lead, meta, rows, wg)
            v_leads, v_waits = pooled(last_v_lead, meta, rows, wg)
            if v_leads:
                print(f"    last V: issued {statistics.median(v_leads):.0f} clocks before the drain's turn "
                      f"(median; shortest {min(v_leads)}), the turn {statistics.median(v_waits):.0f} after "
                      f"the last step (median; longest {max(v_waits)}) over {len(v_leads)} items")
            if leads:
                print(f"    next Q: issued {statistics.median(leads):.0f} clocks before the consumer was ready "
                      f"(median; {sum(x < 0 for x in leads)} of {len(leads)} after), then "
                      f"{statistics.median(waits):.0f} to the item's start")


if __name__ == "__main__":
    main()
