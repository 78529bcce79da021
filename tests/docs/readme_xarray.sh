#!/bin/sh
# The README's xarray snippet, run as written (tests/docs/readme_snippet.sh).
exec "${srcdir:-.}/tests/docs/readme_snippet.sh" xarray
