#!/usr/bin/env python3
"""Where the daemon kernel's time goes, from its event trace.

Usage: dk_trace_summary.py TRACE [--block B|reader] [--top N] [--turnaround] [--blocks] [--data]
                           [--launches] [--stalls US] [--bursts US]

TRACE is the file a CUDA worker writes when dfccld runs with
DFCCL_DK_TRACE=TRACE (gpu/cuda/dkernel.h): one line per event of thread 0 of
a block, "block ns event arg". For block B (default 0) this prints

  - every transition between two consecutive events (a step is named by its
    dk_step, so "step POSTS -> data" is the time from reaching POSTS to the
    first piece of data), with its count, median, mean and total time,
    the N (default 25) with the largest total first;
  - per task, the time from its arrival on the block to its completion;
  - the time between two completions, the figure a client sees back to back.

--block reader does the same for the queue reader (its block number is in
the trace's header): the time of its passes over the queue pairs, those that
took nothing ("queues (took none)") and those that took entries (and then
the passes by how many entries each took, with the time per entry), the phases
of each take of an entry ("take copied -> take checked": the check of the
copy), and, for entries it completed itself (NOPs, refusals), its
completions.

With --turnaround it prints instead, over every block, the time from each
completion to the queue reader's next take of an entry: with one collective
at a time, the client's (or its stream's) reaction to a completion plus the
reader's noticing of the next arm word.

With --blocks it prints instead a line per block (the queue reader left
out): the tasks that arrived in its queue, the completions it made, the
median time between its completions and from a task's arrival to its
completion, and how many of its tasks were in its queue at once (arrived,
and neither completed there nor past their channel's CHDONE step, where a
channel of several leaves the block whose channel does not complete the
task: mean over the block's span, and the most). A
batch of single-channel collectives whose tasks a block runs one after
another shows about one in flight and its chain per task between
completions; a block that interleaves its tasks' waits shows more.

With --data it prints instead a line per block (the queue reader left out)
for its pieces of data: each "data" event (its argument the piece's bytes)
to the block's next event is the piece's time; the pieces, their bytes,
their time and its share of the block's busy time, the rate within the
pieces and the median piece. Busy is the time from any of the block's
events but an idle turn of its loop ("loop 0": nothing queued) to its next
event: a benchmark's checks between its calls and a kernel that quit for
being idle are not counted. A large collective whose share is low is bound
by its steps around the data; one whose rate within the pieces is low, by
how fast a block moves data.

With --launches it prints instead where each launch of the resident grid
(block 0's "start begun": the block's first instruction) spends its start,
from that event: block 0's counters loaded and its queue rebuilt ("start
loaded", "start ready"), the queue reader's beginning (a little before
block 0's, where that is when it came) and its wait for every block, its
first pass over the queue pairs, its first pass that took an entry, the
first task on a block, the first completion, and the launch's last event;
and the time from one launch's last event to the next launch's beginning
(the kernel absent: it quit for being idle, or was parked). A relaunched kernel's start, in a
loop that waits on each completion, is the part after its beginning that
a kernel which stays resident would not pay.

With --bursts US it prints instead what paces a batch: the queue reader's
passes that took entries are cut into bursts wherever more than US
microseconds pass from the end of one to the start of the next (a pass
starts where the one before it ended); each completion belongs to the
last burst begun before it. For each figure of a burst it prints its
median, least and most over the bursts with a completion: the entries
taken and the completions; the span from the start of the burst's first
pass to its last completion or take; its passes, their time and its
share of the span; those that took 1-3 entries and their time (a batch's
start, while the client is still issuing); the tail from the end of the
last pass to the last completion (0 where a take came last); and the
launches of the resident grid (block 0's "start begun") within the span.
A span that the reader's passes fill is paced by the reader; a long tail
by the tasks themselves; neither, by the client or the kernel's starts.

With --stalls US it prints instead every interval longer than US
microseconds in which no block and not the reader recorded anything: the
kernel was not running (it quit for being idle, or was parked), or the GPU
ran another context (without MPS, a client's context with work queued takes
time slices from the daemon kernel's), with their count, total and share of
the trace's span. Every block of a running kernel records its loop every
microsecond or so, so a gap of tens of microseconds is none of its own.
"""
import bisect
import argparse
import statistics
import sys

