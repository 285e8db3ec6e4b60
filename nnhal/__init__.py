"""nnhal: command-line entry points, and the one import namespace of the installed package.

Installed (the wheel), hal/ service/ delegate/ extensions/ cache/ are nnhal.hal & co.; in a
source checkout they are top-level folders, and nnhal._source_tree aliases nnhal.hal & co. to
them. Either way: ``from nnhal.delegate import load_delegate``.
"""
import os as _os

if not _os.path.isdir(_os.path.join(_os.path.dirname(__file__), "hal")):  # a source checkout
    from nnhal import _source_tree

    _source_tree.install()
