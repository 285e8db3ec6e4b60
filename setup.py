"""Packaging glue (metadata is in pyproject.toml): the wheel ships one import namespace, nnhal.

hal/ service/ delegate/ extensions/ cache/ become nnhal.hal & co. in the wheel, their absolute
imports rewritten at build time; `pip install -e .` keeps the source tree as it is.
See build_support/nnhal_namespace.py.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_support"))

from nnhal_namespace import NamespaceBuildPy, SourceTreeEditableWheel, wheel_layout  # noqa: E402
from setuptools import setup  # noqa: E402

packages, package_dir = wheel_layout(os.path.dirname(os.path.abspath(__file__)))
setup(packages=packages, package_dir=package_dir,
      cmdclass={"build_py": NamespaceBuildPy, "editable_wheel": SourceTreeEditableWheel})
