#!/usr/bin/env bash
# What a collective costs a trainer, dfccl against NCCL, and what a dfccl
# job costs another process on its GPU, measured by dfccl-perf in one run
# on one machine, under MPS.
#
# Usage: overlap.sh BINDIR [OUTDIR]
#   BINDIR  the folder of dfccld, dfcclctl and dfccl-perf (a build with a
#           CUDA toolkit)
#   OUTDIR  where the JSON and log of every run and the table go (default:
#           a new folder under /tmp, named at the end)
#
# It needs an NVIDIA GPU and MPS (root and nvidia-cuda-mps-control): dfccl's
# stream-ordered collectives run beside a trainer's kernels only under MPS
# (without it every switch between the two processes' contexts waits for a
# time slice). Without either it says SKIPPED and exits 77. It starts a
# private MPS control daemon and its own dfccld (CUDA engine, every GPU) on
# a private socket, as the GPU tests do (tests/gpu/gpu_lib.sh); everything
# after runs under that MPS, NCCL too, so both backends see the same GPU.
#
# What runs (all-reduce, float sum, every result checked):
#   - the overlap sweep, -b 8 -e 64M -f 2: dfccl-perf --overlap US, a compute
#     kernel of about US microseconds (OVERLAP_US, default 500) before every
#     all-reduce on the rank's stream, and the kernel alone in the same
#     loop; on dfccl (--mode stream --mem device) with 2 ranks on GPUs 0
#     and 1, or both on GPU 0 where there is one GPU, and on NCCL (where
#     it loads: libnccl.so.2 on LD_LIBRARY_PATH, or DFCCL_NCCL_LIB) with
#     2 ranks on GPUs 0 and 1, or 1 rank where there is one GPU (NCCL
#     takes no two ranks on one GPU);
#   - the bystander on GPU 0: dfccl-perf --compute-only US, the same kernel
#     in a process of its own, OVERLAP_BYSTANDER_ITERS times (default
#     2000), first alone (dfccld idle), then with the same rounds while a
#     dfccl job (dfccl-perf all-reduce of OVERLAP_JOB_SIZE, default 1M,
#     stream-ordered, or in OVERLAP_JOB_MODE's form, on the dfccl ranks'
#     GPUs) runs, sized from a short probe of the job to outlast it well;
#     then, with dfccld stopped, the same rounds beside the same job on
#     NCCL (where it loads, on the NCCL ranks' GPUs; stopped once the
#     bystander is done, its results unchecked), started one probe's
#     length (its start-up) before them: what a job costs a bystander
#     without the daemon.
# OVERLAP_ITERS and OVERLAP_WARMUP change the sweep's -n and -w (default 20
# and 5), OVERLAP_SIZES its sizes (default "-b 8 -e 64M -f 2");
# OVERLAP_DAEMON_ARGS gives dfccld settings (e.g. "--resident-blocks-mps
# 2"), which the table's header names; OVERLAP_TRACE=1 (any value but 0)
# adds a traced run of the loop at 4 KiB (dfccl only), summarised after
# the table. The table gives, per size, out of place, the kernel's time
# alone and with the all-reduce per iteration and the time the all-reduce
# added (their difference), for both backends, and dfccl's step minus
# NCCL's (step-diff); then the bystander's time alone, beside the job, and
# the slowdown in %, and its slowdown beside NCCL's job. The bystander
# alone must take US/2 to 2 US (its calibration); the dfccl job must be
# seen completing collectives on GPU 0 before
# the bystander starts and still run when it ends. A run that fails shows as "failed", its log
# stays in OUTDIR, and the script exits 1 at the end.
set -u

# shellcheck source=perf_lib.sh
. "$(dirname "$0")/perf_lib.sh" "$@"

gpu_need_gpu overlap.sh
if ! mps_usable; then
	echo "SKIPPED: overlap.sh measures under MPS, which needs root and nvidia-cuda-mps-control"
	exit 77
