#!/usr/bin/env bash
# Builds dfccl and runs its tests: the README's test command.
#
# For a fresh Debian 12 machine (a CUDA toolkit in /usr/local/cuda is used
# when present; no GPU is needed), run from the repository root, as root or
# with sudo available; on a machine that has the packages already, any user.
# Stages, each under a banner; the first failure stops the run with a
# non-zero exit:
#   1. packages      install the missing Debian packages
#   2. build         build/ (CUDA parts when a toolkit is found), full ctest
#   3. asan          build-asan/ with ASan+UBSan, full ctest
#   4. tsan          build-tsan/ with TSan, the tests labelled 'tsan'
#   5. fuzz          build-fuzz/ with clang and libFuzzer, each fuzz_* target
#                    for FUZZ_SECONDS (default 20) seconds
# Environment: DFCCL_TEST_QUICK=1 runs stages 1 and 2 only; DFCCL_JOBS sets
# build and test parallelism (default 2); FUZZ_SECONDS as above.
set -euo pipefail

DFCCL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source-path=SCRIPTDIR
# shellcheck source=setup-lib.sh
. "$DFCCL_ROOT/deploy/setup-lib.sh"
cd "$DFCCL_ROOT"

jobs=${DFCCL_JOBS:-2}
ctest_args=(--output-on-failure -j "$jobs" --timeout 300)
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

banner "1/5 packages"
ensure_packages

banner "2/5 build and test (build/)"
build_tree build -DDFCCL_BUILD_TESTS=ON -DDFCCL_SANITIZE=none
ctest --test-dir build "${ctest_args[@]}"

if [ "${DFCCL_TEST_QUICK:-0}" = 1 ]; then
	banner "DFCCL_TEST_QUICK=1: sanitizer and fuzz stages skipped"
	banner "all tests passed"
	exit 0
fi

# The sanitizer builds leave the CUDA parts out: without a GPU they cannot
# run, and the CUDA runtime does not coexist with ASan's shadow memory. The
# host engine runs the same worker and scheduler code.
banner "3/5 ASan+UBSan build and test (build-asan/)"
build_tree build-asan -DDFCCL_BUILD_TESTS=ON -DDFCCL_SANITIZE=address -DDFCCL_WITH_CUDA=OFF \
	-DCMAKE_BUILD_TYPE=Debug
ctest --test-dir build-asan "${ctest_args[@]}"

banner "4/5 TSan build and 'tsan' tests (build-tsan/)"
build_tree build-tsan -DDFCCL_BUILD_TESTS=ON -DDFCCL_SANITIZE=thread -DDFCCL_WITH_CUDA=OFF \
	-DCMAKE_BUILD_TYPE=Debug
# TSan cannot map its shadow memory under the high address-space
# randomization of some kernels; run without randomization where allowed.
norand=()
if setarch "$(uname -m)" -R true 2>/dev/null; then
	norand=(setarch "$(uname -m)" -R)
fi
"${norand[@]}" ctest --test-dir build-tsan -L tsan "${ctest_args[@]}"

banner "5/5 fuzz (build-fuzz/)"
fuzz_probe_dir=$(mktemp -d)
trap 'rm -rf "$fuzz_probe_dir"' EXIT
if ! command -v clang >/dev/null 2>&1; then
	echo "clang not found: fuzz stage skipped"
elif ! printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' |
	clang -fsanitize=fuzzer -x c - -o "$fuzz_probe_dir/probe" 2>/dev/null; then
	echo "clang cannot link libFuzzer (Debian: libclang-rt-14-dev): fuzz stage skipped"
else
	CC=clang build_tree build-fuzz -DDFCCL_BUILD_TESTS=ON -DDFCCL_FUZZ=ON -DDFCCL_WITH_CUDA=OFF \
		-DCMAKE_BUILD_TYPE=Debug
	shopt -s nullglob
	targets=(build-fuzz/bin/fuzz_*)
	shopt -u nullglob
	if [ ${#targets[@]} -eq 0 ]; then
		echo "no fuzz targets in build-fuzz/bin"
	fi
	for t in "${targets[@]}"; do
		[ -x "$t" ] || continue
		name=${t##*/}
		# New inputs go to a scratch directory; the checked-in corpus
		# (tests/fuzz/corpus/<name>, with or without the fuzz_ prefix) is
		# only read.
		corpus=("$fuzz_probe_dir/$name")
		mkdir -p "${corpus[0]}"
		for c in "tests/fuzz/corpus/$name" "tests/fuzz/corpus/${name#fuzz_}"; do
			if [ -d "$c" ]; then
				corpus+=("$c")
				break
			fi
		done
		echo "-- $name (${FUZZ_SECONDS:-20} s; corpus: ${corpus[*]:1})"
		"$t" -max_total_time="${FUZZ_SECONDS:-20}" -print_final_stats=1 \
			-artifact_prefix="build-fuzz/$name-" "${corpus[@]}"
	done
fi

banner "all tests passed"
