#!/usr/bin/env bash
# dfccl against NCCL on the same GPUs, side by side: all-reduce from 8 B to
# 1 GiB, all-gather, reduce-scatter and broadcast from 64 MiB to 1 GiB, and
# batches of 150 all-reduces, measured by dfccl-perf in one run on one
# machine, so that every figure is a ratio taken under the same conditions.
#
# Usage: vs_nccl.sh BINDIR [OUTDIR]
#   BINDIR  the folder of dfccld, dfcclctl and dfccl-perf (a build with a
#           CUDA toolkit)
#   OUTDIR  where the JSON and log of every run and the tables go (default:
#           a new folder under /tmp, named at the end)
#
# It needs 2 or more NVIDIA GPUs and NCCL (libnccl.so.2 on LD_LIBRARY_PATH,
# or the file named by DFCCL_NCCL_LIB); without either it says SKIPPED and
# exits 77. It starts its own dfccld (CUDA engine, every GPU) on a private
# socket, as the GPU tests do (tests/gpu/gpu_lib.sh). The two ranks run on
# GPUs 0 and 1, or the two that VS_NCCL_GPUS names ("2,3");
# VS_NCCL_ITERS and VS_NCCL_WARMUP change -n and -w (default 20 and 20:
# 20 calls after 5 warm-up ones read 62-69 us for a small stream-ordered
# all-reduce where 100 after 20 read 38-41, RESULTS.md seventeenth run);
# VS_NCCL_DAEMON_ARGS gives dfccld settings (e.g. "--channels 32"), for
# its every start here, and the header names them. VS_NCCL_PARTS names the
# parts to run, of "sweep", "bw", "batch" and "trace" below, comma-separated
# (default all: the whole takes 6-10 minutes on 2 H200), and VS_NCCL_SWEEP
# replaces the sweep's size options (default "-b 8 -e 1G -f 2"),
# VS_NCCL_BW_COLLS the bandwidth part's collectives (default "allgather
# reducescatter broadcast") and VS_NCCL_BATCH_SIZES the batch part's sizes
# (default "4K 64K 1M"; any of these three).
# VS_NCCL_MPS=1 runs both libraries' runs under a private MPS daemon (root
# and nvidia-cuda-mps-control, else SKIPPED): without MPS a client's
# context with stream work queued takes time slices from the daemon
# kernel's on the same GPU (the traces' stalls show it), as a trainer's
# would in production, where MPS is the deployment for the stream form.
#
# What runs (2 ranks, float sum, every result checked):
#   - the sweep, -b 8 -e 1G -f 2: dfccl (--mode stream --mem device, and
#     --mode callback), NCCL (its default buffers, cudaMalloc) and NCCL
#     --nccl-symmetric;
#   - all-gather, reduce-scatter and broadcast, -b 64M -e 1G -f 4 (the
#     sizes of the bandwidth targets): dfccl stream-ordered, NCCL and NCCL
#     symmetric;
#   - batches of 150 all-reduces of 4 KiB, 64 KiB and 1 MiB before each wait,
#     grouped (--group 1) and not (--group 0): dfccl stream-ordered, dfccl
#     callback (both on cudaMalloc buffers), NCCL and NCCL symmetric.
# The tables give the out-of-place time per collective (rank 0's) and
# dfccl's time over the better of NCCL's two modes: below 1, dfccl is
# faster. For the batches the reference is NCCL's better grouped time,
# which the targets compare against. A run that fails shows as "failed" in
# the tables, its log stays in OUTDIR, and the script exits 1 at the end.
# After the tables, the daemon kernel's counters over each dfccl run, per
# collective completed on a GPU: preemptions, polls spent waiting on peers
# (spins), context switches, launches and voluntary quits of the kernel.
# Last, three traced runs of 4 KiB (callback, stream-ordered, and callback
# batches of 150 in one group, whose pace is the queue reader's), each on a
# daemon of its own with DFCCL_DK_TRACE, summarised per GPU by
# dk_trace_summary.py (block 0, --turnaround, the queue reader's phases
# and passes, and every block's pace) after the tables, the
# daemon's queue alone on each GPU (dfccl-perf --queue-only, both forms:
# the floor under every collective), and dk_prims's table of the kernel's
# memory operations (taken first).
set -u

# shellcheck source=perf_lib.sh
. "$(dirname "$0")/perf_lib.sh" "$@"
# NVLink multicast stays off on shared GPU machines (gpu_lib.sh says so too).
export NCCL_NVLS_ENABLE=0

