#!/bin/sh
# The README's gnuplot snippet, run as written (tests/docs/readme_snippet.sh).
exec "${srcdir:-.}/tests/docs/readme_snippet.sh" gnuplot
