"""The tests' view of a trace's layers, the same for every format: layer_groups(f) maps each
layer's name to its HDF5 group (formats 1-3: /layers/<name>/<metric>, one-dimensional) or, in
format 4, to a Layer that reads as such a group does: attrs (kind, layout, description, d_in,
d_out, param_count, param_count_unique; shares_storage_with as a list, where not empty) and
layer[metric] its column of /layers/<metric> (step, layer)."""

_ATTRS = ("kind", "layout", "description", "d_in", "d_out", "param_count", "param_count_unique")


class Layer:
    """Layer i of a format 4 trace's /layers group g, with its attributes read already."""

    def __init__(self, g, i, attrs):
        self.g, self.i, self.attrs = g, i, attrs

    def __getitem__(self, metric):
        return self.g[metric][:, self.i]

    def __contains__(self, metric):
        return metric in self.g and self.g[metric].ndim == 2

    def set(self, metric, row, value):
        """Writes one value (the tests that put NaN steps or alarms into a trace)."""
        self.g[metric][row, self.i] = value


def layer_groups(f):
    """{layer name: its group (formats 1-3) or its Layer (format 4)} of the open h5py file f."""
    if int(f.attrs.get("format_version", 1)) < 4:
        return dict(f["layers"].items())
    g = f["layers"]
    columns = {k: (g[k].asstr()[:] if g[k].dtype.kind == "O" else g[k][:]) for k in _ATTRS if k in g}
    shares = g["shares_storage_with"].asstr()[:] if "shares_storage_with" in g else None
    out = {}
    for i, name in enumerate(g["layer"].asstr()[:]):
        attrs = {k: v[i] for k, v in columns.items()}
        if shares is not None and shares[i]:
            attrs["shares_storage_with"] = shares[i].split()
        out[name] = Layer(g, i, attrs)
    return out
