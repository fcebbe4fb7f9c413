# Sourced by scripts/test: the OS packages the test suite's labs need, installed when missing.
#
# sshd (the SSH lab), ip/nft (separate hosts in network namespaces, faults), debootstrap +
# qemu-user-static + zstd (the emulated aarch64 boards), the aarch64 cross compiler (ekrt's
# device runner and kernels under qemu), clang + its runtime (the .ekm loader fuzzer), chromium
# (renders the HTML report headless: screenshot, DOM, offline), lava-common (LAVA's job schema, the
# oracle for `edgekit lava-job`).
# Without root or apt the labs' tests skip with a reason; everything else still runs.
EDGEKIT_SYSTEM_PACKAGES=(
  openssh-server openssh-client iproute2 nftables
  debootstrap qemu-user-static zstd
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross
  clang llvm libclang-rt-14-dev
  chromium
  lava-common
)

edgekit_system_deps() {
  local missing=()
  for pkg in "${EDGEKIT_SYSTEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "note: missing OS packages (${missing[*]}); their tests will skip (run as root with apt to install them)" >&2
    return 0
  fi
  echo "installing OS packages: ${missing[*]} ..." >&2
  export DEBIAN_FRONTEND=noninteractive
  local log
  log="$(mktemp)"
  if ! { flock /tmp/edgekit-apt.lock apt-get update -q && \
         flock /tmp/edgekit-apt.lock apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    tail -20 "$log" >&2
    echo "note: could not install ${missing[*]}; their tests will skip" >&2
  fi
  rm -f "$log"
}
edgekit_system_deps
