#!/bin/sh
# The README's xarray snippet, run as written (tests/readme_snippet.sh).
exec "${srcdir:-.}/tests/readme_snippet.sh" xarray
