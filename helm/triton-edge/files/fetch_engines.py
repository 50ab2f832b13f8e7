"""Init container: download the engine archive, check its SHA-256, unpack it for Triton.

Runs with the Triton image's python3 (standard library only). The archive holds the version folders
laid out like model_repository/ (<model>/1/model.plan or model.onnx). Any problem exits non-zero
with one line, so the pod stays in Init and `kubectl describe` shows why.
"""

import hashlib
import os
import sys
import tarfile
import urllib.request
from pathlib import Path

dest = Path(os.environ["FETCH_DEST"])
url = os.environ.get("FETCH_URL", "")
want = os.environ.get("FETCH_SHA256", "").strip().lower()
models = [m for m in os.environ.get("FETCH_MODELS", "").split(",") if m]


def fail(msg: str) -> None:
    print(f"fetch-engines: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


if not url:
    fail("no URL (set engines.fetch.url or engines.fetch.urlSecret)")
archive = dest / ".archive"
digest = hashlib.sha256()
try:
    with urllib.request.urlopen(url, timeout=60) as r, open(archive, "wb") as f:
        while chunk := r.read(1 << 20):
            digest.update(chunk)
            f.write(chunk)
except OSError as e:
    fail(f"download failed: {e}")  # the URL may carry credentials: never print it
got = digest.hexdigest()
if want and got != want:
    fail(f"archive SHA-256 is {got}, expected {want}")
with tarfile.open(archive) as tar:
    for member in tar.getmembers():
        p = Path(member.name)
        # Refuse absolute paths, .., links and devices: the archive must only add files under dest.
        if p.is_absolute() or ".." in p.parts or not (member.isfile() or member.isdir()):
            fail(f"refusing archive member {member.name!r}")
    tar.extractall(dest)
archive.unlink()
missing = [m for m in models if not (dest / m / "1").is_dir()]
if missing:
    fail(f"archive has no version folder for {', '.join(f'{m}/1' for m in missing)}")
print(f"fetch-engines: unpacked {got[:12]} for {', '.join(models) or 'no models'}", flush=True)