fi
gpu_need_bins dfccld dfcclctl dfccl-perf
gpu_setup overlap
us=${OVERLAP_US:-500}
iters=${OVERLAP_ITERS:-20}
warmup=${OVERLAP_WARMUP:-5}
by_iters=${OVERLAP_BYSTANDER_ITERS:-2000}
job_size=${OVERLAP_JOB_SIZE:-1M}
job_mode=${OVERLAP_JOB_MODE:-stream}
case $job_mode in
stream | callback) ;;
*) fail "OVERLAP_JOB_MODE: '$job_mode' is not stream or callback" ;;
esac
[ -n "$outdir" ] || outdir=$(mktemp -d /tmp/overlap-XXXXXX)
mkdir -p "$outdir" || exit 1
if [ "$ngpu" -ge 2 ]; then
	dfccl_gpus=0,1 nccl_gpus=0,1 nccl_ranks=2
else
	dfccl_gpus=0 nccl_gpus=0 nccl_ranks=1
fi

mps_start
# The daemon on every GPU, with OVERLAP_DAEMON_ARGS' settings.
daemon_args=()
[ -z "${OVERLAP_DAEMON_ARGS:-}" ] || read -ra daemon_args <<<"$OVERLAP_DAEMON_ARGS"
start_daemon "${daemon_args[@]+"${daemon_args[@]}"}"

# Whether NCCL loads and runs: one small all-reduce (no daemon needed).
nccl=1
if ! timeout -k 10 300 "$bin/dfccl-perf" allreduce --backend nccl --nranks "$nccl_ranks" --devices "$nccl_gpus" \
	-b 8 -e 8 -n 1 -w 0 >"$outdir/probe.log" 2>&1; then
	grep -q "cannot load NCCL\|is not a usable NCCL" "$outdir/probe.log" ||
		fail "NCCL does not run on GPUs $nccl_gpus: $(cat "$outdir/probe.log")"
	echo "NCCL: not measured: $(grep -m1 "NCCL" "$outdir/probe.log")"
	nccl=0
fi

failed=0
# perf NAME ARGS...: dfccl-perf with ARGS, its stdout into $outdir/NAME.json
# and its messages into NAME.log.
perf() {
	local name=$1 rc=0
	shift
	echo "== $name: dfccl-perf $*"
	timeout -k 10 1200 "$bin/dfccl-perf" "$@" --socket "$sock" --json >"$outdir/$name.json" \
		2>"$outdir/$name.log" || rc=$?
	if [ "$rc" != 0 ]; then
		echo "   failed (exit $rc): $(tail -n 3 "$outdir/$name.log")"
		failed=$((failed + 1))
	fi
	return "$rc"
}
# field NAME EXPR: the Python expression EXPR over d, the run's last JSON
# object.
field() {
	tail -n 1 "$outdir/$1.json" | json "$2"
}
# completed: the collectives device 0's worker has completed so far.
completed() {
	ctl --json stats | json "sum(int(x['completed']) for x in d['devices'] if int(x['device']) == 0)"
}

sweep="${OVERLAP_SIZES:--b 8 -e 64M -f 2} -n $iters -w $warmup --overlap $us"
# shellcheck disable=SC2086 # $sweep is several options
{
	perf overlap_dfccl allreduce --nranks 2 --devices "$dfccl_gpus" --mode stream --mem device $sweep
	[ "$nccl" = 1 ] && perf overlap_nccl allreduce --backend nccl --nranks "$nccl_ranks" --devices "$nccl_gpus" $sweep
}

