# shellcheck shell=bash
# Shared by deploy/test.sh and deploy/run-example.sh (sourced, not run).
#
# Installs the Debian packages the build needs, but only those that are
# missing: on a prepared machine nothing is installed and no privileges are
# needed. On a fresh Debian 12 machine run as root, apt-get installs them
# (through sudo when not root).

# What building and testing dfccl needs on Debian 12. gcc, g++, make and
# libc6-dev are not pulled in by cmake without recommends; g++ is nvcc's host
# compiler when a CUDA toolkit is present; libclang-rt-14-dev holds
# libFuzzer and clang's sanitizer runtimes (only recommended by clang);
# python3 runs the benchmark scripts' tables and their test.
DFCCL_DEBIAN_PACKAGES=(
	cmake make gcc g++ libc6-dev pkg-config
	libuv1-dev libprotobuf-c-dev protobuf-c-compiler libsystemd-dev
	libcmocka-dev libjansson-dev libhwloc-dev
	clang libclang-rt-14-dev python3
)

# Optional: Open MPI, only for the comparison benchmark tests/perf/mpi_allreduce
# (tests/perf/compare_mpi.sh). Nothing builds or tests against it otherwise,
# so ensure_packages installs these only when DFCCL_WITH_MPI=1.
DFCCL_DEBIAN_OPTIONAL_PACKAGES=(
	openmpi-bin libopenmpi-dev
)

banner() {
	printf '\n==== %s ====\n' "$*"
}

die() {
	printf '%s: %s\n' "${0##*/}" "$*" >&2
	exit 1
}

# Installs whichever of DFCCL_DEBIAN_PACKAGES (and, with DFCCL_WITH_MPI=1,
# DFCCL_DEBIAN_OPTIONAL_PACKAGES) is not installed yet.
ensure_packages() {
	local missing=() p wanted=("${DFCCL_DEBIAN_PACKAGES[@]}")
	if [ "${DFCCL_WITH_MPI:-0}" = 1 ]; then
		wanted+=("${DFCCL_DEBIAN_OPTIONAL_PACKAGES[@]}")
	fi
	if ! command -v dpkg-query >/dev/null 2>&1; then
		echo "not a Debian system: make sure these (or their equivalents) are installed:"
		echo "  ${wanted[*]}"
		return 0
	fi
	for p in "${wanted[@]}"; do
		if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != installed ]; then
			missing+=("$p")
		fi
	done
	if [ ${#missing[@]} -eq 0 ]; then
		echo "all needed packages are installed"
		return 0
	fi
	echo "installing: ${missing[*]}"
	local sudo=()
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null 2>&1 ||
			die "missing packages (${missing[*]}); run as root or install sudo"
		sudo=(sudo)
	fi
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# Configures and builds one tree: build_tree DIR [cmake options...].
# DFCCL_JOBS sets the parallelism (default 2).
build_tree() {
	local dir=$1
	shift
	cmake -S "$DFCCL_ROOT" -B "$dir" "$@"
	cmake --build "$dir" -j "${DFCCL_JOBS:-2}"
}