# enum dk_step, in order (gpu/cuda/dkernel.h).
STEPS = ["SLOT", "POSTS", "WORK1", "SYNC1", "WORK2", "CHDONE", "FINISH", "BOX_FREE", "BOX_ACK", "BOX_KEY",
         "AWAIT", "AWORK", "BOX_WANT", "PUSH", "LEFT", "DRAIN", "LLPULL", "SELF"]
# enum dk_take_phase, in order (gpu/cuda/dkernel.h): the queue reader's pass and take of an entry.
TAKES = ["header", "scanned", "copied", "armed", "checked", "task", "done", "admitted", "filled", "handed", "loaded",
         "prepared"]
# enum dk_start_phase, in order (gpu/cuda/dkernel.h): how far a launch's block got.
STARTS = ["begun", "loaded", "ready"]


def label(event, arg):
    """An event as the tables name it: steps and preemptions with their step."""
    if event in ("step", "preempt"):
        step = arg & 0xFFFF
        return "%s %s" % (event, STEPS[step] if step < len(STEPS) else str(step))
    if event == "take":
        return "take %s" % (TAKES[arg] if arg < len(TAKES) else str(arg))
    if event == "start":
        return "start %s" % (STARTS[arg] if arg < len(STARTS) else str(arg))
    if event == "queues":
        return "queues (took %s)" % ("none" if arg == 0 else "some")
    return event


def records(path):
    """Every event of the trace: (block, ns, event, arg)."""
    with open(path) as f:
        for line in f:
            parts = line.split()
            if line.startswith("#") or len(parts) != 4:
                continue
            yield int(parts[0]), int(parts[1]), parts[2], int(parts[3])


def read(path, block):
    return [(t, e, a) for b, t, e, a in records(path) if b == block]


def reader_of(path):
    """The queue reader's block number, from the trace's header line."""
    with open(path) as f:
        for line in f:
            if not line.startswith("#"):
                break
            words = line.replace(";", " ").replace(":", " ").split()
            for i, w in enumerate(words[:-2]):
                if w == "block" and words[i + 1].isdigit() and words[i + 2] == "the":
                    return int(words[i + 1])
    raise ValueError("no queue reader named in its header")


def turnaround(path):
    reader = reader_of(path)
    completions, takes = [], []
    for block, t, event, arg in records(path):
        if block == reader and event == "queues" and arg > 0:
            takes.append(t)
        elif block != reader and event == "complete":
            completions.append(t)
    takes.sort()
    deltas = []
    for c in sorted(completions):
        i = bisect.bisect_right(takes, c)
        if i < len(takes):
            deltas.append(takes[i] - c)
    if not deltas:
        print("completion to the next entry taken: none")
        return
    print("completion to the next entry taken: %d, median %s us, mean %s us, min %s us, max %s us" %
          (len(deltas), us(statistics.median(deltas)), us(statistics.mean(deltas)), us(min(deltas)),
           us(max(deltas))))


def blocks(path):
    reader = reader_of(path)
    per = {}
    for block, t, event, arg in records(path):
        if block == reader:
            continue
        d = per.setdefault(block, {"arrived": {}, "queued": set(), "spans": [], "done": [], "tasks": 0,
                                   "current": None, "most": 0, "area": 0, "first": t, "last": t})
        d["area"] += len(d["queued"]) * (t - d["last"])
        d["last"] = t
        if event == "task":
            d["tasks"] += 1
            d["arrived"][arg] = t
            d["queued"].add(arg)  # a task slot reused: counted once
            d["most"] = max(d["most"], len(d["queued"]))
        elif event in ("step", "preempt"):
            d["current"] = arg >> 16
            if event == "step" and arg & 0xFFFF == STEPS.index("CHDONE"):
                d["queued"].discard(d["current"])
        elif event == "complete":
            d["done"].append(t)
            d["queued"].discard(d["current"])
            if d["current"] in d["arrived"]:
                d["spans"].append(t - d["arrived"].pop(d["current"]))
    if not per:
        print("blocks: none traced")
        return

    def med(values):
        return us(statistics.median(values)) if values else "-"

    print("%6s %7s %10s %13s %13s %10s %6s" % ("block", "tasks", "completed", "between us", "arrival->c us",
                                                "in flight", "most"))
    gaps, spans = [], []
    for block in sorted(per):
        d = per[block]
        between = [b - a for a, b in zip(d["done"], d["done"][1:])]
        gaps += between
        spans += d["spans"]
        span = d["last"] - d["first"]
        print("%6d %7d %10d %13s %13s %10.2f %6d" % (block, d["tasks"], len(d["done"]), med(between), med(d["spans"]),
                                                    d["area"] / span if span else 0.0, d["most"]))
    print("%6s %7d %10d %13s %13s" % ("all", sum(d["tasks"] for d in per.values()),
                                      sum(len(d["done"]) for d in per.values()), med(gaps), med(spans)))


