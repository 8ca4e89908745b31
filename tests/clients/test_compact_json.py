"""clients/compact_json.py reads back as what json.dump wrote, and keeps lists of plain values on one line."""
import json
import math

from clients.compact_json import dumps


def test_it_reads_back_as_json_wrote_it():
    obj = {"a": [1, 2.5, -3e-9, None, True, "x, [1, 2]"], "b": {"c": [], "d": {}, 1: "int key", None: 0},
           "e": [{"f": [0.1, 0.2]}, [1, [2, 3]], "g"], "h": (4, 5), "nan": float("nan"), "s": "q\"uote\n"}
    want = json.loads(json.dumps(obj, indent=1))
    got = json.loads(dumps(obj))
    assert math.isnan(got.pop("nan")) and math.isnan(want.pop("nan"))
    assert got == want


def test_plain_lists_stay_on_one_line_and_nested_structure_is_indented():
    text = dumps({"ttft_ms": [1.5, 2.25, 3.0], "blocks": [{"seed": 42}]})
    assert '"ttft_ms": [1.5, 2.25, 3.0]' in text.splitlines()[1]
    assert text == '{\n "ttft_ms": [1.5, 2.25, 3.0],\n "blocks": [\n  {\n   "seed": 42\n  }\n ]\n}'
