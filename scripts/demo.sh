#!/usr/bin/env bash
# The main job: export the built-in demo dataset, inspect it, and read it back.
# Usage: scripts/demo.sh [OUT]   (default OUT: ./demo-export)
source "$(dirname "$0")/env.sh"
install_extras
OUT="${1:-$ROOT/demo-export}"
shardex export-dataset demo -o "$OUT" --split-fractions train=0.8,val=0.1,test=0.1 --overwrite
shardex inspect "$OUT"
python "$ROOT/examples/quickstart.py" "$OUT"
