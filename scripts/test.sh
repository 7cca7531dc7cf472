#!/usr/bin/env bash
# The README's test command: everything the suite needs, then the suite.
#   1. Fashion-MNIST for the real-data tests, from Debian's package (dataset-fashion-mnist puts the four
#      IDX files under /usr/share/datasets/fashion-mnist/, where jaxsync looks by default), installed
#      with apt-get when this runs as root or with password-less sudo;
#   2. jaxsync and its test extras, into the active Python environment;
#   3. pytest on two processes. Extra arguments go to pytest (scripts/test.sh -m 'not heavy').
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"

FASHION_MNIST_DIR="${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"
if [ ! -f "$FASHION_MNIST_DIR/train-images-idx3-ubyte.gz" ]; then
  if ! command -v apt-get >/dev/null; then
    echo "test.sh: no apt-get here; put Fashion-MNIST's four IDX files in $FASHION_MNIST_DIR" \
      "(or set FASHION_MNIST_DIR) for the two tests that read it" >&2
  else
    as_root=()
    if [ "$(id -u)" != 0 ]; then
      if sudo -n true 2>/dev/null; then as_root=(sudo -n); else as_root=(); fi
    fi
    if [ "$(id -u)" = 0 ] || [ ${#as_root[@]} -gt 0 ]; then
      "${as_root[@]}" apt-get install -y -q dataset-fashion-mnist \
        || { "${as_root[@]}" apt-get update -q && "${as_root[@]}" apt-get install -y -q dataset-fashion-mnist; }
    else
      echo "test.sh: not root and no password-less sudo; install Fashion-MNIST with:" \
        "sudo apt-get install dataset-fashion-mnist" >&2
    fi
  fi
fi

python -m pip install -q -e '.[test]'
exec python -m pytest -q -n 2 "$@"
