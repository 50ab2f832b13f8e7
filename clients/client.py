"""A small typed client over tritonclient: numpy in, numpy out, typed errors.

`Client` is synchronous, `AsyncClient` asyncio; both speak HTTP or gRPC. Request building and
response reading are shared; only the calls differ. Model control (load/unload) goes through the
restricted model-repository API, so those calls carry the key headers given at construction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import np_to_triton_dtype

from tritonkit.clients.errors import BadInputError, DeadlineExceededError, classify
from tritonkit.clients.padding import crop_outputs, pad_request
from tritonkit.input_rules import InputRule
from tritonkit.inputs import Sampler, crop_from_config, rules_from_config, sampler_for

# A load that never ends (a python-backend stub that never finishes initialising) would hold a tune,
# a sweep or the demo behind it for good; past this it is an error naming the model. Generous: a
# TensorRT engine of gigabytes deserialises in tens of seconds.
LOAD_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class TensorMeta:
    name: str
    datatype: str
    shape: tuple[int, ...]  # as Triton reports it: batch axis first (-1) when max_batch_size > 0


@dataclass(frozen=True)
class ModelMeta:
    name: str
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    max_batch_size: int
    rules: tuple[InputRule, ...] = ()  # what requests may carry (the config's tritonkit_inputs)
    crop: dict[str, tuple[int, int]] = field(default_factory=dict)  # outputs padding changes (tritonkit_crop)

    def pad(self, arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int | None]:
        """`arrays` padded up to their bucket's edge as the model's rules say, and their own length."""
        return pad_request(arrays, list(self.rules), self.max_batch_size > 0)

    def crop_back(self, outputs: dict[str, np.ndarray], length: int | None) -> dict[str, np.ndarray]:
        """Outputs of a padded request cut back to what its own length gives."""
        return crop_outputs(outputs, length, self.crop, self.max_batch_size > 0)

    def sampler(self, input_data: Path | None = None, seed: int = 0) -> Sampler:
        """The one sampler for this model: generated inputs by its rules, or `input_data` cycled."""
        return sampler_for(list(self.rules), self.max_batch_size > 0, input_data, seed)

    def random_inputs(self, batch: int = 1, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        """One generated request of `batch` samples (see tritonkit/inputs.py)."""
        return Sampler(list(self.rules), self.max_batch_size > 0, rng=rng)(batch)


def _protocol_module(protocol: str, aio: bool):
    if protocol == "grpc":
        import tritonclient.grpc as m
        if aio:
            import tritonclient.grpc.aio as m
    elif protocol == "http":
        import tritonclient.http as m
        if aio:
            import tritonclient.http.aio as m
    else:
        raise ValueError(f"protocol must be 'grpc' or 'http', not {protocol!r}")
    return m


def _as_dict(obj: Any) -> dict:
    """gRPC answers with protobuf messages, HTTP with dicts; normalise to dicts."""
    if isinstance(obj, dict):
        return obj
    return json_format.MessageToDict(obj, preserving_proto_field_name=True)


def meta_from_triton(name: str, metadata: dict, config: mc.ModelConfig) -> ModelMeta:
    def tensors(items):
        return tuple(TensorMeta(t["name"], t["datatype"], tuple(int(d) for d in t["shape"])) for t in items)

    return ModelMeta(name, tensors(metadata.get("inputs", [])), tensors(metadata.get("outputs", [])),
                     config.max_batch_size, tuple(rules_from_config(config)), crop_from_config(config))


def config_from_triton(obj: Any) -> mc.ModelConfig:
    if isinstance(obj, dict):
        return json_format.ParseDict(obj, mc.ModelConfig(), ignore_unknown_fields=True)
    # Re-parse into this module's class: the gRPC stub's message comes from another descriptor
    # pool, and messages from two pools never compare equal.
    cfg = mc.ModelConfig()
    cfg.ParseFromString(obj.config.SerializeToString())
    return cfg


class _Base:
    def __init__(self, url: str, protocol: str = "grpc", key_headers: dict[str, str] | None = None, aio=False):
        self.url = url
        self.protocol = protocol
        # Triton's gRPC frontend matches restricted-protocol keys with this prefix on the header name.
        prefix = "triton-grpc-protocol-" if protocol == "grpc" else ""
        self.key_headers = {prefix + k: v for k, v in (key_headers or {}).items()}
        self._m = _protocol_module(protocol, aio)
        self._meta_cache: dict[str, ModelMeta] = {}

    def _build(self, arrays: dict[str, np.ndarray], outputs: list[str] | None):
        inputs = []
        for name, a in arrays.items():
            a = np.asarray(a)
            try:
                dtype = np_to_triton_dtype(a.dtype)
            except Exception:  # noqa: BLE001
                dtype = None
            if dtype is None:
                raise BadInputError(f"input {name!r}: numpy dtype {a.dtype} has no Triton equivalent")
            t = self._m.InferInput(name, list(a.shape), dtype)
            t.set_data_from_numpy(a)
            inputs.append(t)
        outs = [self._m.InferRequestedOutput(n) for n in outputs] if outputs else None
        return inputs, outs

    @staticmethod
    def _read(result, names: list[str] | None) -> dict[str, np.ndarray]:
        """The outputs asked for, or all that Triton sent: their names come with the response, so a
        request is one round trip (no metadata call first, which a far endpoint pays in full)."""
        if not names:
            response = result.get_response()
            outs = response["outputs"] if isinstance(response, dict) else response.outputs
            names = [o["name"] if isinstance(o, dict) else o.name for o in outs]
        return {n: result.as_numpy(n) for n in names}

    def _infer_kwargs(self, priority: int, timeout_us: int | None, request_id: str) -> dict:
        kw: dict[str, Any] = {"priority": priority, "request_id": request_id}
        if timeout_us is not None:
            kw["timeout"] = timeout_us  # server-side: how long the request may wait in Triton's queue
        return kw

    def _config_kwargs(self) -> dict:
        return {} if self.protocol == "http" else {"as_json": False}


class Client(_Base):
    def __init__(self, url: str, protocol: str = "grpc", key_headers: dict[str, str] | None = None,
                 network_timeout_s: float = 60.0):
        super().__init__(url, protocol, key_headers)
        kwargs = {"network_timeout": network_timeout_s, "connection_timeout": network_timeout_s} \
            if protocol == "http" else {}
        self._c = self._m.InferenceServerClient(url, **kwargs)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - every failure leaves here typed
            raise classify(e) from e

    def live(self) -> bool:
        try:
            return bool(self._c.is_server_live())
        except Exception:  # noqa: BLE001
            return False

    def model_ready(self, model: str) -> bool:
        try:
            return bool(self._c.is_model_ready(model))
        except Exception:  # noqa: BLE001
            return False

    def config(self, model: str) -> mc.ModelConfig:
        return config_from_triton(self._call(self._c.get_model_config, model, **self._config_kwargs()))

    def metadata(self, model: str, refresh: bool = False) -> ModelMeta:
        if refresh or model not in self._meta_cache:
            md = _as_dict(self._call(self._c.get_model_metadata, model))
            self._meta_cache[model] = meta_from_triton(model, md, self.config(model))
        return self._meta_cache[model]

    def infer(self, model: str, arrays: dict[str, np.ndarray], *, priority: int = 0,
              timeout_us: int | None = None, outputs: list[str] | None = None,
              request_id: str = "", headers: dict[str, str] | None = None,
              padded: bool = False) -> dict[str, np.ndarray]:
        """`padded`: pad `arrays` up to their length bucket as the model's config says (its
        `padding`), so they batch with requests of similar length, and cut the outputs padding
        changes back to the request's own length (one metadata call per model, cached)."""
        meta = self.metadata(model) if padded else None
        arrays, length = meta.pad(arrays) if meta else (arrays, None)
        inputs, outs = self._build(arrays, outputs)
        result = self._call(self._c.infer, model, inputs, outputs=outs, headers=headers,
                            **self._infer_kwargs(priority, timeout_us, request_id))
        got = self._read(result, outputs)
        return meta.crop_back(got, length) if meta else got

    def statistics(self, model: str) -> dict:
        stats = _as_dict(self._call(self._c.get_inference_statistics, model))
        return stats["model_stats"][0]

    def server_version(self) -> str:
        return _as_dict(self._call(self._c.get_server_metadata))["version"]

    def load(self, model: str, config: mc.ModelConfig | None = None, files: dict[str, bytes] | None = None,
             timeout_s: float = LOAD_TIMEOUT_S) -> None:
        """Load or reload a model; with `config`, Triton uses it instead of the file's config; with
        `files` ("1/model.onnx" -> bytes, and `config`), the model need not be in the server's repository.
        A load still unanswered after `timeout_s` raises DeadlineExceededError naming the model (over
        HTTP, the client's network timeout bounds it too)."""
        kw: dict[str, Any] = {"headers": self.key_headers}
        if config is not None:
            kw["config"] = json_format.MessageToJson(config, preserving_proto_field_name=True)
        if files:
            kw["files"] = {f"file:{name}": data for name, data in files.items()}
        if self.protocol == "grpc":
            kw["client_timeout"] = timeout_s
        try:
            self._call(self._c.load_model, model, **kw)
        except DeadlineExceededError:
            raise DeadlineExceededError(f"{model} did not finish loading within {timeout_s:g} s: the server "
                                        "may still be loading it (see its log)", "DEADLINE_EXCEEDED") from None
        self._meta_cache.pop(model, None)

    def unload(self, model: str) -> None:
        self._call(self._c.unload_model, model, headers=self.key_headers)
        self._meta_cache.pop(model, None)

    def close(self) -> None:
        self._c.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient(_Base):
    """asyncio client; create it inside the running event loop."""

    def __init__(self, url: str, protocol: str = "grpc", key_headers: dict[str, str] | None = None):
        super().__init__(url, protocol, key_headers, aio=True)
        self._c = self._m.InferenceServerClient(url)

    async def _call(self, fn, *args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            raise classify(e) from e

    async def live(self) -> bool:
        try:
            return bool(await self._c.is_server_live())
        except Exception:  # noqa: BLE001
            return False

    async def config(self, model: str) -> mc.ModelConfig:
        return config_from_triton(await self._call(self._c.get_model_config, model, **self._config_kwargs()))

    async def metadata(self, model: str) -> ModelMeta:
        if model not in self._meta_cache:
            md = _as_dict(await self._call(self._c.get_model_metadata, model))
            self._meta_cache[model] = meta_from_triton(model, md, await self.config(model))
        return self._meta_cache[model]

    async def infer(self, model: str, arrays: dict[str, np.ndarray], *, priority: int = 0,
                    timeout_us: int | None = None, outputs: list[str] | None = None,
                    request_id: str = "", headers: dict[str, str] | None = None,
                    deadline_s: float | None = None, padded: bool = False) -> dict[str, np.ndarray]:
        """`headers` travel with the request (a gateway routes on them); `deadline_s` (gRPC) cancels
        a request still unanswered then, as DeadlineExceededError; `padded` as `Client.infer`."""
        meta = await self.metadata(model) if padded else None
        arrays, length = meta.pad(arrays) if meta else (arrays, None)
        inputs, outs = self._build(arrays, outputs)
        extra = {"client_timeout": deadline_s} if deadline_s is not None and self.protocol == "grpc" else {}
        result = await self._call(self._c.infer, model, inputs, outputs=outs, headers=headers, **extra,
                                  **self._infer_kwargs(priority, timeout_us, request_id))
        got = self._read(result, outputs)
        return meta.crop_back(got, length) if meta else got

    async def statistics(self, model: str) -> dict:
        return _as_dict(await self._call(self._c.get_inference_statistics, model))["model_stats"][0]

    async def server_version(self) -> str:
        return _as_dict(await self._call(self._c.get_server_metadata))["version"]

    async def close(self) -> None:
        await self._c.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def config_json(cfg: mc.ModelConfig) -> str:
    return json.dumps(json_format.MessageToDict(cfg, preserving_proto_field_name=True))