def data(path):
    reader = reader_of(path)
    per = {}
    for block, t, event, arg in records(path):
        if block != reader:
            per.setdefault(block, []).append((t, event, arg))
    rows = []
    for block in sorted(per):
        evs = sorted(per[block], key=lambda r: r[0])
        pieces = [(a[2], b[0] - a[0]) for a, b in zip(evs, evs[1:]) if a[1] == "data"]
        busy = sum(b[0] - a[0] for a, b in zip(evs, evs[1:]) if not (a[1] == "loop" and a[2] == 0))
        if pieces:
            rows.append((block, pieces, busy))
    if not rows:
        print("data: no piece traced")
        return

    def line(name, pieces, busy):
        nbytes, ns = sum(p[0] for p in pieces), sum(p[1] for p in pieces)
        print("%6s %7d %10.1f %12s %7.1f %10s %10s" % (
            name, len(pieces), nbytes / 1048576.0, us(ns), 100.0 * ns / busy if busy else 0.0,
            "%.1f" % (nbytes / ns) if ns else "-", us(statistics.median(p[1] for p in pieces))))

    print("%6s %7s %10s %12s %7s %10s %10s" % ("block", "pieces", "MiB", "in pieces us", "busy %", "GB/s",
                                               "median us"))
    for block, pieces, busy in rows:
        line("%d" % block, pieces, busy)
    line("all", [p for _, ps, _ in rows for p in ps], sum(busy for _, _, busy in rows))


READER_NEAR_NS = 50000


def launches(path):
    reader = reader_of(path)
    evs = sorted(records(path), key=lambda r: r[1])
    times = [r[1] for r in evs]
    begins = [t for b, t, e, a in evs if b == 0 and e == "start" and a == STARTS.index("begun")]
    if not begins:
        print("launches: none traced (no block 0 \"start begun\" event)")
        return
    # Per launch, the first time of each milestone after its beginning.
    marks = ["block 0 loaded", "block 0 ready", "reader begun", "reader ready", "first pass", "first take", "first task",
             "first completion", "last event"]
    rows = {m: [] for m in marks}
    absent = []
    # The reader may begin a little before block 0 (its own thread of the
    # same launch): the nearest of its beginnings, either side, within
    # READER_NEAR_NS, is the launch's (a negative offset where it came first).
    reader_begins = [t for b, t, e, a in evs if b == reader and e == "start" and a == STARTS.index("begun")]
    for t0 in begins:
        near = min(reader_begins, key=lambda t: abs(t - t0), default=None)
        if near is not None and abs(near - t0) <= READER_NEAR_NS:
            rows["reader begun"].append(near - t0)
    for i, t0 in enumerate(begins):
        end = begins[i + 1] if i + 1 < len(begins) else None
        seen, last = {}, t0
        for k in range(bisect.bisect_left(times, t0), len(evs)):
            b, t, e, a = evs[k]
            if end is not None and t >= end:
                break
            if b == reader and e == "start" and a == STARTS.index("begun"):
                continue  # matched to its launch above
            last = t
            if b == 0 and e == "start" and a in (STARTS.index("loaded"), STARTS.index("ready")):
                m = "block 0 " + STARTS[a]
            elif b == reader and e == "start" and a == STARTS.index("ready"):
                m = "reader ready"
            elif b == reader and e == "queues":
                m = "first take" if a > 0 else "first pass"
                seen.setdefault("first pass", t)
            elif b != reader and e == "task":
                m = "first task"
            elif b != reader and e == "complete":
                m = "first completion"
            else:
                continue
            seen.setdefault(m, t)
        seen["last event"] = last
        for m, t in seen.items():
            rows[m].append(t - t0)
        if end is not None:
            absent.append(end - last)
    print("launches: %d (block 0's \"start begun\" events)" % len(begins))
    print("%-34s %8s %10s %10s %10s" % ("from the launch's beginning to", "count", "median us", "min us", "max us"))
    for m in marks:
        d = rows[m]
        if d:
            print("%-34s %8d %10s %10s %10s" % (m, len(d), us(statistics.median(d)), us(min(d)), us(max(d))))
    if absent:
        print("%-34s %8d %10s %10s %10s" % ("absent (last event -> next launch)", len(absent),
                                           us(statistics.median(absent)), us(min(absent)), us(max(absent))))


