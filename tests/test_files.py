"""oma.files by hand: JSON Lines records from a file or its gzip sibling, atomic writes, digests."""

import gzip
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path

import pytest

from oma.files import atomic_write_text, follow_umask, read_jsonl, sha256_file, umask
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


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def mask(request):
    """The process's umask for one test, set back after it."""
    before = os.umask(request.param)
    yield request.param
    os.umask(before)


def test_the_umask_is_read_without_changing_it(mask):
    """#58 item 10: the permissions helpers read the umask in force."""
    assert umask() == mask
    assert os.umask(mask) == mask


def test_atomic_writes_and_temporary_folders_follow_the_umask(tmp_path, mask):
    """#58 item 10: mkstemp's 0600 and mkdtemp's 0700 become what a plain open and mkdir give."""
    path = tmp_path / "summary.json"
    atomic_write_text(path, "{}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    (folder / "inner").mkdir()
    fd, name = tempfile.mkstemp(dir=folder / "inner")
    os.close(fd)
    follow_umask(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == stat.S_IMODE((folder / "inner").stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE(Path(name).stat().st_mode) == 0o666 & ~mask


@pytest.mark.parametrize("name, data, says", [
    ("metrics.jsonl", b'{"iteration": 0}\n\xff\xfe\n', "byte 17 is not UTF-8 text"),
    ("metrics.jsonl.gz", gzip.compress(b'{"iteration": 0}\n\xff\n'), "byte 17 is not UTF-8 text"),
    ("metrics.jsonl.gz", gzip.compress(TEXT.encode())[:-12], "not a whole gzip file"),
    ("metrics.jsonl.gz", TEXT.encode(), "not a whole gzip file"),
    ("metrics.jsonl", b'{"iteration": 0}\n[1, 2]\n', "line 2 is a JSON list, not an object"),
], ids=["not-utf8", "gzip-not-utf8", "gzip-cut-short", "not-gzip", "not-an-object"])
def test_a_file_that_cannot_be_read_is_named(tmp_path, name, data, says):
    """#58 item 7: what `oma report` reads through read_jsonl names the file when it is not UTF-8, not whole gzip, or
    holds a line that is not a record (a UnicodeDecodeError, EOFError or TypeError did not)."""
    (tmp_path / name).write_bytes(data)
    with pytest.raises(ValueError) as e:
        read_jsonl(tmp_path / "metrics.jsonl")
    assert str(e.value).startswith(f"{tmp_path / name}: ") and says in str(e.value)
