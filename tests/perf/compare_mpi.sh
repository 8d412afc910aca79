#!/bin/sh
# Compares dfccl's all-reduce on the host engine with Open MPI's
# MPI_Allreduce over shared memory on this machine, for 2 and 4 ranks and
# 8 B to 64 MiB, and prints one table per rank count: the out-of-place
# time and bus bandwidth of each, and their ratios (dfccl over MPI: a time
# ratio below 1 and a bandwidth ratio above 1 favour dfccl).
#
# Usage: tests/perf/compare_mpi.sh BUILD_DIR
# BUILD_DIR must hold bin/dfccld, bin/dfccl-perf and bin/mpi_allreduce (built
# when CMake found MPI: apt-get install openmpi-bin libopenmpi-dev).
# Environment: ITERS (default 20), WARMUP (default 5), MAX (default 64M).
set -eu

[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
bin=$1/bin
for b in dfccld dfccl-perf mpi_allreduce; do
	[ -x "$bin/$b" ] || { echo "$0: $bin/$b is missing (MPI found at configure time?)" >&2; exit 2; }
done
command -v mpirun >/dev/null || { echo "$0: mpirun not found (apt-get install openmpi-bin)" >&2; exit 2; }
iters=${ITERS:-20}
warmup=${WARMUP:-5}
max=${MAX:-64M}

dir=$(mktemp -d /tmp/dfccl-compare.XXXXXX)
daemon=
cleanup() {
	[ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT INT TERM

# The data rows of a dfccl-perf / mpi_allreduce table: size, time, busbw
# (out of place).
rows() {
	awk '!/^#/ && NF >= 9 { print $1, $6, $8 }' "$1"
}

for n in 2 4; do
	# One emulated device per rank, as MPI has one process per rank.
	"$bin/dfccld" --engine host --host-devices "$n" --socket "$dir/dfccld.sock" >"$dir/dfccld.log" 2>&1 &
	daemon=$!
	i=0
	until "$bin/dfcclctl" --socket "$dir/dfccld.sock" status >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -lt 100 ] || { echo "$0: dfccld did not start:" >&2; cat "$dir/dfccld.log" >&2; exit 1; }
		sleep 0.1
	done
	"$bin/dfccl-perf" allreduce -b 8 -e "$max" -f 2 -n "$iters" -w "$warmup" -c 1 --nranks "$n" \
		--socket "$dir/dfccld.sock" >"$dir/dfccl.$n"
	kill "$daemon"
	wait "$daemon" 2>/dev/null || true
	daemon=
	mpirun --allow-run-as-root --oversubscribe -np "$n" --mca btl self,vader \
		"$bin/mpi_allreduce" -b 8 -e "$max" -f 2 -n "$iters" -w "$warmup" -c 1 >"$dir/mpi.$n"

	echo "# all-reduce, float sum, $n ranks: dfccl (host engine) vs Open MPI (shared memory)"
	rows "$dir/dfccl.$n" >"$dir/a"
	rows "$dir/mpi.$n" >"$dir/b"
	join "$dir/a" "$dir/b" | awk '
		BEGIN { printf "%12s %12s %12s %10s %12s %12s %10s\n", "size(B)", "dfccl(us)", "mpi(us)", "time x",
		        "dfccl GB/s", "mpi GB/s", "busbw x" }
		{ printf "%12d %12.2f %12.2f %10.2f %12.3f %12.3f %10.2f\n", $1, $2, $4, $2 / $4, $3, $5,
		         ($5 > 0 ? $3 / $5 : 0) }'
	echo
done