gpu_need_gpu vs_nccl.sh
gpu_need_bins dfccld dfcclctl dfccl-perf
gpu_setup vs-nccl
if [ "$ngpu" -lt 2 ]; then
	echo "SKIPPED: vs_nccl.sh compares on 2 GPUs, and this machine has $ngpu"
	exit 77
fi
gpus=${VS_NCCL_GPUS:-0,1}
parts_from VS_NCCL_PARTS sweep,bw,batch,trace sweep bw batch trace
iters=${VS_NCCL_ITERS:-20}
warmup=${VS_NCCL_WARMUP:-20}
[ -n "$outdir" ] || outdir=$(mktemp -d /tmp/vs-nccl-XXXXXX)
mkdir -p "$outdir" || exit 1

# Whether NCCL loads and runs: one small all-reduce (no daemon needed).
if ! timeout -k 10 300 "$bin/dfccl-perf" allreduce --backend nccl --devices "$gpus" -b 8 -e 8 -n 1 -w 0 \
	>"$outdir/probe.log" 2>&1; then
	if grep -q "cannot load NCCL\|is not a usable NCCL" "$outdir/probe.log"; then
		echo "SKIPPED: no NCCL: $(grep -m1 "NCCL" "$outdir/probe.log")"
		exit 77
	fi
	fail "NCCL does not run on GPUs $gpus: $(cat "$outdir/probe.log")"
fi

prims
mps=
if [ -n "${VS_NCCL_MPS:-}" ]; then
	if ! mps_usable; then
		echo "SKIPPED: VS_NCCL_MPS asks for MPS, which needs root and nvidia-cuda-mps-control"
		exit 77
	fi
	mps_start
	mps=", under MPS"
fi
# The daemon's settings (VS_NCCL_DAEMON_ARGS), for perf_lib's traced runs too.
daemon_args=()
[ -z "${VS_NCCL_DAEMON_ARGS:-}" ] || read -ra daemon_args <<<"$VS_NCCL_DAEMON_ARGS"
start_daemon "${daemon_args[@]+"${daemon_args[@]}"}"
# shellcheck disable=SC2086 # one argument per GPU
queue_floor ${gpus//,/ }

failed=0
# perf_of COLL NAME ARGS...: dfccl-perf COLL on the two ranks' GPUs, one
# JSON object per size into $outdir/NAME.json, its messages into NAME.log,
# and the daemon's counters before and after (NAME.stats0, NAME.stats1);
# perf NAME ARGS...: the same for allreduce.
perf_of() {
	local coll=$1 name=$2 rc=0
	shift 2
	echo "== $name: dfccl-perf $coll $*"
	ctl --json stats >"$outdir/$name.stats0" 2>/dev/null || rm -f "$outdir/$name.stats0"
	timeout -k 10 1200 "$bin/dfccl-perf" "$coll" --socket "$sock" --nranks 2 --devices "$gpus" \
		-n "$iters" -w "$warmup" --json "$@" >"$outdir/$name.json" 2>"$outdir/$name.log" || rc=$?
	ctl --json stats >"$outdir/$name.stats1" 2>/dev/null || rm -f "$outdir/$name.stats1"
	if [ "$rc" != 0 ]; then
		echo "   failed (exit $rc): $(tail -n 3 "$outdir/$name.log")"
		failed=$((failed + 1))
	fi
	return "$rc"
}
perf() { perf_of allreduce "$@"; }

sweep=${VS_NCCL_SWEEP:-"-b 8 -e 1G -f 2"}
# shellcheck disable=SC2086 # $sweep is several options
part_on sweep && {
	perf sweep_dfccl --backend dfccl --mode stream --mem device $sweep
	perf sweep_dfccl_cb --backend dfccl --mode callback --mem device $sweep
	perf sweep_nccl --backend nccl $sweep
	perf sweep_nccl_sym --backend nccl --nccl-symmetric $sweep
}
bw_colls=${VS_NCCL_BW_COLLS:-allgather reducescatter broadcast}
batch_sizes=${VS_NCCL_BATCH_SIZES:-4K 64K 1M}
for x in $bw_colls; do
	case $x in allgather | reducescatter | broadcast) ;; *) fail "VS_NCCL_BW_COLLS: unknown collective $x" ;; esac
done
for x in $batch_sizes; do
	case $x in 4K | 64K | 1M) ;; *) fail "VS_NCCL_BATCH_SIZES: $x is not one of 4K 64K 1M" ;; esac
