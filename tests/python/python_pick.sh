# Sourced by the tests that run Python. pick_python MODULE...: prints the first interpreter that
# imports every MODULE, of $PYTHON (configure's, passed by make check; default python3) and then
# Debian's /usr/bin/python3 (a python3 first on PATH, e.g. pyenv's, often lacks the python3-*
# packages); returns 1 when neither does.
pick_python() {
  imports=$(echo "$*" | sed 's/  */, /g')
  for c in "${PYTHON:-python3}" /usr/bin/python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c "import $imports" 2>/dev/null; then
      echo "$c"
      return 0
    fi
  done
  return 1
}
