#!/usr/bin/env python3
"""dk_trace_summary.py on a trace whose figures are known by construction.

Block 0 runs three collectives of the same shape (task, step POSTS, data,
complete) with fixed gaps; the queue reader (block 16, named in the header)
takes each next entry a fixed time after the previous completion, with an
empty pass in between. Every figure the summary prints is computed here from
those gaps, not from the script's output.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "dk_trace_summary.py")

# Per collective (ns after its start): task, POSTS, data, complete.
SHAPE = [("task", 0), ("step", 1000), ("data", 4000), ("complete", 10000)]
STARTS = [0, 20000, 45000]            # block 0's task arrivals
TAKE_AFTER = [3000, 7000]             # reader's take after completions 0 and 1
READER = 16


def trace_lines():
    lines = ["# block ns event arg (GPU 0; block %d: the queue reader)" % READER,
             "%d 0 queues 1" % READER]
    for k, start in enumerate(STARTS):
        for event, dt in SHAPE:
            if event in ("task", "complete"):
                arg = k
            elif event == "step":
                arg = (k << 16) | 1  # task k, step POSTS
            else:
                arg = 0
            lines.append("0 %d %s %d" % (start + dt, event, arg))
        if k < len(TAKE_AFTER):
            done = start + SHAPE[-1][1]
            lines.append("%d %d queues 0" % (READER, done + 500))
            lines.append("%d %d queues 1" % (READER, done + TAKE_AFTER[k]))
    return lines


def run(path, *args):
    r = subprocess.run([sys.executable, SCRIPT, path] + list(args), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("FAIL: dk_trace_summary.py %s exited %d: %s" % (" ".join(args), r.returncode, r.stderr))
    return r.stdout


def expect(out, text):
    if text not in out:
        sys.exit("FAIL: expected %r in:\n%s" % (text, out))


def main():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.txt")
        with open(path, "w") as f:
            f.write("\n".join(trace_lines()) + "\n")

        t0, t1 = TAKE_AFTER
        out = run(path)
        # task -> step POSTS: 1 us, three times.
        expect(out, "%-28s %-28s %8d %9s %9s %11s" % ("task", "step POSTS", 3, "1.00", "1.00", "3.00"))
        # data -> complete: 6 us, three times.
        expect(out, "%-28s %-28s %8d %9s %9s %11s" % ("data", "complete", 3, "6.00", "6.00", "18.00"))
        # Arrival to completion: 10 us each.
        expect(out, "task arrival to completion: 3, median 10.00 us, mean 10.00 us, min 10.00 us, max 10.00 us")
        gaps = [b - a for a, b in zip(STARTS, STARTS[1:])]
        expect(out, "between completions: 2, median %.2f us, mean %.2f us, min %.2f us, max %.2f us" %
               (sum(gaps) / 2e3, sum(gaps) / 2e3, min(gaps) / 1e3, max(gaps) / 1e3))

        # The reader's passes: an empty pass 0.5 us after each completion,
        # then the take 2.5 and 6.5 us after that empty pass.
        out = run(path, "--block", "reader")
        # By entries taken: the two passes that took one entry each ended
        # 2.5 and 6.5 us after the empty pass before them.
        expect(out, "%6d %8d %9s %9s %9s" % (1, 2, "%.2f" % ((t0 + t1) / 2e3 - 0.5),
                                           "%.2f" % ((t0 + t1) / 2e3 - 0.5), "%.2f" % ((t0 + t1) / 2e3 - 0.5)))
        expect(out, "%-28s %-28s %8d %9s %9s %11s" % ("queues (took none)", "queues (took some)", 2,
                                                      "%.2f" % ((t0 + t1) / 2e3 - 0.5), "%.2f" % ((t0 + t1) / 2e3 - 0.5),
                                                      "%.2f" % ((t0 + t1) / 1e3 - 1.0)))
        r = subprocess.run([sys.executable, SCRIPT, path, "--block", "first"], capture_output=True, text=True)
        if r.returncode == 0 or "'reader'" not in r.stderr:
            sys.exit("FAIL: --block first was taken: %r" % r.stderr)

        out = run(path, "--turnaround")
        t = TAKE_AFTER
        expect(out, "completion to the next entry taken: 2, median %.2f us, mean %.2f us, min %.2f us, "
               "max %.2f us" % (sum(t) / 2e3, sum(t) / 2e3, min(t) / 1e3, max(t) / 1e3))

        # Stalls: the gaps between any two events, of every block, over
        # 6.5 us. By construction: 13 -> 20 us (7 us, block 0 between its
        # first two collectives, the reader done) and 37 -> 45 us (8 us).
        times = sorted(int(l.split()[1]) for l in trace_lines() if not l.startswith("#"))
        gaps = [(a, b - a) for a, b in zip(times, times[1:]) if b - a > 6500]
        assert gaps == [(13000, 7000), (37000, 8000)], gaps
        span = times[-1] - times[0]
        out = run(path, "--stalls", "6.5")
        expect(out, "stalls over 6.5 us: 2, total 15.00 us of %.2f us traced (%.1f %%)" %
               (span / 1e3, 100.0 * 15000 / span))
        expect(out, "  at 13.00 us: 7.00 us\n  at 37.00 us: 8.00 us\n")
        expect(run(path, "--stalls", "8"), "stalls over 8.0 us: 0, total 0.00 us")

        # The reader's block is read from the header, not assumed.
        with open(path) as f:
            body = f.read().replace("block %d: the queue reader" % READER, "block 3: the queue reader")
        with open(path, "w") as f:
            f.write(body)
        expect(run(path, "--turnaround"), "completion to the next entry taken: none")

        # The reader's take of an entry, phase by phase (enum dk_take_phase
        # by number: 0 header, 1 scanned, 2 copied, 3 armed, 6 done; 99 is
        # none and shows as its number).
        with open(path, "w") as f:
            f.write("# block ns event arg (GPU 0; block 16: the queue reader)\n"
                    "16 0 queues 0\n16 1000 take 0\n16 2500 take 1\n16 4500 take 2\n16 4700 take 3\n"
                    "16 9000 take 6\n16 9300 take 99\n16 9500 queues 1\n")
        out = run(path, "--block", "reader")
        for a, b, us in (("header", "scanned", "1.50"), ("scanned", "copied", "2.00"), ("copied", "armed", "0.20"),
                         ("armed", "done", "4.30"), ("done", "99", "0.30")):
            expect(out, "%-28s %-28s %8d %9s %9s %11s" % ("take " + a, "take " + b, 1, us, us, us))
        expect(out, "%-28s %-28s %8d %9s %9s %11s" % ("take 99", "queues (took some)", 1, "0.20", "0.20", "0.20"))
        # One pass that took one entry, 9.5 us after the empty one.
        expect(out, "%6d %8d %9s %9s %9s" % (1, 1, "9.50", "9.50", "9.50"))
        # --blocks: block 0 runs two tasks one after the other, block 1
        # interleaves two, block 2 runs a channel of each of two tasks
        # that complete elsewhere (it leaves each at CHDONE, step 5); the
        # reader's events are left out.
        serial = [(0, "task", 0), (1000, "step", 0 << 16 | 1), (10000, "complete", 0),
                  (12000, "task", 1), (13000, "step", 1 << 16 | 1), (22000, "complete", 0)]
        interleaved = [(0, "task", 5), (1000, "task", 6), (2000, "step", 5 << 16 | 1), (3000, "step", 6 << 16 | 1),
                       (4000, "step", 5 << 16 | 4), (5000, "complete", 0), (6000, "step", 6 << 16 | 4),
                       (8000, "complete", 0)]
        others = [(0, "task", 7), (1000, "task", 8), (2000, "step", 7 << 16 | 4), (3000, "step", 7 << 16 | 5),
                  (5000, "step", 8 << 16 | 4), (6000, "step", 8 << 16 | 5), (10000, "loop", 0)]
        with open(path, "w") as f:
            f.write("# block ns event arg (GPU 0; block 16: the queue reader)\n16 0 queues 1\n16 500 task 9\n")
            for block, evs in ((0, serial), (1, interleaved), (2, others)):
                for t, e, a in evs:
                    f.write("%d %d %s %d\n" % (block, t, e, a))
        out = run(path, "--blocks")
        # Tasks in flight, integrated by hand: block 0 one task for 10 us
        # and again for 10 us of its 22 us; block 1 one for 1 us, two for
        # 4 us, one for 3 us of its 8 us.
        in_flight0 = (10000 * 1 + 2000 * 0 + 10000 * 1) / 22000.0
        in_flight1 = (1000 * 1 + 4000 * 2 + 3000 * 1) / 8000.0
        expect(out, "%6d %7d %10d %13s %13s %10.2f %6d" % (0, 2, 2, "12.00", "10.00", in_flight0, 1))
        expect(out, "%6d %7d %10d %13s %13s %10.2f %6d" % (1, 2, 2, "3.00", "6.00", in_flight1, 2))
        # Block 2: one task for 1 us, two for 2 us, one for 3 us, none for
        # the last 4 us of its 10 (completions: none, so "-").
        in_flight2 = (1000 * 1 + 2000 * 2 + 3000 * 1) / 10000.0
        expect(out, "%6d %7d %10d %13s %13s %10.2f %6d" % (2, 2, 0, "-", "-", in_flight2, 2))
        # All blocks: completions 12 and 3 us apart (median 7.5), arrivals to
        # completions 10, 10, 5 and 7 us (median 8.5).
        expect(out, "%6s %7d %10d %13s %13s" % ("all", 6, 4, "7.50", "8.50"))
        if "\n    16 " in out:
            sys.exit("FAIL: --blocks listed the queue reader:\n%s" % out)

        # --data: block 0 moves 1 MiB in 2 us then 3 MiB in 6 us, busy 11
        # us (10.5 until its idle turn, 39.5 idle, then 0.5 with a task
        # queued), block 1 one piece of 2 MiB in 4 us (busy 5 us); the
        # reader's "data" is left out.
        mib = 1 << 20
        with open(path, "w") as f:
            f.write("# block ns event arg (GPU 0; block 16: the queue reader)\n16 0 data %d\n16 9000 queues 1\n"
                    % (64 * mib))
            for block, evs in ((0, [(0, "step", 2), (1000, "data", mib), (3000, "step", 2),
                                    (4000, "data", 3 * mib), (10000, "complete", 0), (10500, "loop", 0),
                                    (50000, "loop", 1), (50500, "step", 2)]),
                               (1, [(500, "data", 2 * mib), (4500, "step", 5), (5500, "complete", 0)])):
                for t, e, a in evs:
                    f.write("%d %d %s %d\n" % (block, t, e, a))
        out = run(path, "--data")
        row = "%6s %7d %10.1f %12s %7.1f %10s %10s"
        expect(out, row % ("0", 2, 4.0, "8.00", 100.0 * 8000 / 11000, "%.1f" % (4 * mib / 8000.0), "4.00"))
        expect(out, row % ("1", 1, 2.0, "4.00", 80.0, "%.1f" % (2 * mib / 4000.0), "4.00"))
        expect(out, row % ("all", 3, 6.0, "12.00", 75.0, "%.1f" % (6 * mib / 12000.0), "4.00"))
        if "\n    16 " in out:
            sys.exit("FAIL: --data listed the queue reader:\n%s" % out)

        # --launches: two launches of the resident grid 100 us apart, each
        # with its milestones at fixed offsets (us) from block 0's "start
        # begun"; the second's reader takes on its second pass only, and a
        # bulk block's start (block 3) is no launch of the resident grid.
        # The second launch's reader begins 0.5 us before its block 0.
        offsets = lambda k: [(0, "start", 1, 1.5), (0, "start", 2, 2.0), (16, "start", 0, -0.5 if k else 1.0),
                             (16, "start", 1, 2.5), (16, "start", 2, 3.0),
                             (16, "queues", 0, 4.0), (16, "queues", 1, 9.0), (0, "task", 0, 11.0),
                             (0, "complete", 0, 20.0), (0, "loop", 0, 45.0)]
        with open(path, "w") as f:
            f.write("# block ns event arg (GPU 0; block 16: the queue reader)\n")
            for k, base in enumerate((0, 100000)):
                f.write("0 %d start 0\n" % base)
                for block, e, a, at in offsets(k):
                    if k == 0 and e == "queues" and a == 0:
                        a = 1  # the first launch takes on its first pass
                    f.write("%d %d %s %d\n" % (block, base + int(at * 1000), e, a))
            f.write("3 150000 start 0\n")
        out = run(path, "--launches")
        row = "%-34s %8d %10s %10s %10s"
        expect(out, "launches: 2 ")
        for mark, lo, hi in (("block 0 loaded", 1.5, 1.5), ("block 0 ready", 2.0, 2.0), ("reader begun", -0.5, 1.0), ("reader ready", 3.0, 3.0),
                             ("first pass", 4.0, 4.0), ("first take", 4.0, 9.0), ("first task", 11.0, 11.0),
                             ("first completion", 20.0, 20.0)):
            expect(out, row % (mark, 2, "%.2f" % ((lo + hi) / 2), "%.2f" % lo, "%.2f" % hi))
        # The last launch ends at the bulk block's start (150 us), the first
        # at its loop (45 us); 55 us absent between them.
        expect(out, row % ("last event", 2, "47.50", "45.00", "50.00"))
        expect(out, row % ("absent (last event -> next launch)", 1, "55.00", "55.00", "55.00"))
        # --bursts: two bursts 100 us apart, each an empty pass, then passes
        # that take 2, 1 and 5 entries ending 5, 8 and 20 us in (5, 3 and 12
        # us each), an empty one, and completions at 15 and 30 us (block 0)
        # and 35 us (block 1); a launch in the first only; and a third, one
        # pass at 300 us, with no completion.
        with open(path, "w") as f:
            f.write("# block ns event arg (GPU 0; block 16: the queue reader)\n")
            for k, base in enumerate((0, 100000)):
                for block, at, e, a in ((16, 0, "queues", 0), (16, 5, "queues", 2), (16, 8, "queues", 1),
                                        (0, 15, "complete", 0), (16, 20, "queues", 5), (16, 23, "queues", 0),
                                        (0, 30, "complete", 0), (1, 35, "complete", 0)):
                    f.write("%d %d %s %d\n" % (block, base + at * 1000, e, a))
                if k == 0:
                    f.write("0 1000 start 0\n")
            f.write("16 290000 queues 0\n16 292000 queues 1\n")
        out = run(path, "--bursts", "20")
        expect(out, "bursts: 2 with a completion (cut where the reader took nothing for over 20.0 us; 1 without)")
        row = "%-40s %10s %10s %10s"
        for name, med, lo, hi in (("entries taken", "8", "8", "8"), ("completions", "3", "3", "3"),
                                  ("span us", "35.00", "35.00", "35.00"), ("passes that took", "3", "3", "3"),
                                  ("  their time us", "20.00", "20.00", "20.00"),
                                  ("  their share of the span %", "57.1", "57.1", "57.1"),
                                  ("passes of 1-3 entries", "2", "2", "2"), ("  their time us", "8.00", "8.00", "8.00"),
                                  ("tail us (last take -> last completion)", "15.00", "15.00", "15.00"),
                                  ("launches", "0.5", "0", "1")):
            expect(out, row % (name, med, lo, hi))
        # The empty pass between the bursts' takes is 80 us long: at gaps
        # over 90 us the first two bursts are one (from 0 to 135 us, the
        # 80 us not the reader's), the third apart.
        out = run(path, "--bursts", "90")
        expect(out, "bursts: 1 with a completion (cut where the reader took nothing for over 90.0 us; 1 without)")
        for name, med in (("entries taken", "16"), ("span us", "135.00"), ("  their time us", "40.00"),
                          ("tail us (last take -> last completion)", "15.00")):
            expect(out, row % (name, med, med, med))
    print("OK: dk_trace_summary.py's tables match the constructed trace")


if __name__ == "__main__":
    main()
