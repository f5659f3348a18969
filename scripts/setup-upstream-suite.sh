#!/usr/bin/env bash
# Prepares `make test-upstream-suite`: upstream tensorizer 2.12.1's own unittest
# suite, run against this checkout's package (.venv) and against upstream itself
# (.venv-upstream, made by scripts/setup-upstream.sh).
#
#   build/upstream-suite/sdist/    the tensorizer==2.12.1 sdist (pip download)
#   build/upstream-suite/tests/    its tests/ folder, extracted unchanged
#   build/upstream-suite/overlay/  moto 4 (the suite uses moto.mock_s3, which
#                                  moto 5 removed); put first on PYTHONPATH
#                                  for suite runs only, the venvs keep moto 5
#   build/upstream-suite/hf/       offline stand-in for EleutherAI/gpt-neo-125M
#                                  (scripts/make_standin_model.py)
#
# Nothing of the suite is committed. Idempotent: each step is skipped when its
# result is already present. torch is never replaced: every install below is
# constrained to the torch already in the venv.
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE_VERSION=2.12.1
SDIST_SHA256=8af9b3be54f31d08d1928e3f25bfaaa963cdc8d716d09559c68ec014f8beb440
MOTO_FOR_SUITE=4.2.14
TRANSFORMERS_PIN=5.23.0
DIR=build/upstream-suite
# The two venvs (defaults: the checkout's own); overridable for development.
OURS_VENV=${OURS_VENV:-.venv}
UPSTREAM_VENV=${UPSTREAM_VENV:-.venv-upstream}
PY="$OURS_VENV/bin/python"
mkdir -p "$DIR"

for venv in "$OURS_VENV" "$UPSTREAM_VENV"; do
  if [ ! -x "$venv/bin/python" ]; then
    echo "setup-upstream-suite: $venv is missing (run make setup / make upstream)" >&2
    exit 1
  fi
  torch_version=$("$venv/bin/python" -c "import torch; print(torch.__version__)") || {
    echo "setup-upstream-suite: $venv has no torch" >&2; exit 1; }
  # The suite's imports: transformers (pinned: a release that does not pull
  # torch), boto3, moto's server, redis, werkzeug, pytest to run it.
  if ! "$venv/bin/python" - "$TRANSFORMERS_PIN" <<'EOF' 2>/dev/null
import sys, importlib.metadata as md
import pytest, transformers, tokenizers, safetensors, boto3, moto, moto.server, redis, werkzeug, cryptography
sys.exit(md.version("transformers") != sys.argv[1])
EOF
  then
    constraints="$DIR/constraints.txt"
    echo "torch==$torch_version" >"$constraints"
    "$venv/bin/pip" install -q -c "$constraints" \
      "pytest" "transformers==$TRANSFORMERS_PIN" "boto3" "moto[server]" "redis" "werkzeug" "cryptography"
    now=$("$venv/bin/python" -c "import torch; print(torch.__version__)")
    if [ "$now" != "$torch_version" ]; then
      echo "setup-upstream-suite: torch changed in $venv ($torch_version -> $now)" >&2
      exit 1
    fi
  fi
done

# The suite itself, from the sdist; its files are not modified.
if [ ! -f "$DIR/tests/.complete" ]; then
  rm -rf "$DIR/sdist" "$DIR/tests"
  mkdir -p "$DIR/sdist"
  "$PY" -m pip download -q --no-deps --no-binary :all: "tensorizer==$SUITE_VERSION" -d "$DIR/sdist"
  sdist="$DIR/sdist/tensorizer-$SUITE_VERSION.tar.gz"
  echo "$SDIST_SHA256  $sdist" | sha256sum -c --quiet -
  "$PY" - "$sdist" "$DIR/tests" <<'EOF'
import sys, tarfile, pathlib
sdist, dest = sys.argv[1], pathlib.Path(sys.argv[2])
with tarfile.open(sdist) as tf:
    prefix = tf.getnames()[0].split("/")[0] + "/tests/"
    members = [m for m in tf.getmembers() if m.name.startswith(prefix) and m.isfile()]
    if not members:
        sys.exit("no tests/ in " + sdist)
    dest.mkdir(parents=True)
    for m in members:
        rel = pathlib.PurePosixPath(m.name[len(prefix):])
        if rel.is_absolute() or ".." in rel.parts:
            sys.exit("unsafe path in sdist: " + m.name)
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(tf.extractfile(m).read())
    print("upstream suite:", ", ".join(sorted(p.name for p in dest.iterdir())))
EOF
  touch "$DIR/tests/.complete"
fi

# moto 4 for the suite only (no dependencies: the venvs' moto 5 brought them).
if ! PYTHONPATH="$DIR/overlay" "$PY" -c "import moto, sys; sys.exit(moto.__version__ != '$MOTO_FOR_SUITE')" 2>/dev/null; then
  rm -rf "$DIR/overlay"
  "$PY" -m pip install -q --no-deps --target "$DIR/overlay" "moto==$MOTO_FOR_SUITE"
  rm -rf "$DIR/overlay/bin"
fi

# The offline stand-in for the model and tokenizer the suite loads.
"$PY" scripts/make_standin_model.py "$DIR/hf" --check
