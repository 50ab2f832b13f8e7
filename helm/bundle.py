"""The models' way from the machine that runs `deploy` to the node: one archive with a checksum.

`deploy` with `engines.source: fetch` writes every served model's version folder (the ONNX each
engine is built from, or that ONNX Runtime serves; never an engine built elsewhere) into one
archive. It is reproducible (sorted members, no owners, no times), so the same models give the same
SHA-256 and the pods do not roll for nothing. With `engines.upload: true` deploy also PUTs it to
`engines.url` (object storage with a pre-signed URL, a WebDAV or nginx `dav` folder): the pod's
fetch init container GETs the same URL and refuses any other digest.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import urllib.request
from pathlib import Path

from tritonkit.errors import KitError
from tritonkit.files import write_bytes_atomic

SERVED_FILES = ("model.onnx",)  # what a node needs from a version folder; model.plan is built there


def archive(repo: Path, models: list[str]) -> bytes:
    """A .tar.gz of <model>/1/ for each model (ensembles: the empty folder Triton wants)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(models):
            folder = Path(repo) / name / "1"
            _add_dir(tar, f"{name}/1")
            for f in sorted(p for p in folder.iterdir() if p.name in SERVED_FILES) if folder.is_dir() else []:
                data = f.read_bytes()
                info = tarfile.TarInfo(f"{name}/1/{f.name}")
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:  # mtime 0: the same bytes every time
        gz.write(raw.getvalue())
    return out.getvalue()


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    tar.addfile(info)


def write(repo: Path, models: list[str], path: Path) -> str:
    """Write the archive to `path` (atomically) and return its SHA-256."""
    data = archive(repo, models)
    write_bytes_atomic(path, data)
    return hashlib.sha256(data).hexdigest()


def upload(path: Path, url: str, timeout_s: float = 300) -> None:
    """HTTP PUT of the archive to the URL the node fetches; a refusal is a KitError naming the status
    (never the URL: a pre-signed one carries credentials)."""
    req = urllib.request.Request(url, data=path.read_bytes(), method="PUT",
                                 headers={"Content-Type": "application/gzip"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            if r.status >= 300:
                raise KitError(f"uploading the model archive failed: HTTP {r.status}")
    except OSError as e:
        raise KitError(f"uploading the model archive to deploy.engines.url failed: {getattr(e, 'reason', e)} "
                       "(fix: a URL that accepts PUT, or upload it yourself and set engines.upload: false)") from None
