# Shared by scripts/test.sh and scripts/demo.sh: install missing Debian packages, check the CUDA toolkit, build.
# Sourced, not run.

# What the build needs, as "how to tell it is there|Debian package". A command is looked up on
# PATH; a Python module is imported (python3-venv: the pip install test's virtual environment); a
# header under /usr/include or $VMMCKPT_DEPS_PREFIX/usr/include (scripts/fetch-deps.sh unpacks them
# there for machines without a package registry).
VMMCKPT_NEEDS=(
  "cmd:cmake|cmake" "cmd:g++|g++" "cmd:make|make" "cmd:nm|binutils" "cmd:readelf|binutils" "cmd:python3|python3" "py:ensurepip|python3-venv"
  "hdr:spdlog/spdlog.h|libspdlog-dev" "hdr:fmt/format.h|libfmt-dev" "hdr:catch2/catch.hpp|catch2"
  "hdr:CLI/CLI.hpp|libcli11-dev" "hdr:nlohmann/json.hpp|nlohmann-json3-dev" "hdr:xxhash.h|libxxhash-dev"
)

vmmckpt_install_packages() {
  local missing=() need what pkg
  for need in "${VMMCKPT_NEEDS[@]}"; do
    what="${need%%|*}"
    pkg="${need##*|}"
    case "$what" in
      cmd:*) command -v "${what#cmd:}" >/dev/null 2>&1 && continue ;;
      py:*) python3 -c "import ${what#py:}" >/dev/null 2>&1 && continue ;;
      hdr:*) [ -f "/usr/include/${what#hdr:}" ] && continue
             [ -n "${VMMCKPT_DEPS_PREFIX:-}" ] && [ -f "$VMMCKPT_DEPS_PREFIX/usr/include/${what#hdr:}" ] && continue ;;
    esac
    [[ " ${missing[*]} " == *" $pkg "* ]] || missing+=("$pkg")
  done
  if ((${#missing[@]} == 0)); then return 0; fi
  echo "==> installing missing packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "error: need root or sudo to install: ${missing[*]}" >&2; return 1; }
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Headers unpacked by scripts/fetch-deps.sh are used when present.
if [ -z "${VMMCKPT_DEPS_PREFIX:-}" ] && [ -d "$PWD/.deps/prefix/usr/include" ]; then
  export VMMCKPT_DEPS_PREFIX="$PWD/.deps/prefix"
fi

# ccache (CMakeLists.txt uses it where installed) keyed on paths relative to the checkout, so another clone of the
# same sources (CI's) finds what this one compiled.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"

vmmckpt_check_cuda_toolkit() {
  local root="${CUDA_HOME:-${CUDAToolkit_ROOT:-/usr/local/cuda}}"
  if [ ! -f "$root/include/cuda.h" ]; then
    echo "error: no CUDA toolkit at $root (set CUDA_HOME). vmmckpt builds against the toolkit's headers and" >&2
    echo "       libraries even where there is no GPU." >&2
    return 1
  fi
  export CUDAToolkit_ROOT="$root"
}

# vmmckpt_configure BUILD_DIR [extra cmake args...]
# VMMCKPT_WERROR=ON in the environment (.ci/run sets it) builds with -Werror.
vmmckpt_configure() {
  local dir="$1"
  shift
  local generator=() werror=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  [ -n "${VMMCKPT_WERROR:-}" ] && werror=(-DVMMCKPT_WERROR="$VMMCKPT_WERROR")
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${werror[@]}" "$@"
  else
    cmake -S . -B "$dir" "${werror[@]}" "$@" >/dev/null
  fi
}

# vmmckpt_build BUILD_DIR [extra cmake args...]: everything, the tests and benchmarks included.
vmmckpt_build() {
  vmmckpt_configure "$@"
  cmake --build "$1" -j "$(nproc)"
}

# vmmckpt_build_targets BUILD_DIR TARGET...: only those (and what they need), in an existing configuration.
vmmckpt_build_targets() {
  local dir="$1"
  shift
  cmake --build "$dir" -j "$(nproc)" --target "$@"
}

vmmckpt_has_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}
