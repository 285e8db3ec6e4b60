"""Vendor extensions (NNAPI extensions): registry, plugin discovery, TFLite CUSTOM op mapping.

A vendor package declares an :class:`Extension` and exposes it under the entry-point group
``nnhal.extensions``; ``nnhal serve`` and the delegate load every installed one. See
extensions/README.md.
"""
from extensions.registry import (  # noqa: F401
                                 Extension,
                                 ExtensionOperation,
                                 OperandTypeSpec,
                                 by_custom_code,
                                 lookup,
                                 register,
                                 registered,
                                 unregister,
)

#: Plugin discovery's names, from extensions.plugins on first use: loading it registers nnhal's own
#: extension, whose kernels the specs alone (the delegate's mapping) do not need.
_PLUGIN_NAMES = ("PluginLoad", "ensure_plugins_loaded", "load_object", "load_plugins", "plugin_results")


def __getattr__(name: str):
    if name in _PLUGIN_NAMES:
        from extensions import plugins
        return getattr(plugins, name)
    raise AttributeError(f"module 'extensions' has no attribute {name!r}")
