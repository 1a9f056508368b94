"""Observability: the state stores read for Prometheus and for people.

`StoreCollector` and `make_exporter` (``pbs-power exporter``) turn what the
hooks recorded into Prometheus metrics (`families.METRICS` lists them);
`status` and `history` are the ``pbs-power status`` and ``history`` views.
Nothing here is imported by the hooks: they only write, through
`pbs_power.states.journal` and `pbs_power.groups.records`.
"""
from pbs_power._lazy import exports, names

_PUBLIC = {
    "Reader": ".readers", "Observed": ".readers",
    "StoreCollector": ".exporter", "make_exporter": ".exporter",
    "ExporterError": ".exporter",
    "METRICS": ".families", "families": ".families", "exported_names": ".families",
    "status": ".status", "history": ".status",
}
__all__ = names(_PUBLIC)
__getattr__ = exports(__name__, _PUBLIC)
