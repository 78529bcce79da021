#!/bin/sh
# man.sh — the man page of every installed program (made by help2man from its --help, see
# Makefile.am): it exists (in the build directory, else the shipped one in the source
# directory), its title and NAME line name the program by its installed name, and, rendered by
# man (or groff), it lists every long option that the program's --help lists and the exit
# status. Skipped (77) when no page was made and help2man is missing (a git checkout without it).
set -u
src=${srcdir:-.}
build=${builddir:-.}
dir=$(mktemp -d "${TMPDIR:-/tmp}/stab-man.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
checks=0 fails=0
pass() { checks=$((checks + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); checks=$((checks + 1)); }

render() { # PAGE: the page as plain ASCII text on stdout
  if command -v man >/dev/null 2>&1; then
    LC_ALL=C MANWIDTH=200 man -l "$1" 2>/dev/null | col -bx
  else
    LC_ALL=C groff -man -Tascii -rLL=200n "$1" 2>/dev/null | col -bx
  fi
}

found=0
for p in demo bench train probe export; do
  name=stabmeter-$p
  page=$build/man/$name.1
  [ -f "$page" ] || page=$src/man/$name.1
  if [ ! -f "$page" ]; then
    if ! command -v help2man >/dev/null 2>&1; then continue; fi
    fail "$name: no man page ($build/man/$name.1, $src/man/$name.1)"
    continue
  fi
  found=$((found + 1))
  upper=$(echo "$name" | tr 'a-z' 'A-Z')
  grep -Eq "^\.TH \"?$upper\"? \"?1\"?" "$page" && pass || fail "$name: the page's title is not $upper(1): $(grep '^\.TH' "$page")"
  render "$page" >"$dir/page.txt"
  [ -s "$dir/page.txt" ] || { fail "$name: man -l renders nothing"; continue; }
  grep -Eq "^ *$name - " "$dir/page.txt" && pass || fail "$name: no NAME line '$name - ...': $(sed -n 1,6p "$dir/page.txt")"
  grep -q "$name \[OPTION\]" "$dir/page.txt" && pass || fail "$name: the synopsis does not read '$name [OPTION]...'"
  grep -qi "exit status" "$dir/page.txt" && pass || fail "$name: the page does not give the exit status"
  # every long option of --help (where an option line starts: spaces, then - or --)
  "$build/harness/$p" --help >"$dir/help.txt" 2>/dev/null
  sed -n 's/^ \{1,8\}\(-[A-Za-z], \)\{0,1\}\(--[a-z][a-z0-9-]*\).*/\2/p' "$dir/help.txt" | sort -u >"$dir/options"
  [ "$(wc -l <"$dir/options")" -ge 3 ] && pass || fail "$name: --help lists fewer than 3 long options: $(cat "$dir/options")"
  while read -r opt; do
    grep -q -- "$opt" "$dir/page.txt" && pass || fail "$name: the page does not list $opt, which --help lists"
  done <"$dir/options"
done
if [ "$found" -eq 0 ] && [ "$fails" -eq 0 ]; then
  echo "SKIP: no man page was made: help2man is missing (Debian: apt-get install help2man)"
  exit 77
fi
echo "man: $checks checks, $fails failures"
echo "$(( checks ? 100 * (checks - fails) / checks : 100 ))%: Checks: $checks, Failures: $fails, Errors: 0"
[ "$fails" -eq 0 ]
