"""An in-tree PEP 517 build backend with no requirements, so `pip install ./python` works offline
(build isolation would otherwise download setuptools). It writes a pure-Python wheel (the
kvnode/ package plus METADATA, WHEEL and RECORD), an sdist, and a PEP 660 editable wheel (a .pth
file naming this folder). Name, version and summary come from pyproject.toml's [project]."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed zip timestamps: the same tree builds the same wheel


def _project() -> Dict[str, str]:
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read().split("[project]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([^"]*)"', text, re.MULTILINE))


def _metadata() -> str:
    p = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p.get('description', '')}",
        f"Requires-Python: {p.get('requires-python', '>=3.8')}",
        "Provides-Extra: host",
        "Requires-Dist: numpy; extra == 'host'",
    ]
    return "\n".join(lines) + "\n"


def _package_files() -> List[Tuple[str, bytes]]:
    out = []
    package = os.path.join(ROOT, "kvnode")
    for name in sorted(os.listdir(package)):
        if name.endswith(".py") or name == "py.typed":
            with open(os.path.join(package, name), "rb") as f:
                out.append((f"kvnode/{name}", f.read()))
    return out


def _write_wheel(directory: str, files: List[Tuple[str, bytes]]) -> str:
    p = _project()
    dist = f"{p['name']}-{p['version']}"
    info = f"{dist}.dist-info"
    files = files + [
        (f"{info}/METADATA", _metadata().encode()),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: kvnode_build\n"
                          b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    record = io.StringIO()
    name = f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            z.writestr(zipfile.ZipInfo(path, _EPOCH), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.write(f"{path},sha256={digest.decode()},{len(data)}\n")
        record.write(f"{info}/RECORD,,\n")
        z.writestr(zipfile.ZipInfo(f"{info}/RECORD", _EPOCH), record.getvalue())
    return name


def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> List[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Optional[dict] = None,
                metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory: str, config_settings: Optional[dict] = None,
                   metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, [("kvnode.pth", (ROOT + "\n").encode())])


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    p = _project()
    dist = f"{p['name']}-{p['version']}"
    name = f"{dist}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for sub in ("pyproject.toml", "README.md", "_build_backend", "kvnode", "examples"):
            path = os.path.join(ROOT, sub)
            if os.path.exists(path):
                tar.add(path, f"{dist}/{sub}",
                        filter=lambda t: None if "__pycache__" in t.name else t)
        info = tarfile.TarInfo(f"{dist}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return name
