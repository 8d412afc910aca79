#!/usr/bin/env bash
# Daemons side by side: the same small-collective measurement against
# several builds of dfccld, or one build with different settings, each
# started in turn on the same GPUs in one run, so that a change to the
# daemon kernel is judged by a ratio taken under the same conditions.
#
# Usage: compare_daemons.sh BINDIR [OUTDIR] -- VARIANT...
#   BINDIR   the folder of dfcclctl and dfccl-perf (and the default dfccld)
#   OUTDIR   where the JSON and log of every run and the table go (default:
#            a new folder under /tmp, named at the end)
#   VARIANT  NAME=DFCCLD[:ARGS]: a label, the dfccld to start ("-" for
#            BINDIR's) and settings for it, space-separated, e.g.
#            base=- mb2=/tmp/dfccld-mb2 ch8=-:"--channels 8"
# What runs, for every variant in the order given and then the first one
# again (the drift of the machine over the run shows as the difference
# between the first and last rows): dfccl-perf all-reduce (CMP_COLL:
# another of its collectives, e.g. allgather) of float on device buffers,
# callback and stream-ordered forms, -b CMP_MIN -e CMP_MAX -f 8 (default
# 8 B to 1 MiB), on 2 ranks: GPUs 0,1 where there are two,
# else both on GPU 0 (CMP_NRANKS=1: one rank, on GPU 0, no peer to wait
# for: the daemon's own path; CMP_NRANKS=N: rank r on GPU r mod the GPUs
# there are). CMP_MPS=1 runs every variant under a
# private MPS daemon (root and nvidia-cuda-mps-control, else SKIPPED), as
# the stream form is deployed. CMP_ITERS changes -n (default 200), CMP_TIMEOUT the
# seconds a run may take (default 120), CMP_MODES the forms to run
# (default "callback stream", space- or comma-separated; one of them
# halves the run), CMP_ARGS adds
# dfccl-perf options
# (e.g. "--batch 150 --group 1" for batches of 150 in one group; a batch's
# figure is per collective; "--overlap 500" for the overlap loop, whose
# figure is the loop's step, the compute kernel's and the collective's).
# Every result is checked. The table
# gives the out-of-place time per collective in us; a run that failed, or
# a variant whose daemon failed to start or stop, shows as "failed", its
# logs (the daemon's too) stay in OUTDIR, the other variants still run, and
# the script exits 1 at the end. Without a GPU it says SKIPPED and exits 77.
set -u
if [ $# -lt 3 ]; then
	echo "usage: $0 BINDIR [OUTDIR] -- NAME=DFCCLD[:ARGS]..." >&2
	exit 2
fi
args=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
	args+=("$1")
	shift
done
[ "${1:-}" = -- ] || { echo "usage: $0 BINDIR [OUTDIR] -- NAME=DFCCLD[:ARGS]... (the -- is missing)" >&2; exit 2; }
shift
variants=("$@")
[ ${#variants[@]} -gt 0 ] || { echo "$0: no variants after --" >&2; exit 2; }
for v in "${variants[@]}"; do
	case $v in
	?*=?*) ;;
	*) echo "$0: '$v' is not NAME=DFCCLD[:ARGS]" >&2; exit 2 ;;
	esac
done

# shellcheck source=perf_lib.sh
. "$(dirname "$0")/perf_lib.sh" "${args[@]}"

gpu_need_gpu compare_daemons.sh
gpu_need_bins dfcclctl dfccl-perf
gpu_setup compare-daemons
[ -n "$outdir" ] || outdir=$(mktemp -d /tmp/compare-daemons-XXXXXX)
mkdir -p "$outdir" || exit 1
iters=${CMP_ITERS:-200}
limit=${CMP_TIMEOUT:-120}
min=${CMP_MIN:-8}
max=${CMP_MAX:-1M}
coll=${CMP_COLL:-allreduce}
IFS=', ' read -ra modes <<<"${CMP_MODES:-callback stream}"
[ ${#modes[@]} -gt 0 ] || { echo "CMP_MODES names no form (callback, stream)" >&2; exit 2; }
for m in "${modes[@]}"; do
	case $m in
	callback | stream) ;;
	*) echo "CMP_MODES: unknown form '$m' (callback, stream)" >&2; exit 2 ;;
	esac
done
nranks=${CMP_NRANKS:-2}
case $nranks in
'' | *[!0-9]* | 0 | 0*) echo "CMP_NRANKS: '$nranks' is not a count of ranks (1 or more)" >&2; exit 2 ;;
esac
# Rank r on GPU r mod the GPUs there are.
devices=0
for r in $(seq 1 $((nranks - 1))); do devices=$devices,$((r % ngpu)); done
mps=
if [ "${CMP_MPS:-0}" != 0 ]; then
	if ! mps_usable; then
		echo "SKIPPED: CMP_MPS asks for MPS, which needs root and nvidia-cuda-mps-control"
		exit 77
	fi
	mps_start
	mps=", under MPS"
