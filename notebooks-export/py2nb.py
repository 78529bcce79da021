"""py2nb — turns a notebook kept as plain Python with `# %%` cell markers into a .ipynb.

`# %%` (optionally followed by a title) starts a code cell; `# %% [markdown]` starts a markdown
cell whose lines are comments (`# ` is stripped). Lines before the first marker form a code cell
when any of them is not blank. Usage: python3 py2nb.py SRC.py DEST.ipynb"""

import re
import sys

import nbformat

MARKER = re.compile(r"^# %%(.*)$")


def _strip_blank_edges(lines):
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def convert(text):
    """The notebook (nbformat v4) that the plain-text notebook `text` describes."""
    cells, kind, lines = [], "code", []

    def close():
        body = _strip_blank_edges(lines)
        if kind == "markdown":
            body = [re.sub(r"^# ?", "", l) if l.startswith("#") else l for l in body]
            cells.append(nbformat.v4.new_markdown_cell("\n".join(body)))
        elif body:
            cells.append(nbformat.v4.new_code_cell("\n".join(body)))

    for line in text.splitlines():
        m = MARKER.match(line)
        if not m:
            lines.append(line)
            continue
        close()
        rest = m.group(1).strip()
        if rest.startswith("[markdown]"):
            kind, lines = "markdown", []
        else:
            # A title after the marker stays with its cell, as a comment.
            kind, lines = "code", (["# " + rest] if rest else [])
    close()
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: py2nb.py SRC.py DEST.ipynb\n")
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            nb = convert(f.read())
        nbformat.validate(nb)
        nbformat.write(nb, argv[2])
    except OSError as e:
        sys.stderr.write("py2nb: %s\n" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
