#!/usr/bin/env bash
# Pin what setup installed, then check that ~/sky_templates/ray/start_cluster moved none of it (sky/train*.yaml).
#
#   bash trainer/node/pins.sh save    # end of setup, .venv active: writes .venv/searchrl-pins.txt
#   bash trainer/node/pins.sh check   # after start_cluster: exit 1 naming every package that changed
#
# Why: start_cluster runs `uv pip install "ray[default]==<found>" "click<8.3.0"` in the active venv (huggingface_hub
# needs click>=8.4.2); run: passes the overrides as UV_OVERRIDE so nothing moves, and `check` proves it.
# GPU_STACK=image: the venv is --system-site-packages over the image's python, and `uv pip freeze` lists only the
# venv's own packages (none of the image's torch, ray, click), so the pins would protect nothing. `python -m pip
# freeze` lists what the venv's python imports, the image's packages included (a venv copy shadows the image's, as
# at import time). Lines pinned to a local path (`name @ file:///...`, common in images) cannot be overrides and are
# left out of both.
set -euo pipefail
pins=.venv/searchrl-pins.txt

freeze() {
  if [ "${GPU_STACK:-lock}" = image ]; then
    python -m pip freeze --exclude-editable --disable-pip-version-check
  else
    uv pip freeze --exclude-editable
  fi
}

case "${1:-}" in
  save)
    frozen="$(freeze)"
    grep -v ' @ ' <<<"$frozen" > "$pins" || true
    ;;
  check)
    moved="$(freeze | grep -vxFf - "$pins" || true)"
    if [ -n "$moved" ]; then
      echo "error: start_cluster changed packages setup installed: $(echo $moved); re-run setup" >&2
      exit 1
    fi
    ;;
  *)
    echo "usage: bash trainer/node/pins.sh save|check" >&2
    exit 2
    ;;
esac
