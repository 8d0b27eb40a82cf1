# Sourced by the other scripts: create (once) and activate the project's virtualenv.
# PYTHON picks the interpreter (default python3, which must be 3.11 or newer).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SHARDEX_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
install_extras() {  # install_extras [EXTRAS]: editable install of the project (with extras)
  local target="$ROOT"
  if [ -n "${1:-}" ]; then target="$ROOT[$1]"; fi
  python -m pip install --quiet --disable-pip-version-check -e "$target"
}
