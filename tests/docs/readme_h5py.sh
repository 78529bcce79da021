#!/bin/sh
# The README's h5py snippet, run as written (tests/docs/readme_snippet.sh).
exec "${srcdir:-.}/tests/docs/readme_snippet.sh" h5py
