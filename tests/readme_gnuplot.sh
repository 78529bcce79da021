#!/bin/sh
# The README's gnuplot snippet, run as written (tests/readme_snippet.sh).
exec "${srcdir:-.}/tests/readme_snippet.sh" gnuplot
