"""Imported once by part (c)'s forkserver, so that every child starts with TFLite, the delegate and
the installed extensions already loaded (a child then costs a fork, not seconds of imports)."""
import delegate.nnhal_delegate  # noqa: F401
import delegate.runtime  # noqa: F401
import delegate.tfl.verify  # noqa: F401
from extensions.plugins import ensure_plugins_loaded

ensure_plugins_loaded()
