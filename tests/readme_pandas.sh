#!/bin/sh
# The README's pandas snippet, run as written (tests/readme_snippet.sh).
exec "${srcdir:-.}/tests/readme_snippet.sh" pandas
