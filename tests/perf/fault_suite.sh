#!/usr/bin/env bash
# The long fault suite on the host engine: 1000 SIGKILLed ranks during
# traffic on 3 communicators (survivors shrink and go on), 100 SIGSTOPped
# ranks (survivors time out after 1 s naming the stopped rank, shrink and
# go on), 20 daemon kills under load (clients reconnect), with the
# error-latency distributions and dfccld's resident memory. CI runs the
# same program short (ctest fault_suite: 20, 3 and 2 trials).
#
# Usage: tests/perf/fault_suite.sh BUILD_DIR [fault_suite options]
#        (default: --trials 1000 --stop-trials 100 --restart-trials 20)
set -euo pipefail
build=${1:?usage: fault_suite.sh BUILD_DIR [options]}
shift
exe=$build/bin/fault_suite
[ -x "$exe" ] || { echo "$exe is missing: build with -DDFCCL_BUILD_TESTS=ON first" >&2; exit 1; }
if [ $# -eq 0 ]; then
	set -- --trials 1000 --stop-trials 100 --restart-trials 20
fi
exec "$exe" "$@"
