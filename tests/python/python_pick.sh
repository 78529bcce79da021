# Sourced by the tests that run Python. pick_python MODULE...: prints the first interpreter that
# imports every MODULE, of $PYTHON (default python3: under make check, configure's PYTHON, which
# Makefile.am puts first on the tests' PATH as tests/bin/python3) and then Debian's
# /usr/bin/python3 (a python3 first on a user's PATH, e.g. pyenv's, often lacks the python3-*
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

# built_library BUILD: prints the absolute path of the libstabmeter that BUILD's make built, by
# its soname as libtool recorded it in the .la (what the package loads through
# STABMETER_LIBRARY); returns 1, saying so on stderr, when it is not there.
built_library() {
  soname=$(sed -n "s/^dlname='\(.*\)'$/\1/p" "$1/lib/libstabmeter.la" 2>/dev/null)
  dir=$(cd "$1/lib/.libs" 2>/dev/null && pwd)
  if [ -z "$soname" ] || [ -z "$dir" ] || [ ! -f "$dir/$soname" ]; then
    echo "no libstabmeter built in $1/lib (is the library built?)" >&2
    return 1
  fi
  echo "$dir/$soname"
}