fi

failed=0
order=()
# run_variant LABEL SPEC: the forms of CMP_MODES against one daemon;
# non-zero where anything failed. It runs in a subshell of its own (variant): gpu_lib's
# fail exits, and must end only this variant.
run_variant() {
	local label=$1 spec=$2 exe extra mode rc bad=0 more=()
	exe=${spec%%:*}
	extra=
	[ "$exe" != "$spec" ] && extra=${spec#*:}
	[ "$exe" = - ] && exe=$bin/dfccld
	if [ ! -x "$exe" ]; then
		echo "== $label: $exe is not an executable dfccld"
		return 1
	fi
	echo "== $label: $exe $extra"
	dfccld_bin=$exe
	# shellcheck disable=SC2086 # $extra is the variant's settings, split on spaces
	start_daemon $extra
	# shellcheck disable=SC2206 # CMP_ARGS is dfccl-perf options, split on spaces
	[ -z "${CMP_ARGS:-}" ] || more=($CMP_ARGS)
	for mode in "${modes[@]}"; do
		rc=0
		timeout -k 10 "$limit" "$bin/dfccl-perf" "$coll" --socket "$sock" --nranks "$nranks" --devices "$devices" \
			--mem device --mode "$mode" -b "$min" -e "$max" -f 8 -n "$iters" -w 20 --json "${more[@]}" \
			>"$outdir/${label}_$mode.json" 2>"$outdir/${label}_$mode.log" || rc=$?
		if [ "$rc" != 0 ]; then
			echo "   $mode failed (exit $rc): $(tail -n 2 "$outdir/${label}_$mode.log")"
			bad=1
		fi
	done
	stop_daemon
	return "$bad"
}
# variant LABEL SPEC: run_variant apart (perf_lib.sh), the daemon's log
# kept in OUTDIR.
variant() {
	local rc=0
	order+=("$1")
	apart "$outdir/$1_dfccld.log" run_variant "$1" "$2" || rc=$?
	[ "$rc" = 0 ] || failed=$((failed + 1))
}
for v in "${variants[@]}"; do
	variant "${v%%=*}" "${v#*=}"
done
# The first again, as a check on drift.
first=${variants[0]}
variant "${first%%=*}_again" "${first#*=}"
[ -z "$mps" ] || mps_stop

{
	echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), GPUs $devices of $ngpu$mps:" \
		"$(nvidia-smi --query-gpu=name --format=csv,noheader | sort -u | paste -sd/), -n $iters -w 20," \
		"$coll of float, out of place, us per collective${CMP_ARGS:+, dfccl-perf $CMP_ARGS}"
	PYTHONPATH=$perf_lib_dir python3 - "$outdir" "${modes[*]}" "${order[@]}" <<'EOF'
import sys

import perf_json

out, modes, labels = sys.argv[1], sys.argv[2].split(), sys.argv[3:]


def load(name):
    """Out-of-place times by size; a size whose result was wrong maps to None."""
    return perf_json.times(out, name) or {}


for mode in modes:
    runs = [(label, load("%s_%s" % (label, mode))) for label in labels]
    sizes = sorted({s for _, r in runs for s in r})
    print("\n%s form\n" % mode)
    print("| variant | " + " | ".join("%d B" % s for s in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))
    for label, r in runs:
        cells = []
        for s in sizes:
            if s not in r:
                cells.append("failed")
            elif r[s] is None:
                cells.append("wrong")
            else:
                cells.append("%.1f" % r[s])
        print("| %s | %s |" % (label, " | ".join(cells)))
EOF
} | tee "$outdir/table.md"
echo "The runs' JSON and logs, and the table (table.md), are in $outdir"
if [ "$failed" != 0 ]; then
	echo "FAIL: $failed run(s) failed"
	exit 1
fi