# The bystander: alone, then beside a dfccl job with the same rounds.
bystander() {
	local job_us by_s job_n job_pid before during after rc=0
	perf bystander_alone --compute-only "$us" -n "$by_iters" -w 20 --devices 0 || return 1
	# Calibrated on the GPU as it is, the kernel alone takes about US.
	[ "$(field bystander_alone "$us / 2 <= d['time_us'] <= $us * 2")" = True ] ||
		fail "the compute kernel, calibrated to about $us us, took $(field bystander_alone "d['time_us']") us alone"
	perf job_probe allreduce --nranks 2 --devices "$dfccl_gpus" --mode "$job_mode" --mem device \
		-b "$job_size" -e "$job_size" -n 200 -w 5 -c 0 || return 1
	job_us=$(field job_probe "d['out_of_place']['time_us']")
	[ -n "$job_us" ] || fail "the probe of the dfccl job gave no time (see $outdir/job_probe.json)"
	by_s=$(python3 -c "print($(field bystander_alone "d['time_us']") * ($by_iters + 20) / 1e6)")
	# Three times the bystander's run and 10 s more, for the job's start.
	job_n=$(python3 -c "print(min(100000000, int(($by_s * 3 + 10) * 1e6 / $job_us) + 1))")
	echo "== job: dfccl-perf allreduce -b $job_size -e $job_size -n $job_n (about $(python3 -c \
		"print(round($job_n * $job_us / 1e6))") s) on GPUs $dfccl_gpus"
	before=$(completed)
	"$bin/dfccl-perf" allreduce --socket "$sock" --nranks 2 --devices "$dfccl_gpus" --mode "$job_mode" --mem device \
		-b "$job_size" -e "$job_size" -n "$job_n" -w 5 -c 1 --json >"$outdir/job.json" 2>"$outdir/job.log" &
	job_pid=$!
	bg_pids+=("$job_pid")
	# Served: its timed loop has started on device 0.
	for _ in $(seq 1 600); do
		[ "$(completed)" -ge $((before + 200)) ] && break
		kill -0 "$job_pid" 2>/dev/null || fail "the dfccl job ended at start: $(tail -n 3 "$outdir/job.log")"
		sleep 0.1
	done
	[ "$(completed)" -ge $((before + 200)) ] || fail "the dfccl job completed nothing on GPU 0 within 60 s"
	during=$(completed)
	perf bystander_busy --compute-only "$us" --compute-rounds "$(field bystander_alone "d['rounds']")" \
		-n "$by_iters" -w 20 --devices 0 || rc=1
	after=$(completed)
	kill -0 "$job_pid" 2>/dev/null ||
		fail "the dfccl job ended before the bystander did: raise its length (the probe said $job_us us)"
	echo "   the job completed $((after - during)) collectives on GPU 0 during the bystander's run"
	echo "$((after - during))" >"$outdir/job_during.txt"
	# The job has served its purpose: it may finish (its results are
	# checked), for as long as four times its probe's pace allows, and is
	# stopped after that, which the table's reader is told.
	local job_s
	job_s=$(python3 -c "print(int($job_n * $job_us / 1e6 * 4) + 30)")
	if ! timeout "$job_s" tail --pid="$job_pid" -f /dev/null; then
		echo "   the dfccl job was still running after $job_s s (four times its probe's pace): stopped," \
			"its results unchecked"
		kill -TERM "$job_pid" 2>/dev/null
		wait "$job_pid" 2>/dev/null
		return "$rc"
	fi
	wait "$job_pid" || { echo "   the dfccl job failed: $(tail -n 3 "$outdir/job.log")"; failed=$((failed + 1)); }
	return "$rc"
}
# The bystander beside the same job on NCCL, with the daemon stopped:
# NCCL's job shows no count, so the bystander starts once a probe's
# length (most of it NCCL's start-up) and 2 s have passed.
nccl_bystander() {
	local job_us job_n job_pid start wall by_s rc=0
	[ -f "$outdir/bystander_alone.json" ] || return 1
	start=$(date +%s.%N)
	perf nccl_job_probe allreduce --backend nccl --nranks "$nccl_ranks" --devices "$nccl_gpus" \
		-b "$job_size" -e "$job_size" -n 200 -w 5 -c 0 || return 1
	wall=$(python3 -c "print($(date +%s.%N) - $start)")
	job_us=$(field nccl_job_probe "d['out_of_place']['time_us']")
	by_s=$(python3 -c "print($(field bystander_alone "d['time_us']") * ($by_iters + 20) / 1e6)")
	job_n=$(python3 -c "print(min(100000000, int(($by_s * 3 + $wall + 10) * 1e6 / $job_us) + 1))")
	echo "== NCCL job: dfccl-perf allreduce --backend nccl -b $job_size -e $job_size -n $job_n on GPUs $nccl_gpus"
	"$bin/dfccl-perf" allreduce --backend nccl --nranks "$nccl_ranks" --devices "$nccl_gpus" \
		-b "$job_size" -e "$job_size" -n "$job_n" -w 5 -c 0 --json >"$outdir/nccl_job.json" 2>"$outdir/nccl_job.log" &
	job_pid=$!
	bg_pids+=("$job_pid")
	sleep "$(python3 -c "print($wall + 2)")"
	kill -0 "$job_pid" 2>/dev/null || fail "the NCCL job ended at start: $(tail -n 3 "$outdir/nccl_job.log")"
	perf bystander_nccl --compute-only "$us" --compute-rounds "$(field bystander_alone "d['rounds']")" \
		-n "$by_iters" -w 20 --devices 0 || rc=1
	kill -0 "$job_pid" 2>/dev/null ||
		fail "the NCCL job ended before the bystander did: raise its length (the probe said $job_us us)"
	kill -TERM "$job_pid" 2>/dev/null
	wait "$job_pid" 2>/dev/null
	return "$rc"
}
bystander
stop_daemon
[ "$nccl" = 1 ] && nccl_bystander
# OVERLAP_TRACE=1: the overlap loop once more at 4 KiB, dfccl only, on a
# traced daemon of its own (perf_lib.sh's traced), still under MPS: where
# the time a collective adds to a step goes. Its summaries follow the table.
if [ "${OVERLAP_TRACE:-0}" != 0 ]; then
	# On a fresh MPS server: the NCCL job, stopped mid-collective, can
	# leave the last one refusing new clients for a while ("CUDA-capable
	# device(s) is/are busy or unavailable").
	if [ "$nccl" = 1 ]; then
		mps_stop
		for _ in $(seq 50); do
			pgrep -f nvidia-cuda-mps-server >/dev/null || break
			sleep 0.2
		done
		mps_start
	fi
	traced_apart traced_overlap allreduce --nranks 2 --devices "$dfccl_gpus" --mode stream --mem device \
		-n "$iters" -w "$warmup" --overlap "$us" || failed=$((failed + 1))
