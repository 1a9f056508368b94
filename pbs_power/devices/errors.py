"""The error every device backend raises when it cannot work at all (kept apart from the
power backends' model, so that the device controller's users need not import it)."""


class BackendError(Exception):
    """The backend as a whole cannot work (bad options, unreachable, ...)."""
