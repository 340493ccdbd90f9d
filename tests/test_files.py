"""oma.files by hand: JSON Lines records from a file or its gzip sibling, atomic writes, digests."""

import gzip
import hashlib
import json

import pytest

from oma.files import atomic_write_text, read_jsonl, sha256_file
from oma.train import read_metrics

RECORDS = [{"iteration": 0, "eval_success": 0.25}, {"iteration": 1, "loss": -0.5, "note": "é"}]
TEXT = "".join(json.dumps(r) + "\n" for r in RECORDS)


def test_read_jsonl_reads_a_file_and_skips_blank_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(TEXT.replace("\n", "\n\n", 1), encoding="utf-8")
    assert read_jsonl(path) == RECORDS
    assert read_jsonl(str(path)) == RECORDS


def test_read_jsonl_reads_the_gzip_sibling_when_the_file_is_gone(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with gzip.open(tmp_path / "metrics.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(TEXT)
    assert read_jsonl(path) == RECORDS
    # the plain file wins where both exist: it is the one a run still appends to
    path.write_text(json.dumps(RECORDS[0]) + "\n")
    assert read_jsonl(path) == RECORDS[:1]


def test_read_jsonl_without_file_or_sibling_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "metrics.jsonl")


@pytest.mark.parametrize("packed", [False, True])
def test_a_damaged_line_is_named(tmp_path, packed):
    text = TEXT + '{"iteration": 2, "lo\n'
    path = tmp_path / "metrics.jsonl"
    if packed:
        with gzip.open(tmp_path / "metrics.jsonl.gz", "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text)
    with pytest.raises(ValueError, match=r"metrics\.jsonl(\.gz)?: line 3 is not JSON") as e:
        read_jsonl(path)
    assert str(e.value).split(":")[0].endswith(".gz") == packed


def test_read_metrics_reads_a_compressed_run_as_it_read_the_plain_one(tmp_path):
    assert read_metrics(tmp_path) == []  # a run that has written nothing yet
    (tmp_path / "metrics.jsonl").write_text(TEXT)
    plain = read_metrics(tmp_path)
    with gzip.open(tmp_path / "metrics.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write((tmp_path / "metrics.jsonl").read_text())
    (tmp_path / "metrics.jsonl").unlink()
    assert read_metrics(tmp_path) == plain == RECORDS


def test_atomic_write_text_replaces_whole_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "deep" / "config.json"
    atomic_write_text(path, "first")
    atomic_write_text(path, "second")
    assert path.read_text() == "second"
    assert [p.name for p in path.parent.iterdir()] == ["config.json"]
    assert sha256_file(path) == hashlib.sha256(b"second").hexdigest()