def stalls(path, min_us):
    times = sorted(t for _, t, _, _ in records(path))
    if len(times) < 2:
        raise ValueError("fewer than two events")
    gaps = [(a, b - a) for a, b in zip(times, times[1:]) if b - a > min_us * 1000]
    span = times[-1] - times[0]
    total = sum(g for _, g in gaps)
    print("stalls over %s us: %d, total %s us of %s us traced (%.1f %%)" %
          (min_us, len(gaps), us(total), us(span), 100.0 * total / span if span else 0.0))
    for start, g in gaps:
        print("  at %s us: %s us" % (us(start - times[0]), us(g)))


BURST_SMALL = 3  # entries: a pass that took at most this many is a "small" one


def bursts(path, gap_us):
    reader = reader_of(path)
    evs = sorted(records(path), key=lambda r: r[1])
    gap = gap_us * 1000
    ends = [(t, a) for b, t, e, a in evs if b == reader and e == "queues"]
    # The passes that took: (start, end, entries), a pass from the end of
    # the one before.
    takes = [(t0, t1, got) for (t0, _), (t1, got) in zip(ends, ends[1:]) if got > 0]
    groups = []
    for tk in takes:
        if not groups or tk[0] - groups[-1]["takes"][-1][1] > gap:
            groups.append({"takes": [], "dones": []})
        groups[-1]["takes"].append(tk)
    # A completion belongs to the last burst begun before it.
    firsts = [g["takes"][0][0] for g in groups]
    for b, t, e, a in evs:
        if b != reader and e == "complete":
            i = bisect.bisect_right(firsts, t)
            if i > 0:
                groups[i - 1]["dones"].append(t)
    begins = [t for b, t, e, a in evs if b == 0 and e == "start" and a == STARTS.index("begun")]
    # Each figure: its name and how it prints (a count, microseconds, a share).
    count, micro, share = (lambda v: "%g" % v), us, (lambda v: "%.1f" % v)
    names = [("entries taken", count), ("completions", count), ("span us", micro), ("passes that took", count),
             ("  their time us", micro), ("  their share of the span %", share),
             ("passes of 1-%d entries" % BURST_SMALL, count), ("  their time us", micro),
             ("tail us (last take -> last completion)", micro), ("launches", count)]
    rows = []
    for g in groups:
        takes, dones = g["takes"], g["dones"]
        if not dones:
            continue
        start, end = takes[0][0], max(dones[-1], takes[-1][1])
        small = [tk for tk in takes if tk[2] <= BURST_SMALL]
        taking, span = sum(t1 - t0 for t0, t1, _ in takes), end - start
        rows.append([sum(tk[2] for tk in takes), len(dones), span, len(takes), taking,
                     100.0 * taking / span if span else 0.0, len(small), sum(t1 - t0 for t0, t1, _ in small),
                     end - takes[-1][1], sum(1 for t in begins if start <= t <= end)])
    print("bursts: %d with a completion (cut where the reader took nothing for over %s us; %d without)" %
          (len(rows), gap_us, len(groups) - len(rows)))
    if not rows:
        return
    print("%-40s %10s %10s %10s" % ("per burst", "median", "least", "most"))
    for i, (name, f) in enumerate(names):
        d = [r[i] for r in rows]
        print("%-40s %10s %10s %10s" % (name, f(statistics.median(d)), f(min(d)), f(max(d))))


def us(ns):
    return "%.2f" % (ns / 1000.0)


