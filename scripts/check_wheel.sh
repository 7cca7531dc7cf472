#!/usr/bin/env bash
# Builds jaxsync's wheel and source distribution (python -m build), installs the wheel into a clean
# virtual environment outside the repository, and runs it there: the command line, a config from the
# package's own reference, and an optax update of a rule. CI runs it after the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python -m pip install -q build
python -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
wheel="$(ls "$work"/dist/jaxsync-*.whl)"
ls "$work"/dist/jaxsync-*.tar.gz >/dev/null
echo "check_wheel: built $(basename "$wheel")"
# Nothing but the package: no tests, benchmarks or configs inside the wheel.
python - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
stray = [n for n in names if not n.startswith(("jaxsync/", "jaxsync-"))]
assert not stray, f"the wheel holds files outside the package: {stray[:5]}"
assert "jaxsync/_src/rules/ordered_momentum.py" in names and "jaxsync/cli.py" in names
print(f"check_wheel: {len(names)} files, all under jaxsync/")
PY

python -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$wheel"
cd "$work"  # away from the checkout: the installed package, not the source tree, is imported
"$work/venv/bin/jaxsync" --version
"$work/venv/bin/jaxsync" strategies | grep -q "^ormo (asynchronous"
"$work/venv/bin/jaxsync" config | grep -q "run.gradients"
"$work/venv/bin/python" - <<'PY'
import sys

import jax.numpy as jnp
import jaxsync
import optax

assert jaxsync.__file__.startswith(sys.prefix), jaxsync.__file__  # the wheel, not the checkout
tx = jaxsync.ordered_momentum(0.1, 0.9, num_workers=1)
params = jnp.zeros(3)
state = tx.init(params)
updates, state = tx.update(jnp.ones(3), state, params, version=jaxsync.server_version(state))
assert jnp.allclose(optax.apply_updates(params, updates), -0.1), updates
print("check_wheel: the installed wheel imports and applies ordered_momentum from", jaxsync.__file__)
PY
