"""Two checkouts of backdrive in one process, for interleaved before/after timing.

``import_pair(OLD_SRC, NEW_SRC)`` copies ``OLD_SRC/backdrive`` and
``NEW_SRC/backdrive`` (each a checkout's ``src`` folder) into a temporary
folder as the packages ``bdold`` and ``bdnew``, rewrites the package's
absolute imports and its data-resource lookups to the new names, puts the
folder on ``sys.path`` and imports both. Timing the two alternately in one
process cancels most of a shared machine's drift.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

_IMPORT = re.compile(r"^(\s*)(from|import) backdrive([. ])", re.MULTILINE)


def import_pair(old_src: str, new_src: str):
    """``(bdold, bdnew)``: the two checkouts' ``backdrive`` packages, imported under new names."""
    tmp = tempfile.mkdtemp()
    for name, src in (("bdold", old_src), ("bdnew", new_src)):
        dst = Path(tmp) / name
        shutil.copytree(os.path.join(src, "backdrive"), dst, ignore=shutil.ignore_patterns("__pycache__"))
        for path in dst.rglob("*.py"):
            text = path.read_text()
            new = _IMPORT.sub(rf"\1\2 {name}\3", text).replace('files("backdrive.data")', f'files("{name}.data")')
            if new != text:
                path.write_text(new)
    sys.path.insert(0, tmp)
    return importlib.import_module("bdold"), importlib.import_module("bdnew")
