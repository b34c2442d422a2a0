"""prepare_data: real tokenizers (trained here), real inputs of every kind, shards that decode back to the
documents, the tokenizer fingerprint in the header, bad input refused with one line and nothing written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from fsdpkit.contracts import exitcodes
from fsdpkit.data import make_shards, prepare_data
from fsdpkit.data.prepare_data import tokenizer_fingerprint
from fsdpkit.resilience.dataset.format import TokenShards, check_shards, read_header, shard_files
from tests.fixtures.tokenizers import EOS, corpus_files, train_bpe_tokenizer, wordlevel_tokenizer

REPO = Path(__file__).resolve().parents[2]
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
ODD_DOCS = [
    "naïve café — 東京, emoji 🙂 and tabs\tand  double  spaces",
    "  leading and trailing whitespace \n\n",
    "a literal <|end_of_text|> in the text is text, not a document end",
    "x",
]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_bpe_tokenizer(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def paragraphs() -> list[str]:
    """The corpus cut at blank lines: ~3000 short English documents."""
    return [p for f in corpus_files() for p in f.read_text(encoding="utf-8").split("\n\n") if p.strip()]


def run(argv: list[str]) -> dict:
    assert prepare_data.main(argv) == exitcodes.OK
    out = Path(argv[argv.index("--out") + 1])
    return json.loads((out / "prepare.json").read_text())


def decoded(out: Path, tokenizer: Path) -> list[str]:
    """The documents of a shard folder: each EOS-terminated run of ids, decoded."""
    summary = json.loads((out / "prepare.json").read_text())
    tokens = TokenShards(out).read(0, TokenShards(out).num_tokens)
    assert tokens[-1] == summary["eos_id"]
    tok = Tokenizer.from_file(str(tokenizer))
    cuts = np.flatnonzero(tokens == summary["eos_id"])
    starts = np.concatenate([[0], cuts[:-1] + 1])
    return [
        tok.decode(tokens[a:b].tolist(), skip_special_tokens=False) for a, b in zip(starts, cuts, strict=True)
    ]


def test_text_files_are_one_document_each_and_decode_back_exactly(bpe: Path, tmp_path: Path) -> None:
    files = corpus_files()
    out = tmp_path / "out"
    summary = run(["--tokenizer", str(bpe), "--out", str(out), "--shard-tokens", "20000", *map(str, files)])
    assert decoded(out, bpe) == [f.read_text(encoding="utf-8") for f in files]
    shards = shard_files(out)
    assert len(shards) == len(summary["shards"]) > 3  # documents span shards
    headers = [read_header(f) for f in shards]
    assert {h.itemsize for h in headers} == {2} and {h.vocab_size for h in headers} == {512}
    assert sum(h.num_tokens for h in headers) == summary["tokens"] > 100_000
    assert summary["documents"] == len(files) and summary["eos_token"] == EOS and summary["eos_id"] == 0
    assert [Path(i["path"]).name for i in summary["inputs"]] == [f.name for f in files]


def test_split_lines_makes_one_document_per_non_blank_line(bpe: Path, tmp_path: Path) -> None:
    text = tmp_path / "lines.txt"
    text.write_bytes(
        "\ufefffirst line\r\n\n   \nsecond  line \n\tthird, indented\nlast without newline".encode()
    )
    run(["--tokenizer", str(bpe), "--out", str(tmp_path / "out"), "--split-lines", str(text)])
    assert decoded(tmp_path / "out", bpe) == [
        "first line",
        "second  line ",
        "\tthird, indented",
        "last without newline",
    ]


def test_jsonl_documents_decode_back_and_empty_ones_are_skipped(
    bpe: Path, paragraphs: list[str], tmp_path: Path
) -> None:
    docs = paragraphs + ODD_DOCS
    src = tmp_path / "docs.jsonl"
    lines = [json.dumps({"id": i, "body": d}) for i, d in enumerate(docs)]
    lines[5:5] = ["", json.dumps({"body": ""}), "   "]  # a blank line, an empty document, a blank line
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = run(["--tokenizer", str(bpe), "--out", str(tmp_path / "out"), "--text-field", "body", str(src)])
    assert decoded(tmp_path / "out", bpe) == docs
    assert summary["documents"] == len(docs) > prepare_data.BATCH_DOCS  # several encode batches
    assert summary["empty_documents_skipped"] == 1


def test_parse_special_turns_special_tokens_in_the_text_into_ids(bpe: Path, tmp_path: Path) -> None:
    src = tmp_path / "docs.json"  # .json is read as JSON lines too
    src.write_text(json.dumps({"text": f"one{EOS}two"}) + "\n", encoding="utf-8")
    run(["--tokenizer", str(bpe), "--out", str(tmp_path / "out"), "--parse-special", str(src)])
    assert decoded(tmp_path / "out", bpe) == ["one", "two"]


def test_parquet_column_decodes_back(bpe: Path, paragraphs: list[str], tmp_path: Path) -> None:
    docs = paragraphs + ODD_DOCS
    src = tmp_path / "docs.parquet"
    table = pa.table({"n": list(range(len(docs))), "text": pa.array(docs, type=pa.large_string())})
    pq.write_table(table, src, row_group_size=700)
    summary = run(["--tokenizer", str(bpe), "--out", str(tmp_path / "out"), str(src)])
    assert decoded(tmp_path / "out", bpe) == docs and summary["inputs"][0]["kind"] == "parquet"


def test_save_to_disk_folders_decode_back(bpe: Path, paragraphs: list[str], tmp_path: Path) -> None:
    import datasets

    datasets.disable_progress_bars()
    plain, splits = tmp_path / "plain", tmp_path / "splits"
    datasets.Dataset.from_dict({"content": paragraphs[:500], "n": list(range(500))}).save_to_disk(plain)
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"content": paragraphs[500:900]}),
            "test": datasets.Dataset.from_dict({"content": ODD_DOCS}),
        }
    ).save_to_disk(splits)
    argv = ["--tokenizer", str(bpe), "--text-field", "content", "--split", "test"]
    summary = run([*argv, "--out", str(tmp_path / "out"), str(plain), str(splits)])
    assert decoded(tmp_path / "out", bpe) == paragraphs[:500] + ODD_DOCS
    assert [i["kind"] for i in summary["inputs"]] == ["datasets", "datasets"]


def test_a_vocab_above_65536_gives_uint32_shards(tmp_path: Path) -> None:
    wl = wordlevel_tokenizer(tmp_path / "wl", vocab_size=70_000)
    src = tmp_path / "ids.jsonl"
    src.write_text("\n".join(json.dumps({"text": t}) for t in ["w5 w69999 w3", "w65536 w65535"]) + "\n")
    summary = run(["--tokenizer", str(wl), "--out", str(tmp_path / "out"), str(src)])
    (shard,) = shard_files(tmp_path / "out")
    assert read_header(shard).itemsize == 4 and read_header(shard).vocab_size == 70_000
    assert summary["eos_token"] == "</s>" and summary["itemsize"] == 4
    tokens = TokenShards(tmp_path / "out").read(0, 7).tolist()
    assert tokens == [5, 69999, 3, 1, 65536, 65535, 1]


def test_eos_comes_from_tokenizer_config_or_eos_token(bpe: Path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(bpe, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|pad|>"}}))
    src = tmp_path / "a.txt"
    src.write_text("hello")
    tok = str(folder / "tokenizer.json")
    assert run(["--tokenizer", tok, "--out", str(tmp_path / "o1"), str(src)])["eos_id"] == 1
    assert (
        run(["--tokenizer", tok, "--out", str(tmp_path / "o2"), "--eos-token", EOS, str(src)])["eos_id"] == 0
    )


def test_the_fingerprint_is_stored_and_check_shards_compares_it(bpe: Path, tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    src.write_text("some text to train on " * 50)
    out = tmp_path / "out"
    run(["--tokenizer", str(bpe), "--out", str(out), str(src)])
    fp = tokenizer_fingerprint(bpe)
    assert read_header(shard_files(out)[0]).tokenizer_id == fp != 0
    assert json.loads((out / "prepare.json").read_text())["fingerprint"] == f"{fp:016x}"

    relaid = tmp_path / "relaid" / "tokenizer.json"  # the same tokenizer, another file layout
    relaid.parent.mkdir()
    relaid.write_text(json.dumps(json.loads(bpe.read_text()), indent=4))
    check_shards(out, seq_len=8, vocab_size=512, tokenizer_id=tokenizer_fingerprint(relaid))
    check_shards(out, seq_len=8, vocab_size=512)  # None: not checked

    other = tokenizer_fingerprint(train_bpe_tokenizer(tmp_path / "other", vocab_size=600))
    wrong = re.escape(f"(fingerprint {fp:016x} vs {other:016x}): run prepare_data again with the model's")
    with pytest.raises(ValueError, match=r"^shards in '.*out' were made with another tokenizer " + wrong):
        check_shards(out, seq_len=8, vocab_size=600, tokenizer_id=other)
    with pytest.raises(ValueError, match=f"fingerprint {fp:016x} vs 0000000000000000\\): run make_shards"):
        check_shards(out, seq_len=8, vocab_size=600, tokenizer_id=0)

    byte_shards = tmp_path / "bytes"
    make_shards.make_shards([src], byte_shards, shard_tokens=1000)
    assert {read_header(f).tokenizer_id for f in shard_files(byte_shards)} == {0}
    check_shards(byte_shards, seq_len=8, vocab_size=512, tokenizer_id=0)
    with pytest.raises(ValueError, match=r"fingerprint 0000000000000000 vs .*run prepare_data again"):
        check_shards(byte_shards, seq_len=8, vocab_size=512, tokenizer_id=fp)

    shutil.copy(shard_files(byte_shards)[0], out / "shard_00001.bin")  # one folder, two tokenizers
    mixed = f"shard_00000.bin: fingerprint {fp:016x}, shard_00001.bin: 0000000000000000"
    with pytest.raises(ValueError, match=re.escape(f"were made with different tokenizers ({mixed})")):
        check_shards(out, seq_len=8, vocab_size=512)


def test_the_same_inputs_give_the_same_bytes_in_process_and_from_the_cli(
    bpe: Path, paragraphs: list[str], tmp_path: Path
) -> None:
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs[:800]), encoding="utf-8")
    argv = ["--tokenizer", str(bpe), "--shard-tokens", "5000", str(src), str(corpus_files()[0])]
    run([*argv, "--out", str(tmp_path / "a")])
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpkit.data.prepare_data", *argv, "--out", str(tmp_path / "b")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"wrote \d+ shard\(s\) to .*b: 801 documents, [\d,]+ tokens .*\n", proc.stdout)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir()) and len(names) > 5
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


# --- bad input ----------------------------------------------------------------------------------------


def _jsonl(tmp: Path, *lines: str, name: str = "docs.jsonl") -> str:
    path = tmp / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def _parquet(tmp: Path, **columns: list) -> str:
    path = tmp / "docs.parquet"
    pq.write_table(pa.table(columns), path)
    return str(path)


def _save_to_disk(tmp: Path, *, splits: bool = False) -> str:
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_dict({"body": ["some text"]})
    (datasets.DatasetDict({"train": ds, "test": ds}) if splits else ds).save_to_disk(tmp / "ds")
    return str(tmp / "ds")


def _raw(tmp: Path, name: str, raw: bytes) -> str:
    (tmp / name).write_bytes(raw)
    return str(tmp / name)


def _tokenizer_file(tmp: Path, raw: bytes) -> str:
    return _raw(tmp, "tok.json", raw)


def _no_eos_tokenizer(tmp: Path, config: dict | None = None) -> str:
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp / "tokenizer.json"))
    if config is not None:
        (tmp / "tokenizer_config.json").write_text(json.dumps(config))
    return str(tmp / "tokenizer.json")


def _txt(tmp: Path, text: str = "a document", name: str = "a.txt") -> str:
    (tmp / name).write_text(text, encoding="utf-8")
    return str(tmp / name)


# Each case: (tmp, bpe tokenizer) -> (argv without --out, the message after "error: " as a regex).
BAD: dict[str, Callable[[Path, str], tuple[list[str], str]]] = {
    "tokenizer missing": lambda t, b: (
        ["--tokenizer", str(t / "nope.json"), _txt(t)],
        r"--tokenizer '.*nope\.json' not found: pass the path of the model's tokenizer\.json",
    ),
    "tokenizer a folder": lambda t, b: (
        ["--tokenizer", str(Path(b).parent), _txt(t)],
        r"--tokenizer '.*' is a folder: pass '.*/tokenizer\.json'",
    ),
    "tokenizer not JSON": lambda t, b: (
        ["--tokenizer", _tokenizer_file(t, b'{"version": '), _txt(t)],
        r"--tokenizer '.*tok\.json' is not JSON \(Expecting value at line 1\): pass a Hugging Face tokenizer",
    ),
    "tokenizer not UTF-8": lambda t, b: (
        ["--tokenizer", _tokenizer_file(t, b"\x0a\x8f\xffsentencepiece"), _txt(t)],
        r"--tokenizer '.*tok\.json' is not UTF-8 text \(byte 1\), so not a tokenizer\.json",
    ),
    "tokenizer JSON of something else": lambda t, b: (
        ["--tokenizer", _tokenizer_file(t, b'{"eos_token": "</s>"}'), _txt(t)],
        r"--tokenizer '.*tok\.json' is JSON but not a tokenizer\.json \(.+\): pass a Hugging Face",
    ),
    "eos token not in vocab": lambda t, b: (
        ["--tokenizer", b, "--eos-token", "</s>", _txt(t)],
        r"--eos-token '</s>' is not in the vocab of '.*': pick one of its tokens "
        r"\(special tokens: <\|end_of_text\|>, <\|pad\|>\)",
    ),
    "no eos token at all": lambda t, b: (
        ["--tokenizer", _no_eos_tokenizer(t), _txt(t)],
        r"tokenizer '.*' has none of </s>, <\|end_of_text\|>, <\|endoftext\|> .*: pass --eos-token TOKEN",
    ),
    "tokenizer_config eos not in vocab": lambda t, b: (
        ["--tokenizer", _no_eos_tokenizer(t, {"eos_token": "<eos>"}), _txt(t)],
        r"'.*tokenizer_config\.json' names eos_token '<eos>', which is not in the vocab .*: pass --eos-token",
    ),
    "input missing": lambda t, b: (
        ["--tokenizer", b, _txt(t), str(t / "gone.txt")],
        r"input\(s\) not found: .*gone\.txt; check the paths",
    ),
    "unknown extension": lambda t, b: (
        ["--tokenizer", b, _txt(t, name="a.csv")],
        r"input '.*a\.csv' has an unknown extension '\.csv': use \.txt \(text\), \.jsonl/\.json",
    ),
    "a plain folder": lambda t, b: (
        ["--tokenizer", b, str(t)],
        r"input '.*' is a folder that datasets' save_to_disk did not write .*: pass its files",
    ),
    "text not UTF-8": lambda t, b: (
        ["--tokenizer", b, _raw(t, "bin.txt", b"ok\xff")],
        r"input '.*bin\.txt' is not UTF-8 \(byte 2\): convert it to UTF-8",
    ),
    "jsonl line not JSON (after a shard was written)": lambda t, b: (
        [
            "--tokenizer",
            b,
            "--shard-tokens",
            "10",
            str(corpus_files()[0]),
            _jsonl(t, '{"text": "fine"}', '{"text": "fine"}', '{"text": oops}'),
        ],
        r"input '.*docs\.jsonl' line 3 is not JSON \(Expecting value\): write one JSON object per line",
    ),
    "jsonl line without the field": lambda t, b: (
        ["--tokenizer", b, _jsonl(t, '{"text": "fine"}', "", '{"body": "x", "id": 2}')],
        r"input '.*docs\.jsonl' line 3 has no field 'text' \(it has: body, id\): pass --text-field",
    ),
    "jsonl line not an object": lambda t, b: (
        ["--tokenizer", b, _jsonl(t, '["text"]')],
        r"input '.*docs\.jsonl' line 1 has no field 'text' \(it has: a JSON list\): pass --text-field",
    ),
    "jsonl field not a string": lambda t, b: (
        ["--tokenizer", b, _jsonl(t, '{"text": "fine"}', '{"text": 12}')],
        r"input '.*docs\.jsonl' line 2: field 'text' is int, not a string: fix the line",
    ),
    "jsonl line not UTF-8": lambda t, b: (
        ["--tokenizer", b, _raw(t, "x.jsonl", b'{"text": "\xe9"}\n')],
        r"input '.*x\.jsonl' line 1 is not UTF-8 \(byte 10\): convert it to UTF-8",
    ),
    "parquet without the column": lambda t, b: (
        ["--tokenizer", b, _parquet(t, body=["x"], id=[1])],
        r"input '.*docs\.parquet' has no column 'text' \(columns: body, id\): pass --text-field",
    ),
    "parquet column not strings": lambda t, b: (
        ["--tokenizer", b, _parquet(t, text=[1, 2])],
        r"column 'text' of input '.*docs\.parquet' holds int64, not strings: pick a text column",
    ),
    "parquet null text": lambda t, b: (
        ["--tokenizer", b, _parquet(t, text=["x", None])],
        r"input '.*docs\.parquet' row 2: 'text' is null: drop or fill those rows",
    ),
    "not a parquet file": lambda t, b: (
        ["--tokenizer", b, _txt(t, "not parquet", name="fake.parquet")],
        r"input '.*fake\.parquet' is not a Parquet file \(.+\): pass a \.parquet file",
    ),
    "datasets folder without the column": lambda t, b: (
        ["--tokenizer", b, _save_to_disk(t)],
        r"input '.*ds' has no column 'text' \(columns: body\): pass --text-field",
    ),
    "DatasetDict without --split": lambda t, b: (
        ["--tokenizer", b, "--text-field", "body", _save_to_disk(t, splits=True)],
        r"input '.*ds' is a DatasetDict \(splits: train, test\): pass --split",
    ),
    "DatasetDict without that split": lambda t, b: (
        ["--tokenizer", b, "--text-field", "body", "--split", "dev", _save_to_disk(t, splits=True)],
        r"input '.*ds' has no split 'dev' \(splits: train, test\): fix --split",
    ),
    "empty corpus": lambda t, b: (
        ["--tokenizer", b, _txt(t, ""), _jsonl(t, '{"text": ""}')],
        r"the inputs hold no text \(0 documents in 2 input\(s\)\): check the files and --text-field",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_exit_78_and_writes_nothing(
    case: str, bpe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    argv, message = BAD[case](inputs, str(bpe))
    before = sorted(tmp_path.rglob("*"))
    out = tmp_path / "out"
    assert prepare_data.main([*argv, "--out", str(out)]) == exitcodes.FATAL_CONFIG
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert re.fullmatch("error: " + message + r".*\n", err), err
    assert sorted(tmp_path.rglob("*")) == before  # no --out, no staging folder left behind


@pytest.mark.parametrize("existing", ["file", "shards"])
def test_an_out_that_is_a_file_or_holds_shards_is_refused_untouched(
    existing: str, bpe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = Path(_txt(tmp_path))
    out = tmp_path / "out"
    if existing == "file":
        out.write_text("keep me")
        message = r"--out '.*out' is a file, not a folder: pick a new or empty folder"
    else:
        make_shards.make_shards([src], out, shard_tokens=100)
        message = r"--out '.*out' already holds shards: pick a new or empty folder"
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert prepare_data.main(["--tokenizer", str(bpe), "--out", str(out), str(src)]) == exitcodes.FATAL_CONFIG
    assert re.fullmatch("error: " + message + "\n", capsys.readouterr().err)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_an_existing_empty_out_folder_is_filled(bpe: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "NOTES.md").write_text("mine")
    run(["--tokenizer", str(bpe), "--out", str(out), _txt(tmp_path)])
    assert sorted(p.name for p in out.iterdir()) == ["NOTES.md", "prepare.json", "shard_00000.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "out"]  # no staging folder left


def test_a_bad_command_line_is_argparse_exit_2(bpe: Path, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        prepare_data.main(
            ["--tokenizer", str(bpe), "--out", str(tmp_path / "o"), "--shard-tokens", "0", "a.txt"]
        )
    assert exc.value.code == exitcodes.USAGE
    assert capsys.readouterr().err == (
        "python -m fsdpkit.data.prepare_data: error: argument --shard-tokens: '0': must be at least 1\n"
    )


def test_bad_input_from_the_cli_has_no_traceback(bpe: Path, tmp_path: Path) -> None:
    src = _jsonl(tmp_path, '{"text": "fine"}', "{oops")
    argv = ["--tokenizer", str(bpe), "--out", str(tmp_path / "o"), src]
    proc = subprocess.run(
        [sys.executable, "-m", "fsdpkit.data.prepare_data", *argv],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == exitcodes.FATAL_CONFIG and proc.stdout == ""
    assert re.fullmatch(
        r"error: input '.*docs\.jsonl' line 2 is not JSON \(.*\): write one .*\n", proc.stderr
    )
    assert not (tmp_path / "o").exists()
