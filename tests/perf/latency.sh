#!/usr/bin/env bash
# Small-collective latency of every form of dfccl on one GPU, beside NCCL:
# the matrix RESULTS.md records for the daemon kernel, taken the same way
# each time, with the kernel's trace summarised.
#
# Usage: latency.sh BINDIR [OUTDIR]
#   BINDIR  the folder of dfccld, dfcclctl and dfccl-perf (a build with a
#           CUDA toolkit)
#   OUTDIR  where the JSON and log of every run, the trace and the tables go
#           (default: a new folder under /tmp, named at the end)
#
# It needs an NVIDIA GPU (else SKIPPED, exit 77); NCCL (libnccl.so.2 on
# LD_LIBRARY_PATH, or DFCCL_NCCL_LIB) is measured where it loads, and the
# MPS half where MPS is usable (root and nvidia-cuda-mps-control). dfccld
# (CUDA engine, every GPU) runs on a private socket, as in the GPU tests
# (tests/gpu/gpu_lib.sh; DFCCLD=PATH starts another build of it). All on
# GPU 0, float sum on device buffers, every result checked:
#   - without MPS: the callback form with 1 rank and with 2 ranks sharing
#     the GPU, -b 8 -e 16M -f 64;
#   - under MPS: the same, the stream form with 1 and 2 ranks, 150
#     all-reduces per wait (4 KiB, 64 KiB, 1 MiB; 1 rank; stream grouped and
#     ungrouped, callback), NCCL with 1 rank, and three traced runs of
#     4 KiB (2 ranks callback, 1 rank callback, 1 rank stream-ordered),
#     each summarised by dk_trace_summary.py (block 0, and --turnaround);
#   - first, dk_prims: what the kernel's memory operations cost on GPU 0;
#     and the daemon's queue alone on GPU 0 (dfccl-perf --queue-only).
# LATENCY_ITERS changes -n (default 100). The table gives out-of-place
# times per all-reduce in us; a run that failed shows as "failed", its log
# stays in OUTDIR, and the script exits 1 at the end.
set -u

# shellcheck source=perf_lib.sh
. "$(dirname "$0")/perf_lib.sh" "$@"

gpu_need_gpu latency.sh
gpu_need_bins dfccld dfcclctl dfccl-perf
gpu_setup latency
iters=${LATENCY_ITERS:-100}
[ -n "$outdir" ] || outdir=$(mktemp -d /tmp/latency-XXXXXX)
mkdir -p "$outdir" || exit 1
prims

failed=0
# perf NAME ARGS...: dfccl-perf allreduce, JSON into NAME.json.
perf() {
	local name=$1 rc=0
	shift
	echo "== $name: dfccl-perf allreduce $*"
	timeout -k 10 300 "$bin/dfccl-perf" allreduce --socket "$sock" -n "$iters" -w 5 --json "$@" \
		>"$outdir/$name.json" 2>"$outdir/$name.log" || rc=$?
	if [ "$rc" != 0 ]; then
		echo "   failed (exit $rc): $(tail -n 3 "$outdir/$name.log")"
		failed=$((failed + 1))
	fi
}

sweep="-b 8 -e 16M -f 64 --mem device"
batch="-b 4K -e 1M -f 16 --mem device --nranks 1 --devices 0 --batch 150"
# forms SUFFIX: the runs of one daemon.
# shellcheck disable=SC2086 # $sweep and $batch are several options
forms() {
	perf "callback_1_$1" --nranks 1 --devices 0 --mode callback $sweep
	perf "callback_2_$1" --nranks 2 --devices 0,0 --mode callback $sweep
	[ "$1" = mps ] || return 0
	perf "stream_1_$1" --nranks 1 --devices 0 --mode stream $sweep
	perf "stream_2_$1" --nranks 2 --devices 0,0 --mode stream $sweep
	perf "batch_stream_g1_$1" --mode stream --group 1 $batch
	perf "batch_stream_g0_$1" --mode stream --group 0 $batch
	perf "batch_callback_$1" --mode callback --group 0 $batch
}

