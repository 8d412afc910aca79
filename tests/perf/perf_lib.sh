# shellcheck shell=bash
# What the GPU benchmark scripts of tests/perf share, sourced with the
# script's own arguments: BINDIR [OUTDIR] into `bin` (absolute) and
# `outdir` (empty: the script picks one), then tests/gpu/gpu_lib.sh.
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 BINDIR [OUTDIR]" >&2
	exit 2
fi
bin=$(cd "$1" && pwd) || exit 2
# shellcheck disable=SC2034 # used by the scripts that source this
outdir=${2:-}
# shellcheck source=../gpu/gpu_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../gpu/gpu_lib.sh"
