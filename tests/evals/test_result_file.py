"""Result files plain or gzip-compressed (evals/result_file.py): a .json.gz holds the same document as the .json,
is read back by every reader (evals.run --merge, evals.paper_tables, evals.tables), and is written the same
bytes for the same result (no time in the gzip header), so a re-run that changes nothing changes no file."""
from __future__ import annotations

import gzip
import json

from trtllm_dasc.evals.result_file import load_result, write_result

DOC = {"command": "python -m trtllm_dasc.evals.run --arms dense", "commit": "abc1234", "arms": [{"arm": "dense",
       "scores": {"niah_single_1": {"128": {"0": {"score": 1.0}}}}, "misses": []}], "lengths": [128], "x": 0.1 + 0.2}


def test_a_compressed_result_is_the_same_document_and_smaller(tmp_path):
    plain, packed = tmp_path / "r.json", tmp_path / "r.json.gz"
    big = {**DOC, "arms": DOC["arms"] * 200}
    write_result(str(plain), big)
    write_result(str(packed), big)
    # read back independently of the module: gzip + json from the standard library
    assert json.loads(gzip.decompress(packed.read_bytes())) == json.loads(plain.read_text()) == big
    assert load_result(str(packed)) == load_result(str(plain)) == big
    assert packed.stat().st_size < plain.stat().st_size / 10
    first = packed.read_bytes()
    write_result(str(packed), big)
    assert packed.read_bytes() == first and not (tmp_path / "r.json.gz.tmp").exists()


def test_the_readers_take_a_compressed_result(tmp_path, capsys):
    import trtllm_dasc.evals.run as run
    part = tmp_path / "part.json.gz"
    write_result(str(part), {**DOC, "model": "m", "tasks": ["niah_single_1"], "instances": 1, "protocol": "p",
                             "rounds": 1, "planned_arms": ["dense"]})
    assert run.main(["--merge", str(part), "--out", str(tmp_path / "merged.json.gz"), "--resamples", "10"]) == 0
    merged = load_result(str(tmp_path / "merged.json.gz"))
    assert merged["missing_arms"] == [] and merged["accuracy"]["dense"]["accuracy"] == 1.0
