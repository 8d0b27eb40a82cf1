# Sourced by the other scripts: create (once) and activate the project's virtualenv.
# PYTHON picks the interpreter (default python3, which must be 3.11 or newer).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SHARDEX_VENV:-$ROOT/.venv}"
pip_install() {  # pip_install ARGS: quiet pip install, less its warnings that package
  # folders named in the machine's pip configuration do not exist (one line per package)
  python -m pip install --quiet --disable-pip-version-check "$@" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
if [ ! -x "$VENV/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
install_extras() {  # install_extras [EXTRAS]: editable install of the project (with extras)
  local target="$ROOT"
  if [ -n "${1:-}" ]; then target="$ROOT[$1]"; fi
  pip_install -e "$target"
}