fi
mps_stop

{
	echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), $ngpu GPU(s):" \
		"$(nvidia-smi --query-gpu=name --format=csv,noheader | sort -u | paste -sd/), under MPS, -n $iters" \
		"-w $warmup, NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE${OVERLAP_DAEMON_ARGS:+, dfccld $OVERLAP_DAEMON_ARGS}"
	python3 - "$outdir" "$dfccl_gpus" "$nccl_gpus" "$nccl_ranks" "$us" "$job_size" "$job_mode" <<'EOF'
import json
import os
import sys

out, dfccl_gpus, nccl_gpus, nccl_ranks, us, job_size, job_mode = sys.argv[1:]


def load(name):
    """The run's JSON objects (by size for a sweep); [] when it failed to start."""
    try:
        with open(os.path.join(out, name + ".json")) as f:
            return [json.loads(line) for line in f if line.startswith("{")]
    except (OSError, ValueError):
        return []


def by_size(rows):
    return {d["size"]: d for d in rows}


def form(rows, size):
    """Out-of-place figures of one size, or None (not run, or wrong)."""
    d = rows.get(size)
    m = d and d.get("out_of_place")
    if not m or m.get("wrong"):
        return None
    return m


def fmt(m, key, ran=True):
    """A figure; "failed" for a run that failed or was wrong, "-" for one not made."""
    if not ran:
        return "%11s" % "-"
    return "%11.2f" % m[key] if m else "%11s" % "failed"


