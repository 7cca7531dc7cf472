#!/usr/bin/env bash
# The README's test command: everything the suite needs, then the suite.
#   1. The real data of the tests, from Debian's packages, installed with apt-get when this runs as root
#      or with password-less sudo: Fashion-MNIST (dataset-fashion-mnist puts the four IDX files under
#      /usr/share/datasets/fashion-mnist/) and the Jargon File (jargon-text puts jargon.txt.gz under
#      /usr/share/doc/jargon-text/), each where jaxsync looks by default;
#      for the heavy tier, SLURM (slurm-wlm and munge: the tests that run jobs on a real SLURM cluster of
#      network-namespace hosts, scripts/slurm_cluster.sh), where it can, or those tests skip saying so;
#   2. jaxsync and its test extras, into the active Python environment;
#   3. pytest on two processes, one tier:
#        scripts/test.sh            the fast tier, what a developer runs after every change (the tests not
#                                   marked heavy; under 7 minutes on 2 cores);
#        scripts/test.sh --heavy    the rest: multi-process runs, the fault campaign, every benchmark at its
#                                   tiny size, long training (.ci/run runs both tiers, one after the other);
#        scripts/test.sh --all      both tiers in one run.
#      Extra arguments go to pytest (scripts/test.sh tests/rules -x); a -m of your own is added to the
#      tier's, and pytest keeps the last: pass --all with it to choose the tests by your marker alone.
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"

FASHION_MNIST_DIR="${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}"
JARGON_DIR="${JARGON_DIR:-/usr/share/doc/jargon-text}"
packages=()
[ -f "$FASHION_MNIST_DIR/train-images-idx3-ubyte.gz" ] || packages+=(dataset-fashion-mnist)
[ -f "$JARGON_DIR/jargon.txt.gz" ] || [ -f "$JARGON_DIR/jargon.txt" ] || packages+=(jargon-text)
if [ ${#packages[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    echo "test.sh: no apt-get here; put Fashion-MNIST's four IDX files in $FASHION_MNIST_DIR" \
      "(or set FASHION_MNIST_DIR) and the Jargon File's jargon.txt.gz in $JARGON_DIR (or set" \
      "JARGON_DIR) for the tests that read them" >&2
  else
    as_root=()
    if [ "$(id -u)" != 0 ]; then
      if sudo -n true 2>/dev/null; then as_root=(sudo -n); else as_root=(); fi
    fi
    if [ "$(id -u)" = 0 ] || [ ${#as_root[@]} -gt 0 ]; then
      "${as_root[@]}" apt-get install -y -q "${packages[@]}" \
        || { "${as_root[@]}" apt-get update -q && "${as_root[@]}" apt-get install -y -q "${packages[@]}"; }
      if [ ! -f "$JARGON_DIR/jargon.txt.gz" ] && [ ! -f "$JARGON_DIR/jargon.txt" ]; then
        # Minimal Debian images tell dpkg to skip /usr/share/doc (path-exclude), where the package
        # keeps the text: take it out of the .deb instead, into a folder the tests read via $JARGON_DIR.
        unpacked="${XDG_CACHE_HOME:-$HOME/.cache}/jaxsync/jargon-text"
        mkdir -p "$unpacked"
        (cd "$unpacked" && apt-get download -q jargon-text && dpkg-deb -x jargon-text_*.deb .) \
          || echo "test.sh: $JARGON_DIR/jargon.txt.gz is missing and the package could not be" \
            "unpacked; set JARGON_DIR to a folder holding jargon.txt.gz" >&2
        export JARGON_DIR="$unpacked/usr/share/doc/jargon-text"
      fi
    else
      echo "test.sh: not root and no password-less sudo; install the test data with:" \
        "sudo apt-get install ${packages[*]}" >&2
    fi
  fi
fi

heavy=0
for arg in "$@"; do
  case "$arg" in --heavy | --all) heavy=1 ;; esac
done
if [ "$heavy" = 1 ] && ! command -v slurmctld >/dev/null && command -v apt-get >/dev/null; then
  sudo=()
  if [ "$(id -u)" != 0 ]; then sudo=(sudo -n); fi
  slurm=(apt-get install -y -q --no-install-recommends slurm-wlm munge)
  if ! ${sudo[@]+"${sudo[@]}"} "${slurm[@]}"; then
    ${sudo[@]+"${sudo[@]}"} apt-get update -q && ${sudo[@]+"${sudo[@]}"} "${slurm[@]}" \
      || echo "test.sh: SLURM (slurm-wlm, munge) could not be installed; the slurm tests will skip" >&2
  fi
fi

# The tier flag may stand anywhere among the arguments; the rest go to pytest as they are.
tier=(-m "not heavy")
args=()
for arg in "$@"; do
  case "$arg" in
    --all) tier=() ;;
    --heavy) tier=(-m heavy) ;;
    *) args+=("$arg") ;;
  esac
done

python -m pip install -q -e '.[test]'
# ${a[@]+"${a[@]}"}: an empty array under `set -u` in every bash, macOS's 3.2 included.
exec python -m pytest -q -n 2 ${tier[@]+"${tier[@]}"} ${args[@]+"${args[@]}"}
