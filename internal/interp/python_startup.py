# Run silently by nook-interp in every Python kernel before its first cell.
# It adds two result formats (chart and data), and the helpers that set a
# cell's env_vars and restore the previous values afterwards.
def __nook_setup():
    import json
    import os

    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    ip = get_ipython()

    # The formatters find their types by name themselves: matplotlib's
    # inline backend removes every printer registered for Figure when it
    # activates.
    class _ByName(BaseFormatter):
        _return_type = (dict,)
        _by_name = {}

        def __call__(self, obj):
            t = type(obj)
            f = self._by_name.get((t.__module__, t.__name__))
            if f is None or not self.enabled:
                return None
            r = f(obj)
            return r if isinstance(r, dict) else None

    class _ChartFormatter(_ByName):
        format_type = Unicode("application/vnd.nook.chart+json")
        print_method = ObjectName("_repr_nook_chart_")

    class _DataFormatter(_ByName):
        format_type = Unicode("application/vnd.nook.data+json")
        print_method = ObjectName("_repr_nook_data_")

    def _num(v):
        try:
            f = float(v)
            return int(f) if f.is_integer() and abs(f) < 2**53 else f
        except Exception:
            return str(v)

    def _label(s):
        s = "" if s is None else str(s)
        return "" if s.startswith("_") else s

    def _chart(fig):
        try:
            from matplotlib.container import BarContainer
            from matplotlib.collections import PathCollection
            from matplotlib.patches import Wedge

            axes = fig.get_axes()
            if len(axes) != 1:
                return None
            ax = axes[0]
            title = ax.get_title() or (fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else "")
            base = {"title": title or None, "x_label": ax.get_xlabel() or None, "y_label": ax.get_ylabel() or None}
            wedges = [p for p in ax.patches if isinstance(p, Wedge)]
            if wedges:
                return {"type": "pie", "title": base["title"], "elements": [
                    {"label": _label(w.get_label()), "angle": _num(abs(w.theta2 - w.theta1)), "radius": _num(w.r)}
                    for w in wedges]}
            bars = [c for c in ax.containers if isinstance(c, BarContainer)]
            if bars:
                fmt = ax.xaxis.get_major_formatter()
                elements = []
                for c in bars:
                    group = _label(c.get_label())
                    for r in c.patches:
                        x = r.get_x() + r.get_width() / 2
                        try:
                            label = fmt(x)
                        except Exception:
                            label = str(_num(x))
                        elements.append({"label": str(label), "group": group, "value": _num(r.get_height())})
                return dict(base, type="bar", elements=elements)
            lines = ax.get_lines()
            scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
            if scatters and not lines:
                return dict(base, type="scatter", elements=[
                    {"label": _label(c.get_label()), "points": [[_num(x), _num(y)] for x, y in c.get_offsets()]}
                    for c in scatters])
            if lines:
                return dict(base, type="line", x_scale=ax.get_xscale(), y_scale=ax.get_yscale(), elements=[
                    {"label": _label(l.get_label()),
                     "points": [[_num(x), _num(y)] for x, y in zip(l.get_xdata(), l.get_ydata())]}
                    for l in lines])
        except Exception:
            return None
        return None

    def _data(df):
        try:
            if df.size > 100000:
                return None
            return json.loads(df.to_json(orient="split", date_format="iso"))
        except Exception:
            return None

    df = ip.display_formatter
    chart = _ChartFormatter(parent=df)
    chart._by_name = {("matplotlib.figure", "Figure"): _chart}
    df.formatters[chart.format_type] = chart
    data = _DataFormatter(parent=df)
    data._by_name = {("pandas.core.frame", "DataFrame"): _data}
    df.formatters[data.format_type] = data

    saved = []

    def env_set(spec):
        values = json.loads(spec)
        saved.append({k: os.environ.get(k) for k in values})
        os.environ.update(values)

    def env_restore():
        if not saved:
            return
        for k, v in saved.pop().items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    ip.user_ns_hidden["__nook_env_set"] = env_set
    ip.user_ns_hidden["__nook_env_restore"] = env_restore
    ip.user_ns["__nook_env_set"] = env_set
    ip.user_ns["__nook_env_restore"] = env_restore

    try:
        __nook_fast_path(ip)
    except Exception:
        pass  # slower cells, nothing else


# Per-cell overhead of ipykernel that nook-interp does not need (it ends a
# cell on the idle status, which follows every output on iopub). Output
# flushing is left as ipykernel does it: output written to fd 1 and 2
# directly must arrive with its cell.
def __nook_fast_path(ip):
    import logging

    import ipykernel.ipkernel
    import ipykernel.kernelbase

    kernel = ip.kernel

    # A 0.5 ms sleep before every execute_reply, for clients that do not
    # wait for the idle status.
    if hasattr(kernel, "_execute_sleep"):
        kernel._execute_sleep = 0

    # Messages nook-interp ignores: the busy status and execute_input. Each
    # iopub message costs serializing, signing and a wake-up of the iopub
    # thread (and a GIL hand-off to it). The idle status stays: it ends a
    # request.
    publish_status = kernel._publish_status

    def _publish_status(status, channel, parent=None):
        if status != "busy":
            publish_status(status, channel, parent)

    kernel._publish_status = _publish_status
    kernel._publish_execute_input = lambda *args, **kwargs: None

    # Before each shell request ipykernel wakes the control thread to
    # process control messages queued before it; nook-interp sends none
    # (it interrupts with SIGINT). The original does not wait for that
    # thread either.
    if hasattr(kernel, "_flush_control_queue"):

        async def _flush_control_queue():
            return None

        kernel._flush_control_queue = _flush_control_queue

    # The kernel's logger is at DEBUG while its handlers drop everything
    # below WARNING: each request built LogRecords of whole messages for
    # nothing. Raise it to the lowest level a handler takes.
    log = kernel.log
    levels, lg = [], log
    while lg is not None:
        levels += [h.level for h in lg.handlers]
        if not lg.propagate:
            break
        lg = lg.parent
    if not levels and logging.lastResort is not None:
        levels = [logging.lastResort.level]
    if levels and min(levels) > log.level:
        log.setLevel(min(levels))

    # inspect.signature of do_execute and run_cell on every cell.
    accepts = ipykernel.kernelbase._accepts_cell_id
    cache = {}

    def _accepts_cell_id(meth):
        key = getattr(meth, "__func__", meth)
        try:
            return cache[key]
        except KeyError:
            r = cache[key] = accepts(meth)
            return r
        except TypeError:
            return accepts(meth)

    ipykernel.kernelbase._accepts_cell_id = _accepts_cell_id
    ipykernel.ipkernel._accepts_cell_id = _accepts_cell_id


__nook_setup()
del __nook_setup
del __nook_fast_path
