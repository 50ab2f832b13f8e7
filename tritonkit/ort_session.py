"""The ONNX Runtime session a model is served with on the bundled server, in one place: the
python-backend runner opens its session here, and `tritonkit bench serving` opens the raw session
it compares against here too, so "raw" and "served" differ only in the serving path.

`tritonkit configs` copies this file beside the runner (like input_rules.py): it needs only
onnxruntime.
"""

from __future__ import annotations

import onnxruntime as ort


def session_options(threads: int) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # With more than one thread, ORT's workers spin between calls by default: on a box of 1-2 cores
    # the spinning takes the core that Triton's threads and the clients need (bench serving).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def open_session(path: str, threads: int) -> ort.InferenceSession:
    return ort.InferenceSession(path, session_options(threads), providers=["CPUExecutionProvider"])
