#!/bin/sh
# The README's pandas snippet, run as written (tests/docs/readme_snippet.sh).
exec "${srcdir:-.}/tests/docs/readme_snippet.sh" pandas