done
# shellcheck disable=SC2086 # lists of words
part_on bw && for coll in $bw_colls; do
	b="-b 64M -e 1G -f 4"
	# shellcheck disable=SC2086 # $b is several options
	{
		perf_of "$coll" "bw_${coll}_dfccl" --backend dfccl --mode stream --mem device $b
		perf_of "$coll" "bw_${coll}_nccl" --backend nccl $b
		perf_of "$coll" "bw_${coll}_nccl_sym" --backend nccl --nccl-symmetric $b
	}
done
# shellcheck disable=SC2086 # lists of words
part_on batch && for size in $batch_sizes; do
	for group in 1 0; do
		b="-b $size -e $size --batch 150 --group $group"
		# shellcheck disable=SC2086 # $b is several options
		{
			perf "batch_${size}_g${group}_dfccl_stream" --backend dfccl --mode stream --mem device $b
			perf "batch_${size}_g${group}_dfccl_callback" --backend dfccl --mode callback --mem device $b
			perf "batch_${size}_g${group}_nccl" --backend nccl $b
			perf "batch_${size}_g${group}_nccl_sym" --backend nccl --nccl-symmetric $b
		}
	done
done
stop_daemon

# Traced runs (perf_lib.sh), summarised per GPU after the tables, each
# apart: a daemon that fails ends only its run.
if part_on trace; then
	traced_apart traced_callback --backend dfccl --mode callback --mem device || failed=$((failed + 1))
	traced_apart traced_stream --backend dfccl --mode stream --mem device || failed=$((failed + 1))
	traced_apart traced_batch --backend dfccl --mode callback --mem device --batch 150 --group 1 ||
		failed=$((failed + 1))
fi
[ -z "$mps" ] || mps_stop

{
	echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), GPUs $gpus of $ngpu:" \
		"$(nvidia-smi --query-gpu=name --format=csv,noheader | sort -u | paste -sd/), -n $iters -w $warmup," \
		"NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE," \
		"CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32, as libdfccl sets it for both backends}$mps" \
		"${VS_NCCL_DAEMON_ARGS:+, dfccld $VS_NCCL_DAEMON_ARGS}${VS_NCCL_PARTS:+, parts $parts}${VS_NCCL_SWEEP:+, sweep $VS_NCCL_SWEEP}" \
		"${VS_NCCL_BW_COLLS:+, bandwidth: $bw_colls}${VS_NCCL_BATCH_SIZES:+, batches: $batch_sizes}"
	PYTHONPATH=$perf_lib_dir python3 - "$outdir" "$parts" <<'EOF'
import json
import os
import sys

import perf_json

out, parts = sys.argv[1], sys.argv[2].split(",")


def load(name):
    """The run's JSON objects by size; {} when it failed to start."""
    return perf_json.runs(out, name) or {}


def time_of(rows, size):
    """Out-of-place time per collective, or None (not run, or wrong)."""
    d = rows.get(size)
    m = d and d.get("out_of_place")
    if not m or m.get("wrong"):
        return None
    return m["time_us"]


def fmt(t):
    return "%12.2f" % t if t is not None else "%12s" % "failed"


def ratio(a, b):
    return "%12.3f" % (a / b) if a is not None and b else "%12s" % "-"


def best(*ts):
    ts = [t for t in ts if t is not None]
    return min(ts) if ts else None


def library(*runs):
    for rows in runs:
        for d in rows.values():
            return d["library"]
    return "?"


def sweep_table():
    dfccl, cb = load("sweep_dfccl"), load("sweep_dfccl_cb")
    nccl, sym = load("sweep_nccl"), load("sweep_nccl_sym")
    print("# %s against %s, all-reduce, 2 ranks, float sum, out of place"
          % (library(dfccl, cb), library(nccl, sym)))
    print("# time per all-reduce (us); dfccl: stream-ordered, dfccl-cb: callback form; x/best: over the")
    print("# better of NCCL's two modes (stream-ordered)")
    print("%12s %12s %12s %12s %12s %12s %12s %12s" % ("size(B)", "dfccl", "dfccl-cb", "nccl", "nccl-sym",
                                                       "best-nccl", "dfccl/best", "cb/best"))
    for size in sorted(set(dfccl) | set(cb) | set(nccl) | set(sym)):
        t, c, n, s = time_of(dfccl, size), time_of(cb, size), time_of(nccl, size), time_of(sym, size)
        b = best(n, s)
        print("%12d %s %s %s %s %s %s %s" % (size, fmt(t), fmt(c), fmt(n), fmt(s), fmt(b), ratio(t, b), ratio(c, b)))


