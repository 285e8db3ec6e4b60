"""The nnhal TFLite delegate (client side).

``delegate.tfl`` reads and builds TFLite flatbuffers; ``delegate.mapping``
translates TFLite builtins into NNAPI operations (hal Models).
"""


def load_delegate(service_address=None, **options):
    """See delegate.nnhal_delegate.load_delegate (imported lazily: keeps `import delegate` light)."""
    from delegate.nnhal_delegate import load_delegate as _load
    from service.logconfig import configure_library_logging
    configure_library_logging()  # $NNHAL_LOG, unless the application configured logging itself
    return _load(service_address, **options)