dfccl, nccl = by_size(load("overlap_dfccl")), by_size(load("overlap_nccl"))
first = next(iter(dfccl.values()), None) or next(iter(nccl.values()), None)
print("# all-reduce, float sum, out of place; before every all-reduce, on the rank's stream, a compute kernel of"
      " about %s us" % us + (" (%d blocks, %d rounds)" % (first["compute_blocks"], first["compute_rounds"])
                             if first else ""))
print("# dfccl: 2 ranks on GPU(s) %s; NCCL: %s rank(s) on GPU(s) %s%s" % (dfccl_gpus, nccl_ranks, nccl_gpus,
      "" if nccl else " (not measured)"))
print("# per iteration (us): comp = the kernel alone, total = kernel and all-reduce; added = total - comp;")
print("# step-diff = dfccl-total - nccl-total, what a step costs more with dfccl. dfccl-comp is timed while")
print("# the daemon kernel, idle, may hold its SMs until it quits (for kernel-idle-mps-us after the sums")
print("# dfccl-perf's CPU makes between its phases), so dfccl-added leaves out part of what a resident kernel")
print("# costs the compute kernel; step-diff does not")
print("%12s %11s %11s %11s %11s %11s %11s %11s" % ("size(B)", "dfccl-comp", "dfccl-total", "dfccl-added",
                                                  "nccl-comp", "nccl-total", "nccl-added", "step-diff"))
for size in sorted(set(dfccl) | set(nccl)):
    t, n = form(dfccl, size), form(nccl, size)
    diff = "%11.2f" % (t["total_us"] - n["total_us"]) if t and n else "%11s" % "-"
    print("%12d %s %s %s %s %s %s %s" % (size, fmt(t, "compute_us"), fmt(t, "total_us"), fmt(t, "added_us"),
                                         fmt(n, "compute_us", bool(nccl)), fmt(n, "total_us", bool(nccl)),
                                         fmt(n, "added_us", bool(nccl)), diff))

print()
alone, busy, busy_nccl = load("bystander_alone"), load("bystander_busy"), load("bystander_nccl")
alone, busy, busy_nccl = alone and alone[-1], busy and busy[-1], busy_nccl and busy_nccl[-1]
try:
    during = int(open(os.path.join(out, "job_during.txt")).read())
except (OSError, ValueError):
    during = None
print("# bystander on GPU 0: --compute-only %s%s" % (us, ", %d rounds per launch, %d iterations" %
                                                    (alone["rounds"], alone["iters"]) if alone else ""))
for name, d in (("alone", alone), ("beside a dfccl job", busy)):
    ok = d and not d["wrong"]
    print("%-24s %s" % (name + ":", "%.2f us per iteration" % d["time_us"] if ok else "failed"))
print("%-24s all-reduce of %s (%s) on GPU(s) %s, %s collectives completed on GPU 0 during the run" %
      ("the job:", job_size, job_mode, dfccl_gpus, during if during is not None else "?"))
for name, d in (("slowdown:", busy), ("beside an NCCL job:", busy_nccl)):
    if alone and d and not alone["wrong"] and not d["wrong"]:
        print("%-24s %.1f %%%s" % (name, (d["time_us"] - alone["time_us"]) / alone["time_us"] * 100,
                                   " (%.2f us per iteration; the same job on NCCL, GPU(s) %s, no daemon)"
                                   % (d["time_us"], nccl_gpus) if d is busy_nccl else ""))
    elif d is busy or nccl:
        print("%-24s -" % name)
EOF
	traced_print
} | tee "$outdir/table.txt"

echo "The runs' JSON and logs, and the table (table.txt), are in $outdir"
if [ "$failed" != 0 ]; then
	echo "FAIL: $failed runs failed (see their logs in $outdir)"
	exit 1
fi
echo "OK: every run completed with correct results"
