#!/bin/sh
# pip_install.sh BUILD_DIR — `pip install ./python` as a user runs it, offline:
# into a fresh virtual environment (with Debian's torch and numpy visible),
# from a copy of python/ (pip builds in the source tree), with the
# libtessera.so the build made. Then the installed package, imported from
# outside the source tree, loads its own copy of the library and computes.
set -eu
BUILD=$(cd "$1" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cp -r "$SRC/python" "$TMP/src"
/usr/bin/python3 -m venv --system-site-packages "$TMP/venv"
cd "$TMP"
env -u PIP_FIND_LINKS TESSERA_LIBRARY="$BUILD/libtessera.so" \
    "$TMP/venv/bin/pip" install --quiet --no-index --no-build-isolation "$TMP/src"
env -u TESSERA_LIBRARY -u PYTHONPATH "$TMP/venv/bin/python" - <<'PY'
import os
import numpy as np
import tessera
lib = tessera._lib.path
assert "site-packages" in lib and os.path.basename(lib) == "libtessera.so.0", lib
x = tessera.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
y = (x @ x.T).numpy()
assert np.allclose(y, [[5, 14], [14, 50]]), y
print("installed:", lib, "->", y.tolist())
PY
