#!/bin/sh
# The README's h5py snippet, run as written (tests/readme_snippet.sh).
exec "${srcdir:-.}/tests/readme_snippet.sh" h5py
