"""The one sampler and the real-data reader (tritonkit/inputs.py), without a server: what every
generated request looks like, and how perf_analyzer's files and .npy folders are read and checked."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from tritonkit.errors import InputError
from tritonkit.input_rules import InputRule
from tritonkit.inputs import Sampler, draw_length, pad, read_input_data, sampler_for

IDS = InputRule("ids", "INT64", (-1,), min=(1,), opt=(16,), max=(64,), values=(0, 999))
IMAGE = InputRule("image", "FP32", (3, -1, -1), min=(3, 32, 32), opt=(3, 100, 70), max=(3, 512, 512), stride=32)
SR = InputRule("sr", "INT64", (), value=16000)


def test_generated_requests_follow_opt_stride_values_and_constants():
    out = Sampler([IDS, IMAGE, SR], batched=True, rng=np.random.default_rng(0))(4)
    assert out["ids"].shape == (4, 16) and out["ids"].dtype == np.int64
    assert out["ids"].min() >= 0 and out["ids"].max() <= 999
    assert out["image"].shape == (4, 3, 128, 96)  # opt rounded up to the stride
    assert out["sr"].shape == (4, 1) and set(out["sr"].ravel()) == {16000}  # a scalar travels as [1]
    plain = Sampler([InputRule("n", "INT32", (-1,))], batched=False)()
    assert plain["n"].shape == (1,) and not plain["n"].any()  # no range: 1, and zero ints


def test_shapes_are_drawn_from_the_list_and_refused_outside_the_range():
    rule = InputRule("w", "FP32", (1, -1), min=(1, 16), max=(1, 256), shapes=((1, 32), (1, 64)))
    s = Sampler([rule], batched=True, rng=np.random.default_rng(1))
    assert {s(1)["w"].shape[-1] for _ in range(20)} == {32, 64} and s.varies
    assert IMAGE.out_of_range((3, 1024, 64)) == ("dim 1 is 1024, above the maximum 512 "
                                                 "(shape range [3, 32, 32]..[3, 512, 512])")
    assert "multiple of the stride 32" in IMAGE.out_of_range((3, 64, 65))
    assert IMAGE.out_of_range((3, 64, 64)) is None


def test_perf_analyzer_json_content_and_b64_cycle_and_batch_by_shape(tmp_path):
    f = tmp_path / "data.json"
    f.write_text(json.dumps({"data": [
        {"ids": {"content": [1, 2], "shape": [2]}, "sr": [16000]},
        {"ids": {"b64": base64.b64encode(np.array([5, 6], np.int64).tobytes()).decode(), "shape": [2]},
         "sr": [8000]},
        {"ids": {"content": [7, 8, 9], "shape": [3]}, "sr": [16000]}]}))
    s = sampler_for([IDS, SR], batched=True, input_data=f)
    first = s(2)
    assert first["ids"].tolist() == [[1, 2], [5, 6]] and first["sr"].tolist() == [[16000], [8000]]
    third = s(2)  # a 3-token sample cannot share a request with 2-token ones: copies fill the batch
    assert third["ids"].tolist() == [[7, 8, 9], [7, 8, 9]]
    assert s(1)["ids"].tolist() == [[1, 2]]  # cycles


def test_npy_folder_of_samples(tmp_path):
    np.save(tmp_path / "ids.npy", np.array([[1, 2, 3], [4, 5, 6]]))
    (tmp_path / "image").mkdir()
    for i in range(2):
        np.save(tmp_path / "image" / f"{i}.npy", np.zeros((3, 32, 64), np.float32))
    samples = read_input_data(tmp_path, [IDS, IMAGE])
    assert len(samples) == 2 and samples[1]["ids"].tolist() == [4, 5, 6]


@pytest.mark.parametrize("doc, field", [
    ({"data": [{"ids": {"content": [1, 2], "shape": [3]}}]}, "data[0].ids"),  # too few values
    ({"data": [{"ids": {"content": list(range(100)), "shape": [100]}}]}, "data[0].ids"),  # above max 64
    ({"data": [{"nope": [1]}]}, "data[0].nope"),
    ({"rows": []}, "data"),
])
def test_bad_input_data_names_the_file_and_the_sample(tmp_path, doc, field):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(InputError) as e:
        read_input_data(f, [IDS])
    assert str(f) in str(e.value) and field in str(e.value) and "fix:" in str(e.value)


LINE = InputRule("line", "FP32", (3, 48, -1), min=(3, 48, 32), opt=(3, 48, 160), max=(3, 48, 320), stride=8)


@pytest.mark.parametrize("lengths", [("uniform", 32, 320), ("loguniform", 32, 320),
                                     ("histogram", ((40, 3.0), (100, 1.0)))])
def test_lengths_are_drawn_on_the_stride_within_bounds(lengths):
    rule = InputRule(**{**LINE.__dict__, "lengths": lengths})
    rng = np.random.default_rng(0)
    drawn = [draw_length(rule, rng) for _ in range(4000)]
    assert all(n % 8 == 0 and 32 <= n <= 320 for n in drawn)
    if lengths[0] == "histogram":  # 40 and 100 are on the stride already; 3 to 1
        assert set(drawn) == {40, 104} and 2.6 < drawn.count(40) / drawn.count(104) < 3.4
    else:
        short = sum(n <= 64 for n in drawn) / len(drawn)
        # uniform: 5 of the 37 lengths on the grid; log-uniform: log(65/32)/log(321/32), about 0.31
        assert (0.10 < short < 0.17) if lengths[0] == "uniform" else (0.27 < short < 0.35)
    assert InputRule.from_json(json.loads(json.dumps(rule.to_json()))) == rule  # as the config carries it


def test_padding_sends_the_bucket_edge_and_counts_its_waste():
    rule = InputRule(**{**LINE.__dict__, "lengths": ("uniform", 32, 320), "pad_to": (64, 160, 320),
                        "pad_value": -1.0})
    s = Sampler([rule], batched=True, rng=np.random.default_rng(2))
    sent = [s(2)["line"] for _ in range(200)]
    assert {a.shape[-1] for a in sent} == {64, 160, 320}  # three shapes, whatever was drawn
    assert s.sent_elements > s.real_elements > 0
    a = pad(rule, np.ones((1, 3, 48, 72), np.float32))
    assert a.shape == (1, 3, 48, 160) and (a[..., 72:] == -1).all() and (a[..., :72] == 1).all()
    assert rule.padded_length(320) == 320 and rule.padded_length(64) == 64
    plain = InputRule(**{**LINE.__dict__, "lengths": ("uniform", 32, 320)})
    unpadded = Sampler([plain], True, rng=np.random.default_rng(2))
    assert len({unpadded(1)["line"].shape for _ in range(100)}) > 20  # without padding: a shape per length


@pytest.mark.parametrize("dist", ["uniform", "loguniform"])
def test_a_few_payloads_stand_for_the_length_distribution(dist):
    """perf_analyzer cycles through sixteen payloads: at the distribution's quantiles, their mean
    length is the distribution's to within a few percent, and each is a length the rule allows."""
    rule = InputRule("line", "FP32", (3, 48, -1), min=(3, 48, 32), max=(3, 48, 320), stride=8,
                     lengths=(dist, 32, 320))
    rng = np.random.default_rng(1)
    mean = np.mean([draw_length(rule, rng) for _ in range(50000)])
    for seed in range(5):
        payloads = Sampler([rule], True, rng=np.random.default_rng(seed)).spread(16)
        widths = [p["line"].shape[-1] for p in payloads]
        assert all(w % 8 == 0 and 32 <= w <= 320 for w in widths) and len(set(widths)) >= 8
        assert np.mean(widths) == pytest.approx(mean, rel=0.04), (seed, widths)
