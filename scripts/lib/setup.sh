# Shared by scripts/test.sh and scripts/demo.sh: install missing Debian packages, check the CUDA toolkit, build.
# Sourced, not run.

VMMCKPT_PACKAGES=(cmake make g++ binutils python3 libspdlog-dev libfmt-dev catch2 libcli11-dev nlohmann-json3-dev libxxhash-dev)

vmmckpt_install_packages() {
  local missing=()
  for pkg in "${VMMCKPT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
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

vmmckpt_check_cuda_toolkit() {
  local root="${CUDA_HOME:-${CUDAToolkit_ROOT:-/usr/local/cuda}}"
  if [ ! -f "$root/include/cuda.h" ]; then
    echo "error: no CUDA toolkit at $root (set CUDA_HOME). vmmckpt builds against the toolkit's headers and" >&2
    echo "       libraries even where there is no GPU." >&2
    return 1
  fi
  export CUDAToolkit_ROOT="$root"
}

# vmmckpt_build BUILD_DIR [extra cmake args...]
vmmckpt_build() {
  local dir="$1"
  shift
  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
  else
    cmake -S . -B "$dir" "$@" >/dev/null
  fi
  cmake --build "$dir" -j "$(nproc)"
}

vmmckpt_has_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}