def bw_table():
    print("# all-gather, reduce-scatter, broadcast (dfccl stream-ordered): time per collective (us) and")
    print("# bus bandwidth (GB/s); x/best: dfccl's time over the better of NCCL's two modes")
    print("%14s %12s %12s %12s %12s %12s %12s" % ("collective", "size(B)", "dfccl", "nccl", "nccl-sym", "dfccl GB/s",
                                                  "dfccl/best"))
    for coll in ("allgather", "reducescatter", "broadcast"):
        d, n, s = (load("bw_%s_%s" % (coll, k)) for k in ("dfccl", "nccl", "nccl_sym"))
        for size in sorted(set(d) | set(n) | set(s)):
            t = time_of(d, size)
            m = d.get(size, {}).get("out_of_place") or {}
            bw = "%12.1f" % m["busbw_gbs"] if t is not None and "busbw_gbs" in m else "%12s" % "-"
            b = best(time_of(n, size), time_of(s, size))
            print("%14s %12d %s %s %s %s %s" % (coll, size, fmt(t), fmt(time_of(n, size)), fmt(time_of(s, size)), bw,
                                                ratio(t, b)))


def batch_table():
    print("# 150 all-reduces before each wait: time per all-reduce (us); x/best-grouped: over the better of")
    print("# NCCL's two modes inside one ncclGroupStart/End")
    print("%8s %6s %12s %12s %12s %12s %12s %12s" % ("size", "group", "dfccl-strm", "dfccl-cb", "nccl", "nccl-sym",
                                                    "strm/best-g", "cb/best-g"))
    for size in ("4K", "64K", "1M"):
        runs = {g: {k: load("batch_%s_g%s_%s" % (size, g, k))
                    for k in ("dfccl_stream", "dfccl_callback", "nccl", "nccl_sym")} for g in (1, 0)}
        if not any(r for g in runs.values() for r in g.values()):
            continue  # not asked for (VS_NCCL_BATCH_SIZES)
        nbytes = {"4K": 4096, "64K": 65536, "1M": 1048576}[size]
        ref = best(time_of(runs[1]["nccl"], nbytes), time_of(runs[1]["nccl_sym"], nbytes))
        for g in (1, 0):
            t = {k: time_of(r, nbytes) for k, r in runs[g].items()}
            print("%8s %6d %s %s %s %s %s %s" % (size, g, fmt(t["dfccl_stream"]), fmt(t["dfccl_callback"]),
                                                 fmt(t["nccl"]), fmt(t["nccl_sym"]), ratio(t["dfccl_stream"], ref),
                                                 ratio(t["dfccl_callback"], ref)))


# The parts that ran, each table after a blank line but the first.
tables = [f for part, f in (("sweep", sweep_table), ("bw", bw_table), ("batch", batch_table)) if part in parts]
for i, f in enumerate(tables):
    if i:
        print()
    f()

print()
print("# the daemon kernel's counters over each dfccl run (both GPUs), per collective completed")
keys = ("preemptions", "spins", "context_switches", "kernel_launches", "kernel_quits", "early_taken",
        "early_given_back")


def counters(name):
    """Counter deltas over the run, summed over the devices; None without both snapshots."""
    snaps = []
    for k in ("stats0", "stats1"):
        try:
            with open(os.path.join(out, "%s.%s" % (name, k))) as f:
                snaps.append(json.load(f))
        except (OSError, ValueError):
            return None
    tot = lambda d, key: sum(int(x.get(key, 0)) for x in d.get("devices", []))
    return {key: tot(snaps[1], key) - tot(snaps[0], key) for key in ("completed",) + keys}


print("%-32s %10s %12s %12s %12s %12s %12s %12s %12s" % ("run", "completed", "preempt/c", "spins/c", "switch/c",
                                                         "launch/c", "quit/c", "early/c", "back/c"))
names = sorted(f[:-len(".stats1")] for f in os.listdir(out) if f.endswith(".stats1"))
for name in names:
    if "dfccl" not in name:
        continue
    d = counters(name)
    if not d or not d["completed"]:
        continue
    c = d["completed"]
    print("%-32s %10d %s" % (name, c, " ".join("%12.2f" % (d[k] / c) for k in keys)))
EOF
	traced_print
	queue_print
	prims_print
} | tee "$outdir/table.txt"

echo "The runs' JSON and logs, and the tables (table.txt), are in $outdir"
if [ "$failed" != 0 ]; then
	echo "FAIL: $failed runs failed (see their logs in $outdir)"
	exit 1
fi
echo "OK: every run completed with correct results"