def summary(events, top):
    pairs = {}
    for (t0, e0, a0), (t1, e1, a1) in zip(events, events[1:]):
        pairs.setdefault((label(e0, a0), label(e1, a1)), []).append(t1 - t0)
    rows = sorted(pairs.items(), key=lambda kv: -sum(kv[1]))[:top]
    print("%-28s %-28s %8s %9s %9s %11s" % ("from", "to", "count", "median us", "mean us", "total us"))
    for (a, b), d in rows:
        print("%-28s %-28s %8d %9s %9s %11s" % (a, b, len(d), us(statistics.median(d)), us(statistics.mean(d)),
                                                us(sum(d))))

    arrived, spans, completions, current = {}, [], [], None
    for t, e, a in events:
        if e == "task":
            arrived[a] = t
        elif e in ("step", "preempt"):
            current = a >> 16
        elif e == "complete":
            completions.append(t)
            if current in arrived:
                spans.append(t - arrived.pop(current))
    for name, values in (("task arrival to completion", spans),
                         ("between completions", [b - a for a, b in zip(completions, completions[1:])])):
        if values:
            print("%s: %d, median %s us, mean %s us, min %s us, max %s us" %
                  (name, len(values), us(statistics.median(values)), us(statistics.mean(values)),
                   us(min(values)), us(max(values))))
        else:
            print("%s: none" % name)


def main():
    ap = argparse.ArgumentParser(description="Where the daemon kernel's time goes, from its event trace.")
    ap.add_argument("trace", help="the file dfccld's CUDA worker wrote (DFCCL_DK_TRACE)")
    ap.add_argument("--block", default="0",
                    help="the block (channel) to look at (default 0), or 'reader': the queue reader's passes")
    ap.add_argument("--top", type=int, default=25, help="transitions to list (default 25)")
    ap.add_argument("--turnaround", action="store_true",
                    help="the time from each completion to the queue reader's next take instead")
    ap.add_argument("--blocks", action="store_true",
                    help="a line per block instead: tasks, completions, their pace, tasks in flight")
    ap.add_argument("--data", action="store_true",
                    help="a line per block instead: its pieces of data, their time and rate")
    ap.add_argument("--launches", action="store_true",
                    help="where each launch of the resident grid spends its start instead")
    ap.add_argument("--stalls", type=float, metavar="US",
                    help="the intervals longer than US microseconds with no event of any block instead")
    ap.add_argument("--bursts", type=float, metavar="US",
                    help="what paces each burst of the reader's takes (cut at gaps over US microseconds) instead")
    args = ap.parse_args()
    # The modes over the whole trace, each instead of a block's tables.
    whole = None
    if args.stalls is not None:
        whole = lambda: stalls(args.trace, args.stalls)
    elif args.bursts is not None:
        whole = lambda: bursts(args.trace, args.bursts)
    elif args.blocks:
        whole = lambda: blocks(args.trace)
    elif args.data:
        whole = lambda: data(args.trace)
    elif args.launches:
        whole = lambda: launches(args.trace)
    elif args.turnaround:
        whole = lambda: turnaround(args.trace)
    if whole:
        try:
            whole()
        except (OSError, ValueError) as e:
            sys.exit("dk_trace_summary: cannot read %s: %s" % (args.trace, e))
        return
    if args.block != "reader" and not args.block.isdigit():
        sys.exit("dk_trace_summary: --block takes a block number or 'reader', not %r" % args.block)
    try:
        block = reader_of(args.trace) if args.block == "reader" else int(args.block)
        events = read(args.trace, block)
    except (OSError, ValueError) as e:
        sys.exit("dk_trace_summary: cannot read %s: %s" % (args.trace, e))
    if len(events) < 2:
        sys.exit("dk_trace_summary: block %d has %d event(s) in %s" % (block, len(events), args.trace))
    summary(events, args.top)
    if args.block == "reader":
        passes(events)


def passes(events):
    """The reader's passes by how many entries each took: the time from the
    end of one pass to the end of the next, so the time per entry shows
    where a batch arrives at once."""
    ends = [(t, a) for t, e, a in events if e == "queues"]
    by = {}
    for (t0, _), (t1, got) in zip(ends, ends[1:]):
        by.setdefault(got, []).append(t1 - t0)
    print("passes by entries taken: taken, count, median us, mean us, median us per entry")
    for got in sorted(by):
        d = by[got]
        med = statistics.median(d)
        print("%6d %8d %9s %9s %9s" % (got, len(d), us(med), us(statistics.mean(d)), us(med / got) if got else "-"))


if __name__ == "__main__":
    main()
