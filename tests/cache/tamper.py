"""Changing cache files the way whoever can write the cache directory can."""
from __future__ import annotations

import os


def replace_file(path: str, data: bytes) -> None:
    """Put ``data`` under ``path`` as a new read-only file renamed over the old one.

    Entries are mode 0400: a directory writer cannot rewrite one in place, but can swap in a new
    file. Keeping the mode makes the loader reject the content, not the permissions."""
    tmp = path + ".tamper"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o400)
    os.replace(tmp, path)