# shellcheck disable=SC2119 # the daemon with its defaults: every GPU
start_daemon
queue_floor 0
forms nomps
stop_daemon
mps=0
if mps_usable; then
	mps=1
	mps_start
	# shellcheck disable=SC2119 # the daemon with its defaults
	start_daemon
	forms mps
	if "$bin/dfccl-perf" allreduce --backend nccl --nranks 1 --devices 0 -b 8 -e 8 -n 1 -w 0 \
		>"$outdir/nccl_probe.log" 2>&1; then
		echo "== nccl_1_mps: dfccl-perf allreduce --backend nccl --nranks 1 $sweep"
		# shellcheck disable=SC2086 # $sweep is several options
		timeout -k 10 300 "$bin/dfccl-perf" allreduce --backend nccl --nranks 1 --devices 0 -n "$iters" -w 5 \
			--json $sweep >"$outdir/nccl_1_mps.json" 2>"$outdir/nccl_1_mps.log" ||
			{ echo "   failed: $(tail -n 3 "$outdir/nccl_1_mps.log")"; failed=$((failed + 1)); }
	else
		echo "== NCCL not measured: $(grep -m1 -i "nccl" "$outdir/nccl_probe.log")"
	fi
	stop_daemon
	traced traced_callback_2 --nranks 2 --devices 0,0 --mode callback --mem device
	traced traced_callback_1 --nranks 1 --devices 0 --mode callback --mem device
	traced traced_stream_1 --nranks 1 --devices 0 --mode stream --mem device
	mps_stop
else
	echo "== MPS is not usable here (root and nvidia-cuda-mps-control are needed): the MPS half is left out"
fi

{
	echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), GPU 0 of $ngpu:" \
		"$(nvidia-smi --query-gpu=name --format=csv,noheader | sort -u | paste -sd/), -n $iters -w 5," \
		"out of place, us per all-reduce"
	PYTHONPATH=$perf_lib_dir python3 - "$outdir" "$mps" <<'EOF'
import os
import sys

import perf_json

out, mps = sys.argv[1], sys.argv[2] == "1"


def load(name):
    """The run's out-of-place times by size; None when it did not run."""
    return perf_json.times(out, name)


def cell(rows, size):
    """A time, "-" where the size was not measured, "failed" where it was wrong."""
    if rows is None or size not in rows:
        return "-"
    t = rows[size]
    return "failed" if t is None else "%.1f" % t


def table(title, names, sizes):
    runs = [(n, load(n)) for n in names]
    runs = [(n, r) for n, r in runs if r is not None]
    if not runs:
        return
    print("\n%s\n" % title)
    print("| bytes | " + " | ".join(n for n, _ in runs) + " |")
    print("|---:|" + "---:|" * len(runs))
    for s in sizes:
        print("| %d | " % s + " | ".join(cell(r, s) for _, r in runs) + " |")


sweep = [8, 512, 32768, 2097152]
table("Single all-reduces", ["callback_1_nomps", "callback_2_nomps", "callback_1_mps", "callback_2_mps",
                             "stream_1_mps", "stream_2_mps", "nccl_1_mps"], sweep)
table("150 all-reduces per wait, 1 rank, under MPS (per all-reduce)",
      ["batch_stream_g1_mps", "batch_stream_g0_mps", "batch_callback_mps"], [4096, 65536, 1048576])
for name, what in (("traced_callback_2", "2 ranks, callback"), ("traced_callback_1", "1 rank, callback"),
                   ("traced_stream_1", "1 rank, stream-ordered")):
    summary = os.path.join(out, "trace_%s_gpu0_summary.txt" % name)
    if mps and os.path.exists(summary):
        print("\nThe daemon kernel's trace (%s, 4 KiB, block 0):\n" % what)
        with open(summary) as f:
            print(f.read().rstrip())
EOF
	queue_print
	prims_print
} | tee "$outdir/table.md"
echo "The runs' JSON and logs, the trace and the table (table.md) are in $outdir"
[ "$failed" = 0 ] || { echo "FAIL: $failed run(s) failed"; exit 1; }
