"""Hostile input to `rfrs-ref trace compare`: non-finite candidates, garbage files.

Every case either diverges (exit status 1 with the divergence) or is refused
with a one-line message naming the file and line (exit status 1), never a
traceback and never "the traces agree".
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import math
import os

import pytest
from click.testing import CliRunner

from rfrs_ref import trace as T

HEADER = {"format": "rfrs-trace", "version": 1, "producer": {"name": "test"}, "run": {"seed": 1},
          "dataset": {"name": "tiny"}, "n_params": 4, "state_arrays": ["m", "theta"], "dtype": "float64",
          "layout": "flat", "byte_order": "little", "checksum": "sha256",
          "initial": {"state_norms": {"m": 0.0, "theta": 1.5}, "state_checksums": {"m": "00" * 32, "theta": "ab" * 32}}}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _round(t: int) -> dict:
    return {"round": t, "clients": [0, 3], "byzantine": [False, True], "n_samples": [3, 4], "f": 1,
            "f_rule": 1, "excluded": [], "grad_norms": [0.5, 2.0 * t], "loss": 0.7 / t,
            "rule": {"scores": [1.0, 2.5], "selected": [0]}, "kept": [1.0, 0.0], "weights": [1.0, 0.0],
            "attack": {}, "state_norms": {"m": 0.1 * t, "theta": 1.5 + t},
            # each state its own digest: one digest at two norms is refused
            "state_checksums": {"m": _digest(f"m{t}"), "theta": _digest(f"theta{t}")}}


def _lines(rounds: int = 3) -> list[dict]:
    return [copy.deepcopy(HEADER)] + [_round(t) for t in range(1, rounds + 1)]


def _write(path, lines, **dumps) -> str:
    path.write_text("".join(json.dumps(x, **dumps) + "\n" for x in lines))
    return str(path)


def _cli(*args):
    from rfrs_ref.cli.main import main

    return CliRunner().invoke(main, ["trace", "compare", *map(str, args)])


@pytest.fixture
def ref(tmp_path):
    return _write(tmp_path / "ref.jsonl", _lines())


def test_the_synthetic_trace_agrees_with_itself(ref, tmp_path):
    res = _cli(ref, _write(tmp_path / "same.jsonl", _lines()))
    assert res.exit_code == 0 and "the traces agree: 3 rounds" in res.output, res.output


# -- 1. non-finite candidates -------------------------------------------------------------------------

@pytest.mark.parametrize("literal", ["Infinity", "1e999"])
def test_a_trace_of_infinities_diverges(ref, tmp_path, literal):
    """Every loss, gradient norm and state norm +inf: the tolerance used to be
    rtol·max(|A|, |B|) = inf, and the traces 'agreed'."""
    lines = _lines()
    for r in lines[1:]:
        r["loss"] = 1e300
        r["grad_norms"] = [1e300, 1e300]
        r["state_norms"] = {"m": 1e300, "theta": 1e300}
    lines[0]["initial"]["state_norms"] = {"m": 1e300, "theta": 1e300}
    text = "".join(json.dumps(x) + "\n" for x in lines).replace("1e+300", literal)
    bad = tmp_path / "inf.jsonl"
    bad.write_text(text)
    res = _cli(ref, bad)
    assert res.exit_code == 1 and "traces diverge at the header, field initial.state_norms.m" in res.output, res.output
    assert "inf where A is finite" in res.output
    assert "agree" not in res.output.replace("agree before", "")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e38])
def test_one_nonfinite_or_huge_value_diverges_where_it_is(ref, tmp_path, value):
    lines = _lines()
    lines[2]["loss"] = value
    res = _cli(ref, _write(tmp_path / "b.jsonl", lines))
    assert res.exit_code == 1 and "traces diverge at round 2, field loss" in res.output, res.output


def test_tolerance_comes_from_the_reference_not_the_candidate(tmp_path):
    """A = 1, B = 2 with rtol = 0.6: within 0.6·max(|A|, |B|) = 1.2, not within 0.6·|A|."""
    a, b = _lines(1), _lines(1)
    b[1]["loss"] = 2 * a[1]["loss"]
    res = _cli(_write(tmp_path / "a.jsonl", a), _write(tmp_path / "b.jsonl", b), "--rtol", "0.6")
    assert res.exit_code == 1 and "field loss" in res.output, res.output
    # and the other way round, B within 0.6·|A| of A
    res = _cli(_write(tmp_path / "a2.jsonl", b), _write(tmp_path / "b2.jsonl", a), "--rtol", "0.6")
    assert res.exit_code == 0, res.output


def test_nonfinite_reference_values_match_only_themselves(tmp_path):
    """Decision: a reference that holds NaN (or ±inf) is matched by the same value only."""
    a = _lines(1)
    a[1]["loss"] = float("inf")
    a[1]["rule"]["scores"] = [float("nan"), 1.0]
    pa = _write(tmp_path / "a.jsonl", a)
    assert T.compare(pa, _write(tmp_path / "same.jsonl", a)).agree
    for loss, scores, field in [(float("-inf"), [float("nan"), 1.0], "loss"),
                                (1e308, [float("nan"), 1.0], "loss"),
                                (float("inf"), [1.0, 1.0], "rule.scores[0]"),
                                (float("inf"), [float("inf"), 1.0], "rule.scores[0]")]:
        b = copy.deepcopy(a)
        b[1]["loss"], b[1]["rule"]["scores"] = loss, scores
        d = T.compare(pa, _write(tmp_path / "b.jsonl", b)).divergence
        assert d is not None and (d.round, d.field) == (1, field), (loss, scores, d)


def test_a_dropped_state_array_diverges(ref, tmp_path):
    lines = _lines()
    del lines[2]["state_norms"]["theta"]
    d = T.compare(ref, _write(tmp_path / "b.jsonl", lines)).divergence
    assert (d.round, d.field, d.reason) == (2, "state_norms.theta", "missing in B")
    lines = _lines()
    del lines[1]["state_checksums"]["m"]
    d = T.compare(ref, _write(tmp_path / "c.jsonl", lines)).divergence
    assert (d.round, d.field) == (1, "state_checksums.m")


def test_a_number_too_large_for_a_float_is_infinite_not_a_crash(ref, tmp_path):
    lines = _lines()
    lines[1]["loss"] = 10 ** 400  # 401 digits: parses as an int, overflows a float
    res = _cli(ref, _write(tmp_path / "big.jsonl", lines))
    assert res.exit_code == 1 and "traces diverge at round 1, field loss" in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


@pytest.mark.parametrize("rtol", ["inf", "nan"])
def test_a_nonfinite_tolerance_is_refused(ref, rtol, refused):
    refused(_cli(ref, ref, "--rtol", rtol))


# -- 4. garbage files -----------------------------------------------------------------------------------

def test_a_binary_trace(ref, tmp_path, refused):
    bad = tmp_path / "bin.jsonl"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
    refused(_cli(ref, bad), "bin.jsonl:", "not UTF-8")
    with pytest.raises(T.TraceFormatError, match="bin.jsonl:1: not UTF-8"):
        T.read_trace(bad)


def test_a_deeply_nested_trace(ref, tmp_path, refused):
    bad = tmp_path / "deep.jsonl"
    bad.write_text(json.dumps(HEADER) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    refused(_cli(ref, bad), "deep.jsonl:2", "nested too deeply")


def test_a_moderately_nested_round_line(ref, tmp_path, refused):
    """Deep enough for the parser, far too deep for a trace: refused before comparing."""
    lines = _lines()
    nest: list = []
    for _ in range(500):
        nest = [nest]
    lines[1]["rule"]["deep"] = nest
    refused(_cli(ref, _write(tmp_path / "nest.jsonl", lines)), "nest.jsonl:2", "nested more than")


def test_a_number_with_5000_digits(ref, tmp_path, refused):
    bad = tmp_path / "digits.jsonl"
    line = json.dumps(_round(1)).replace('"f": 1,', '"f": ' + "9" * 5000 + ",")
    bad.write_text(json.dumps(HEADER) + "\n" + line + "\n")
    refused(_cli(ref, bad), "digits.jsonl:2", "unreadable JSON number")


def test_a_line_cut_short_by_an_interruption(ref, tmp_path, refused):
    bad = tmp_path / "cut.jsonl"
    text = "".join(json.dumps(x) + "\n" for x in _lines())
    bad.write_text(text[: -40])
    msg = refused(_cli(ref, bad), "cut.jsonl:4", "not valid JSON")
    assert "cut short" in msg


@pytest.mark.parametrize("edit, fragment", [
    (lambda h, r: h.update(version=True), "version True"),
    (lambda h, r: h.update(run=[1, 2]), "header field run must be an object"),
    (lambda h, r: h.update(initial="x"), "header field initial must be an object"),
    (lambda h, r: h["initial"].update(state_checksums="abc"), "state_checksums must be an object"),
    (lambda h, r: r.update(state_checksums={"theta": 5}), "hex strings"),
    (lambda h, r: r.update(state_norms=None), "state_norms must be an object"),
    (lambda h, r: r.update(state_norms=[1.0]), "state_norms must be an object"),
    (lambda h, r: r.update(round=True), "round True"),
])
def test_mistyped_fields(ref, tmp_path, edit, fragment, refused):
    lines = _lines(1)
    edit(lines[0], lines[1])
    refused(_cli(ref, _write(tmp_path / "typed.jsonl", lines)), "typed.jsonl:", fragment)


@pytest.mark.parametrize("placeholder", ["n/a", "", "0", "ab" * 31, "zz" * 32, "ab" * 33])
@pytest.mark.parametrize("which", ["a", "b"])
def test_a_checksum_that_is_no_sha256_digest_is_refused(tmp_path, refused, placeholder, which):
    """Two traces of an implementation that computes no checksum and writes "n/a" in their
    place, without state_sums, 'agreed' as "values and checksums": the placeholders matched,
    excused the missing sums, and a B with m's sign flipped (norms unchanged) agreed."""
    lines = _lines()
    for obj in [lines[0]["initial"]] + lines[1:]:
        obj["state_checksums"] = {"m": placeholder, "theta": placeholder}
    good = _write(tmp_path / "good.jsonl", _lines())
    bad = _write(tmp_path / "bad.jsonl", lines)
    a, b = (bad, good) if which == "a" else (good, bad)
    refused(_cli(a, b), "bad.jsonl:1", "sha256 digests of 64 hex digits", never="agree")
    refused(_cli(bad, bad), "bad.jsonl:1", "state_checksums.'m' is", never="agree")
    # an implementation without checksums leaves them out: its sums then decide
    for obj in [lines[0]["initial"]] + lines[1:]:
        del obj["state_checksums"]
    plain = _write(tmp_path / "plain.jsonl", lines)
    res = _cli(plain, plain)
    assert res.exit_code == 0 and "values (checksums not compared)" in res.output, res.output


@pytest.mark.parametrize("which", ["a", "b", "both"])
def test_one_digest_at_two_norms_is_refused(tmp_path, refused, which):
    """A placeholder in the form of a digest ("0" * 64 in every round) passed the format
    check: two traces writing it, without state_sums, agreed as "values and checksums",
    and a B with m's sign flipped (norms unchanged) agreed. The same bytes have one norm,
    so one digest of an array at two norms is no checksum: refused, naming the lines."""
    fake = _flip_m(_lines())
    for obj in [fake[0]["initial"]] + fake[1:]:
        obj["state_checksums"] = {"m": "0" * 64, "theta": "0" * 64}
    fake = _without_sums(fake)
    bad = _write(tmp_path / "bad.jsonl", fake)
    good = _write(tmp_path / "good.jsonl", _lines())
    a, b = {"a": (bad, good), "b": (good, bad), "both": (bad, bad)}[which]
    refused(_cli(a, b), "bad.jsonl:2", "is the digest it was at", "bad.jsonl:1 (initial)",
            "the same bytes have one norm", never="agree")
    # a state left as it was (a round skipped) keeps its digest and its norm: accepted,
    # and so is a norm of the same bytes rounded differently in its last digits
    lines = _lines()
    lines[2]["state_norms"] = dict(lines[1]["state_norms"])
    lines[2]["state_norms"]["theta"] *= 1 + 1e-12
    lines[2]["state_checksums"] = dict(lines[1]["state_checksums"])
    same = _write(tmp_path / "same.jsonl", lines)
    res = _cli(same, same)
    assert res.exit_code == 0 and "agree" in res.output, res.output


@pytest.mark.parametrize("content", ["[1, 2]\n", "null\n", '"text"\n'])
def test_lines_that_are_not_objects(ref, tmp_path, content, refused):
    bad = tmp_path / "notobj.jsonl"
    bad.write_text(content)
    refused(_cli(ref, bad), "notobj.jsonl:1", "expected a JSON object")


def test_the_reference_side_is_checked_too(ref, tmp_path, refused):
    bad = tmp_path / "bin.jsonl"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    refused(_cli(bad, ref), "bin.jsonl:1")


def test_an_unreadable_file(ref, tmp_path, refused):
    import os

    bad = tmp_path / "locked.jsonl"
    bad.write_text(json.dumps(HEADER) + "\n")
    bad.chmod(0)
    try:
        if os.access(bad, os.R_OK):  # running as root: permissions do not apply
            pytest.skip("the file stays readable for this user")
        refused(_cli(ref, bad), "locked.jsonl", "cannot read the trace")
    finally:
        bad.chmod(0o600)


# -- resuming onto a damaged trace (`rfrs-ref train --resume --trace FILE`) -------------------------------

@pytest.mark.parametrize("damage", [b"\x89PNG\xff\xfe\n", b"[" * 100_000 + b"\n", b'{"round": ' + b"9" * 5000 + b"}\n",
                                    b"[1, 2]\n", b'{"round": 3, "clients": [\n'])
def test_resume_keeps_the_readable_prefix_of_a_damaged_trace(tmp_path, damage):
    p = tmp_path / "t.jsonl"
    good = "".join(json.dumps(x) + "\n" for x in _lines(2)).encode()
    p.write_bytes(good + damage + (json.dumps(_round(4)) + "\n").encode())
    kept = T._prefix(p, 10)
    assert [json.loads(x).get("round") for x in kept] == [None, 1, 2]
    assert T._prefix(p, 1) == kept[:2]


def test_resume_onto_a_trace_without_a_readable_header_keeps_nothing(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(b"\xff\xfe binary\n" + (json.dumps(_round(1)) + "\n").encode())
    assert T._prefix(p, 10) == []


class _Recorded(io.BufferedReader):
    """A binary file that records the size of each ``readline`` (-1: no limit)."""

    def __init__(self, path):
        super().__init__(io.FileIO(path, "rb"))
        self.asked: list[int] = []

    def readline(self, size=-1):
        self.asked.append(size)
        return super().readline(size)


def test_resume_reads_no_line_past_the_limit(tmp_path, monkeypatch):
    """A resume read the kept prefix of its trace with no limit on a line: a line of
    gigabytes without a line end was read whole into memory (and, damaged, dropped with
    the rounds after it). It is refused as compare refuses it, naming the file, the line
    and the limit, after reading no more than MAX_LINE_BYTES + 1 bytes of it."""
    monkeypatch.setattr(T, "MAX_LINE_BYTES", 4096)
    for where, head in ((1, b""), (3, "".join(json.dumps(x) + "\n" for x in _lines(1)).encode())):
        p = tmp_path / f"long{where}.jsonl"
        with open(p, "wb") as fh:  # a line of 1 MiB (sparse: NULs) without an end
            fh.write(head + b'{"round": 2, ')
            fh.truncate(fh.tell() + (1 << 20))
        with pytest.raises(T.TraceFormatError, match=rf"long{where}.jsonl:{where}: a line of more "
                                                     r"than 4,096 bytes \(read no further\)"):
            T._prefix(p, 10)
        fh = _Recorded(p)
        with fh, pytest.raises(T.TraceFormatError, match="a trace is a JSON Lines file"):
            T._prefix_lines(fh, 10, p)
        assert fh.asked == [4097] * where, fh.asked
    # a line of exactly the limit, its line end included, is kept
    lines = _lines(2)
    lines[2]["rule"]["pad"] = ""
    lines[2]["rule"]["pad"] = "x" * (4096 - len(json.dumps(lines[2]) + "\n"))
    p = _write(tmp_path / "exact.jsonl", lines)
    assert [len(x.encode()) for x in T._prefix(p, 10)][2] == 4096


def test_resume_onto_a_trace_whose_first_line_is_too_long_leaves_it_alone(tmp_path, monkeypatch):
    """The writer read the first line of an existing file 1 MiB far and took a longer one
    that starts as its headers do for its own header cut short, writing the trace afresh
    over it on resume. The first line is read as compare reads it: one longer than
    MAX_LINE_BYTES is refused, naming the file, the line and the limit, and the file left."""
    monkeypatch.setattr(T, "MAX_LINE_BYTES", 4096)
    p = tmp_path / "t.jsonl"
    with open(p, "wb") as fh:
        fh.write(T._HEADER_START)
        fh.truncate(2 << 20)  # a first line of 2 MiB, no line end
    before = p.read_bytes()
    for resume in (None, 2):
        with pytest.raises(T.TraceRefused, match=r"t.jsonl:1: a line of more than 4,096 bytes.*"
                                                 r"does not overwrite"):
            _tracer(tmp_path, p, resume_after=resume)
        assert p.read_bytes() == before


def test_a_trace_too_large_for_memory_is_one_line(ref, tmp_path, refused, monkeypatch):
    """A trace whose parsed lines exhaust the memory (below the size limits, on a small
    machine) ended the comparison with a MemoryError traceback."""
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps(x) + "\n" for x in _lines()))
    size = big.stat().st_size
    real_parse = T.parse_json

    def parse(raw, where):
        if "big.jsonl:3" in where:
            raise MemoryError
        return real_parse(raw, where)

    monkeypatch.setattr(T, "parse_json", parse)
    refused(_cli(ref, big), "big.jsonl", "too large to read in this machine's memory",
            f"{size:,} bytes", never="agree")


def _reads(monkeypatch) -> dict[str, list[int]]:
    """The sizes asked of every ``readline`` of each trace file (by name) from now on."""
    from rfrs_ref import files

    asked: dict[str, list[int]] = {}
    real_open = files.open_input

    class Recorded(io.BufferedReader):
        def readline(self, size=-1):
            asked.setdefault(os.path.basename(self.raw.name), []).append(size)
            return super().readline(size)

    def opened(path, *args, **kw):
        with real_open(path, *args, **kw) as fh:  # its checks, then the same file recorded
            raw = io.FileIO(os.dup(fh.fileno()), "rb")
            raw.name = str(path)
            return Recorded(raw)

    monkeypatch.setattr(files, "open_input", opened)
    return asked


def test_a_line_longer_than_a_trace_line_is_refused_unread(ref, tmp_path, refused, monkeypatch):
    """A trace of one line of gigabytes without a line end was read whole (readlines) and
    took all the memory: a line is read at most MAX_LINE_BYTES + 1 bytes far."""
    monkeypatch.setattr(T, "MAX_LINE_BYTES", 4096)
    asked = _reads(monkeypatch)
    long_ = tmp_path / "long.jsonl"
    with open(long_, "wb") as fh:  # a header, then a line of 1 MiB (sparse: NULs) and no end
        fh.write((json.dumps(HEADER) + "\n").encode())
        fh.truncate(fh.tell() + (1 << 20))
    refused(_cli(ref, long_), "long.jsonl:2", "a line of more than 4,096 bytes",
            "a trace is a JSON Lines file", never="agree")
    assert asked["long.jsonl"] == [4097, 4097], asked
    # a line of exactly the limit, its line end included, is read
    lines = _lines()
    pad = 4096 - len(json.dumps(lines[2]) + "\n")
    lines[2]["rule"]["pad"] = "x" * (pad - len(', "pad": ""'))
    exact = _write(tmp_path / "exact.jsonl", lines)
    with open(exact, "rb") as fh:
        assert max(len(x) for x in fh) == 4096
    assert len(T.read_trace(exact).rounds) == 3
    lines[2]["rule"]["pad"] += "x"
    with pytest.raises(T.TraceFormatError, match=r"exact2.jsonl:3: a line of more than 4,096 bytes"):
        T.read_trace(_write(tmp_path / "exact2.jsonl", lines))


def test_a_trace_larger_than_a_trace_may_be_is_refused_unread(ref, tmp_path, refused, monkeypatch):
    """A sparse file of terabytes (or a real one of gigabytes) was read whole before any
    check: refused from its size, before a byte is read."""
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as fh:
        fh.write((json.dumps(HEADER) + "\n").encode())
        fh.truncate(T.MAX_TRACE_BYTES + 1)  # sparse: a few bytes of disk
    asked = _reads(monkeypatch)
    refused(_cli(ref, big), "big.jsonl", f"{T.MAX_TRACE_BYTES + 1:,} bytes",
            f"more than the {T.MAX_TRACE_BYTES:,} bytes a trace may hold", "nothing is read",
            never="agree")
    assert "big.jsonl" not in asked and asked["ref.jsonl"], asked
    # the limit is on the file: a trace of legitimate lines beyond it is refused too
    monkeypatch.setattr(T, "MAX_TRACE_BYTES", 1000)
    refused(_cli(ref, ref), "ref.jsonl", "more than the 1,000 bytes a trace may hold", never="agree")


def test_a_trace_that_grows_past_the_limit_while_read_is_refused(ref, tmp_path, monkeypatch):
    """The size is judged when the file is opened and again on the bytes read: a file
    that grows while it is read stops at the limit."""
    size = os.path.getsize(ref)
    monkeypatch.setattr(T, "MAX_TRACE_BYTES", size)
    assert len(T.read_trace(ref).rounds) == 3  # at the limit: read
    real_fstat = os.fstat
    monkeypatch.setattr(T.os, "fstat", lambda fd: os.stat_result(
        tuple(real_fstat(fd))[:6] + (size // 2,) + tuple(real_fstat(fd))[7:]))
    monkeypatch.setattr(T, "MAX_TRACE_BYTES", size - 1)
    with pytest.raises(T.TraceFormatError, match=r"ref.jsonl:4: [0-9,]+ bytes read by this line, "
                                                 r"more than the [0-9,]+ bytes a trace may hold"):
        T.read_trace(ref)


def test_a_legitimate_trace_reads_as_it_did(ref, tmp_path):
    """Line by line, a trace reads as it did whole: every line and its number, blank
    lines, CRLF line ends, a last line without its line end, and a last line cut short."""
    lines = _lines()
    t = T.read_trace(ref)
    assert [t.header] + t.rounds == lines and t.lines == [1, 2, 3, 4]
    texts = [json.dumps(x) for x in lines]
    odd = tmp_path / "odd.jsonl"
    odd.write_bytes(("\n".join(texts[:2]) + "\n\n  \n" + "\r\n".join(texts[2:])).encode())
    t = T.read_trace(odd)
    assert [t.header] + t.rounds == lines and t.lines == [1, 2, 5, 6]
    assert T.compare(ref, odd).agree
    # "cut short" is said of the last line, not of a damaged line before it
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(("\n".join(texts[:3]) + "\n" + texts[3][:-9]).encode())
    with pytest.raises(T.TraceFormatError, match=r"cut.jsonl:4: .*not valid JSON.*cut short"):
        T.read_trace(cut)
    cut.write_bytes(("\n".join(texts[:2]) + "\n" + texts[2][:-9] + "\n" + texts[3]).encode())
    with pytest.raises(T.TraceFormatError, match=r"cut.jsonl:3: .*not valid JSON") as exc:
        T.read_trace(cut)
    assert "cut short" not in str(exc.value)


def test_a_device_is_not_read_forever(ref, refused):
    refused(_cli(ref, "/dev/zero"), "/dev/zero", "not a regular file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_put_at_the_name_after_its_test_does_not_block(tmp_path):
    """read_trace tests the name, then reads: a FIFO put there in between was opened with a
    plain open(), which waits for a writer for ever. The read itself now refuses it."""
    import subprocess
    import sys

    fifo = tmp_path / "t.jsonl"
    os.mkfifo(fifo)
    code = ("import pathlib\nfrom rfrs_ref import trace as T\n"
            f"try:\n    T._read_trace(pathlib.Path({str(fifo)!r}))\n"
            "except T.TraceFormatError as exc:\n    print(exc)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "not a regular file" in res.stdout, res.stdout + res.stderr


# -- comparisons that compare nothing, or less than they claim ----------------------------------------

def test_two_traces_without_a_round_do_not_agree(tmp_path, refused):
    """Headers only: no round was compared, so 'the traces agree' would claim what nobody checked."""
    a = _write(tmp_path / "a.jsonl", _lines(0))
    b = _write(tmp_path / "b.jsonl", _lines(0))
    msg = refused(_cli(a, b), "no round")
    assert "b.jsonl" in msg
    with pytest.raises(ValueError, match="no round"):
        T.compare(a, b)


def test_a_candidate_without_checksums_is_not_reported_as_checked(ref, tmp_path):
    """B drops every state checksum: the checksums of A are missing in B, as one array would be."""
    lines = _lines()
    for r in lines[1:]:
        del r["state_checksums"]
    res = _cli(ref, _write(tmp_path / "b.jsonl", lines))
    assert res.exit_code == 1 and "round 1, field state_checksums" in res.output, res.output
    assert "missing in B" in res.output
    lines[0]["initial"].pop("state_checksums")
    d = T.compare(ref, _write(tmp_path / "c.jsonl", lines)).divergence
    assert (d.round, d.field, d.reason) == (0, "initial.state_checksums", "missing in B")
    # --no-checksums: the user asked not to compare them, and the report says so
    res = _cli(ref, tmp_path / "c.jsonl", "--no-checksums")
    assert res.exit_code == 0 and "checksums not compared" in res.output, res.output


@pytest.mark.parametrize("field, value", [("clients", [0, 3.000001]), ("n_samples", [3, 4.0000001]),
                                          ("f", 1.0000001), ("f_rule", 1.0000001)])
def test_integer_fields_compare_exactly_even_when_written_as_floats(ref, tmp_path, field, value):
    """Client ids, nᵢ and f are integers: a float in B near A's integer is not within tolerance of
    it (it used to pass with --rtol 1e-6, and any client id ≥ 10⁶ with an offset of 0.5)."""
    lines = _lines()
    lines[2][field] = value
    d = T.compare(ref, _write(tmp_path / "b.jsonl", lines), rtol=0.5).divergence
    assert d is not None and d.round == 2 and d.field.split("[")[0] == field, d
    # the same integer written as a float (another writer's 3.0) is the same value
    lines[2][field] = [float(x) for x in _round(2)[field]] if isinstance(value, list) else 1.0
    assert T.compare(ref, _write(tmp_path / "c.jsonl", lines)).agree


def test_a_large_client_id_off_by_a_half_diverges(tmp_path):
    a, b = _lines(1), _lines(1)
    a[1]["clients"] = [0, 2_000_000]
    b[1]["clients"] = [0, 2_000_000.5]
    d = T.compare(_write(tmp_path / "a.jsonl", a), _write(tmp_path / "b.jsonl", b)).divergence
    assert d is not None and d.field == "clients[1]"


def test_exclusions_without_their_client_and_check_diverge(ref, tmp_path):
    """An exclusion of B that shares no key with A's used to compare nothing and agree."""
    a = _lines()
    a[1]["excluded"] = [{"client": 3, "check": "nonfinite"}]
    pa = _write(tmp_path / "a.jsonl", a)
    for entry, field in [({}, "excluded[0].client"), ({"id": 3, "reason": "nonfinite"}, "excluded[0].client"),
                         ({"client": 3}, "excluded[0].check")]:
        b = copy.deepcopy(a)
        b[1]["excluded"] = [entry]
        d = T.compare(pa, _write(tmp_path / "b.jsonl", b)).divergence
        assert d is not None and (d.round, d.field, d.reason) == (1, field, "missing in B"), (entry, d)


def test_a_null_rule_or_attack_in_one_trace_is_noted(ref, tmp_path):
    """Decision: `rule` and `attack` are optional diagnostics; a null on one side is skipped,
    but with a note, like a field present in one trace only."""
    lines = _lines()
    for r in lines[1:]:
        r["rule"] = None
    res = _cli(ref, _write(tmp_path / "b.jsonl", lines))
    assert res.exit_code == 0 and "note: rule: null in one trace only, not compared" in res.output, res.output


@pytest.mark.parametrize("dup", ['"loss": 0.7, "loss": 0.7', '"round": 1, "round": 2'])
def test_a_line_with_a_duplicate_key_is_refused(ref, tmp_path, dup, refused):
    """JSON readers disagree on which of two equal keys wins: the line is ambiguous."""
    line = json.dumps(_round(1)).replace('"round": 1', dup.split(", ")[0]).replace(
        '"f": 1,', f'"f": 1, {dup.split(", ")[1]},')
    bad = tmp_path / "dup.jsonl"
    bad.write_text(json.dumps(HEADER) + "\n" + line + "\n")
    refused(_cli(ref, bad), "dup.jsonl:2", "duplicate key")


def test_a_lone_surrogate_in_a_key_or_value_is_refused(ref, tmp_path, refused):
    """A key "\\ud800" of B's rule (half a UTF-16 pair, not a character) was listed in a
    note printed to stdout: `trace compare` ended with a UnicodeEncodeError traceback."""
    bad = tmp_path / "b.jsonl"
    line = json.dumps(_round(1)).replace('"rule": {', '"rule": {"\\ud800": 1.0, ', 1)
    bad.write_text(json.dumps(HEADER) + "\n" + line + "\n")
    refused(_cli(ref, bad), "b.jsonl:2", "lone UTF-16 surrogate")


def test_a_bom_and_crlf_line_ends(ref, tmp_path, refused):
    """CRLF line ends are JSON whitespace (judged); a UTF-8 byte order mark is refused by name."""
    text = "".join(json.dumps(x) + "\r\n" for x in _lines())
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(text.encode())
    assert _cli(ref, crlf).exit_code == 0
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    refused(_cli(ref, bom), "bom.jsonl:1", "byte order mark")


@pytest.mark.parametrize("value", ["-1", "1e400", "abc"])
def test_a_negative_or_unreadable_tolerance_is_refused(ref, value):
    res = _cli(ref, ref, "--atol", value)
    assert res.exit_code != 0 and "Traceback" not in res.output and "agree" not in res.output


@pytest.mark.parametrize("rtol", ["1", "1e300"])
def test_a_relative_tolerance_of_one_or_more_is_refused(ref, tmp_path, rtol, refused):
    """With rtol ≥ 1, |0 − A| ≤ rtol·|A|: a trace of zeros agreed with any trace."""
    lines = _lines()
    for r in lines[1:]:
        r["loss"], r["grad_norms"] = 0.0, [0.0, 0.0]
        r["state_norms"] = {"m": 0.0, "theta": 0.0}
    refused(_cli(ref, _write(tmp_path / "zeros.jsonl", lines), "--rtol", rtol, "--no-checksums"),
             "rtol must be < 1")
    assert _cli(ref, ref, "--rtol", "0.99").exit_code == 0


@pytest.mark.parametrize("which", ["round", "initial"])
def test_the_reference_must_record_every_array_of_its_header(tmp_path, which, refused):
    """Two traces whose rounds record no state norm ({}) compared nothing of the state; an
    array missing from B only still diverges (test_a_dropped_state_array_diverges)."""
    lines = _lines()
    if which == "initial":
        lines[0]["initial"]["state_norms"] = {"m": 0.0}
    else:
        for r in lines[1:]:
            r["state_norms"] = {}
    a = _write(tmp_path / "a.jsonl", lines)
    msg = refused(_cli(a, _write(tmp_path / "b.jsonl", lines)), "a.jsonl:", "state_norms lacks")
    assert "theta" in msg and ("initial" in msg if which == "initial" else "round 1" in msg)


def test_state_arrays_must_be_a_list_of_names(ref, tmp_path, refused):
    lines = _lines()
    lines[0]["state_arrays"] = "theta"
    refused(_cli(ref, _write(tmp_path / "b.jsonl", lines)), "b.jsonl:1", "state_arrays must be a list")


def test_an_integer_of_the_reference_compares_exactly_anywhere(ref, tmp_path):
    """A Krum selection of A (JSON integers) against B's floats near them: docs say selections
    compare exactly, and a relative tolerance let 2,000,000.5 stand for client 2,000,000."""
    a, b = _lines(1), _lines(1)
    a[1]["rule"]["selected"] = [2_000_000]
    b[1]["rule"]["selected"] = [2_000_000.5]
    d = T.compare(_write(tmp_path / "a.jsonl", a), _write(tmp_path / "b.jsonl", b)).divergence
    assert d is not None and (d.field, d.reason) == ("rule.selected[0]", "different integers")
    b[1]["rule"]["selected"] = [2_000_000.0]  # the same integer written as a float
    assert T.compare(_write(tmp_path / "a.jsonl", a), _write(tmp_path / "b.jsonl", b)).agree
    # a float of A still compares within the tolerance, whatever B writes
    a[1]["loss"], b[1]["loss"] = 2.0, 2
    assert T.compare(_write(tmp_path / "a.jsonl", a), _write(tmp_path / "b.jsonl", b)).agree


def test_an_exact_field_tells_the_sign_of_zero(tmp_path, refused):
    """The fields compared exactly (round, clients, flags, nᵢ, f, f_rule, excluded) compared
    floats with ==, which calls −0.0 equal to 0.0: a candidate writing f = −0.0 where the
    reference states 0.0 agreed. An integer 0 has no sign and matches either zero; any NaN
    matches any NaN (a NaN of A used to match nothing there)."""
    def cmp(field, va, vb):
        a, b = _lines(1), _lines(1)
        a[1][field], b[1][field] = va, vb
        return T.compare(_write(tmp_path / "a.jsonl", a), _write(tmp_path / "b.jsonl", b))

    for field, va, vb, where in (("f", 0.0, -0.0, "f"), ("f_rule", -0.0, 0.0, "f_rule"),
                                 ("clients", [0.0, 3.0], [-0.0, 3.0], "clients[0]"),
                                 ("n_samples", [3, -0.0], [3, 0.0], "n_samples[1]")):
        d = cmp(field, va, vb).divergence
        assert d is not None and d.field == where and "sign of zero" in d.reason, (field, d)
    # the same zero, an integer zero against either, and NaN against NaN agree
    for field, va, vb in (("f", -0.0, -0.0), ("f", 0, -0.0), ("f", -0.0, 0), ("f", 0.0, 0),
                          ("clients", [0, 3], [-0.0, 3.0]), ("f_rule", math.nan, math.nan)):
        assert cmp(field, va, vb).agree, (field, va, vb)
    # a NaN still differs from every number, on either side
    for va, vb in ((math.nan, 1), (1, math.nan), (math.nan, 1.0), (0.0, math.nan)):
        d = cmp("f", va, vb).divergence
        assert d is not None and d.field == "f" and d.reason == "different integers", (va, vb, d)
    # the report says why on one line
    a, b = _lines(1), _lines(1)
    a[1]["f"], b[1]["f"] = 0.0, -0.0
    res = _cli(_write(tmp_path / "a.jsonl", a), _write(tmp_path / "b.jsonl", b))
    assert res.exit_code == 1 and "field f: A 0.0, B -0.0" in res.output, res.output
    assert "sign of zero differs" in res.output and "traces agree" not in res.output, res.output
    # a float compared under the tolerance is not affected: −0.0 is within it of 0.0
    a[1]["f"], b[1]["f"], a[1]["loss"], b[1]["loss"] = 0, 0, 0.0, -0.0
    assert T.compare(_write(tmp_path / "a.jsonl", a), _write(tmp_path / "b.jsonl", b)).agree


def test_metrics_recorded_by_one_trace_only_are_counted_in_a_note(tmp_path):
    a, b = _lines(2), _lines(2)
    for r in a[1:]:
        r["metrics"] = {"n_users": 5, "precision@5": 0.25}
    res = _cli(_write(tmp_path / "a.jsonl", a), _write(tmp_path / "b.jsonl", b))
    assert res.exit_code == 0 and "note: metrics: recorded by one trace only on 2 round(s)" in res.output, res.output


def test_ignoring_every_field_is_not_an_agreement(ref, tmp_path, refused):
    """`--ignore` of every field but the round numbers compared nothing and said 'agree'."""
    lines = _lines()
    for r in lines[1:]:
        r["clients"], r["loss"] = [7, 8], 99.0
    b = _write(tmp_path / "b.jsonl", lines)
    ignore = [x for f in T.ROUND_FIELDS if f != "round" for x in ("--ignore", f)]
    refused(_cli(ref, b, *ignore), "leaves no field", "3 rounds")
    # with one field left, it is compared (and here diverges)
    res = _cli(ref, b, *[x for f in T.ROUND_FIELDS if f not in ("round", "clients") for x in ("--ignore", f)])
    assert res.exit_code == 1 and "traces diverge" in res.output, res.output
    # --ignore round does not unpair the lines
    res = _cli(ref, ref, "--ignore", "round")
    assert res.exit_code == 0, res.output


# -- the file a run writes its trace to (`rfrs-ref train --trace FILE`) -------------------------------------

TRAIN = ["train", "--dataset", "synthetic", "--synthetic-users", "60", "--synthetic-items", "80",
         "--dim", "8", "--client-fraction", "0.2", "--backend", "numpy", "--rounds", "4",
         "--eval-every", "2", "--checkpoint-every", "2"]


def _train(*args):
    from rfrs_ref.cli.main import main

    return CliRunner().invoke(main, [*TRAIN, *map(str, args)])


def _tracer(tmp_path, path, seed=0, **kw):
    from rfrs_ref.federated.config import TrainConfig
    from rfrs_ref.federated.trainer import Trainer

    cfg = TrainConfig(dataset="synthetic", dataset_params={"n_users": 60, "n_items": 80}, rounds=4,
                      client_fraction=0.2, model_params={"dim": 8}, backend="numpy", seed=seed,
                      trace=True)
    return T.TraceWriter(path, Trainer(cfg), **kw)


def test_two_runs_never_write_one_trace_at_once(tmp_path):
    """The file used to be opened by each run and written by both, lines interleaved."""
    p = tmp_path / "t.jsonl"
    with _tracer(tmp_path, p):
        before = p.read_bytes()
        with pytest.raises(T.TraceRefused, match="being written by another process"):
            _tracer(tmp_path, p, seed=1)
        assert p.read_bytes() == before  # the second never truncated it
    with _tracer(tmp_path, p, seed=1):  # free once the first has closed it
        pass


@pytest.mark.parametrize("text", ["my notes\n", "\nmy notes after a blank line\n",
                                  '{\n  "important": 1\n}\n'])
def test_a_file_that_is_not_a_trace_is_never_overwritten(tmp_path, text, refused):
    p = tmp_path / "notes.txt"
    p.write_text(text)
    refused(_train("--out", tmp_path / "run", "--trace", p), "notes.txt", "not an rfrs-ref trace")
    assert p.read_text() == text
    # nor on --resume, where a header cut short by an interruption may be written afresh:
    # only a line that starts as this writer's headers do counts as one
    run = tmp_path / "r2"
    assert _train("--out", run).exit_code == 0
    (run / "final_metrics.json").unlink()
    (run / "state.npz").unlink()
    from rfrs_ref.cli.main import main

    res = CliRunner().invoke(main, ["train", "--resume", str(run), "--trace", str(p)])
    refused(res, "notes.txt", "not an rfrs-ref trace")
    assert p.read_text() == text


def test_a_finished_run_resumed_with_a_trace_leaves_the_file_alone(tmp_path):
    p = tmp_path / "settings.json"
    p.write_text('{\n  "important": 1\n}\n')
    assert _train("--out", tmp_path / "run").exit_code == 0
    from rfrs_ref.cli.main import main

    res = CliRunner().invoke(main, ["train", "--resume", str(tmp_path / "run"), "--trace", str(p)])
    assert res.exit_code == 0 and "nothing to resume" in res.output, res.output
    assert p.read_text() == '{\n  "important": 1\n}\n'


def test_resume_refuses_the_trace_of_another_run(tmp_path, refused):
    """`--resume A --trace B.jsonl`, B the trace of another run, once kept B's header and
    rounds and appended A's later rounds under it."""
    other = tmp_path / "other.jsonl"
    assert _train("--seed", 7, "--out", tmp_path / "b", "--trace", other).exit_code == 0
    res = _train("--out", tmp_path / "a", "--trace", tmp_path / "a.jsonl")
    assert res.exit_code == 0, res.output
    (tmp_path / "a" / "final_metrics.json").unlink()
    (tmp_path / "a" / "state.npz").unlink()
    before = other.read_bytes()
    from rfrs_ref.cli.main import main

    res = CliRunner().invoke(main, ["train", "--resume", str(tmp_path / "a"), "--trace", str(other)])
    refused(res, "other.jsonl", "trace of another run", "seed 7")
    assert other.read_bytes() == before


@pytest.mark.parametrize("name", ["rounds.jsonl", ".lock", "metrics.csv"])
def test_a_trace_named_like_a_run_file_is_refused_before_anything_is_written(tmp_path, name, refused):
    run = tmp_path / "run"
    refused(_train("--out", run, "--trace", run / name), "--trace", "one of the run's own files")
    assert not run.exists()


def test_a_link_of_another_name_to_a_run_file_is_refused(tmp_path, refused):
    run = tmp_path / "run"
    assert _train("--out", run).exit_code == 0
    (run / "final_metrics.json").unlink()
    (run / "state.npz").unlink()
    link = tmp_path / "lnk.jsonl"
    link.symlink_to(run / "config.json")
    before = (run / "config.json").read_bytes()
    from rfrs_ref.cli.main import main

    res = CliRunner().invoke(main, ["train", "--resume", str(run), "--trace", str(link)])
    refused(res, "one of the run's own files", "config.json")
    assert (run / "config.json").read_bytes() == before


# -- tolerances that check nothing ---------------------------------------------------------------------

def _zeros(tmp_path) -> str:
    lines = _lines()
    for r in lines[1:]:
        r["loss"], r["grad_norms"], r["kept"], r["weights"] = 0.0, [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]
        r["rule"]["scores"] = [0.0, 0.0]
        r["state_norms"] = {"m": 0.0, "theta": 0.0}
    lines[0]["initial"]["state_norms"] = {"m": 0.0, "theta": 0.0}
    return _write(tmp_path / "zeros.jsonl", lines)


@pytest.mark.parametrize("atol", ["1e300", "6", "1e9"])
def test_an_absolute_tolerance_that_accepts_zero_everywhere_is_refused(ref, tmp_path, atol, refused):
    """--atol 1e300 agreed on every float field (only integers and checksums still bit):
    a trace of zeros agreed with the reference. The largest |float| of A is 6 (grad_norms)."""
    line = refused(_cli(ref, _zeros(tmp_path), "--atol", atol, "--no-checksums"),
                   f"--atol {float(atol):g}", "checks nothing", "grad_norms[1]", "round 3")
    assert "agree" not in line.replace("agrees with every", "")


def test_an_absolute_tolerance_just_below_the_largest_reference_value_compares(ref, tmp_path):
    res = _cli(ref, _zeros(tmp_path), "--atol", "5.99", "--no-checksums")
    assert res.exit_code == 1 and "traces diverge at round 3, field grad_norms[1]" in res.output, res.output
    assert _cli(ref, ref, "--atol", "5.99").exit_code == 0


def test_the_vacuous_bound_counts_only_the_values_compared(ref, tmp_path, refused):
    """Ignoring grad_norms leaves 4.5 (state_norms.theta at round 3) as the largest value."""
    refused(_cli(ref, _zeros(tmp_path), "--atol", "5", "--ignore", "grad_norms", "--no-checksums"),
            "--atol 5", "checks nothing", "state_norms.theta", "4.5")
    with pytest.raises(ValueError, match="checks nothing"):
        T.compare(ref, ref, atol=1e300)



@pytest.mark.parametrize("atol", ["30", "100", "200"])
def test_the_vacuous_bound_of_a_state_sum_is_its_value_not_its_scale(tmp_path, atol, refused):
    """A's weighted sum of theta is 5 with Σ|x| = 30: the bound was taken from 7·Σ|x| = 210,
    so --atol 30 to 200 (at or above every value of A compared, 30 the largest) passed the
    check, and a trace of zeros agreed with A."""
    sums = {"m": {"sum": 0.3, "weighted_sum": 0.9, "abs_sum": 0.4, "phase_sum": 0.5},
            "theta": {"sum": 2.0, "weighted_sum": 5.0, "abs_sum": 30.0, "phase_sum": 4.0}}
    lines = _lines()
    for r in lines[1:]:
        r["state_sums"] = copy.deepcopy(sums)
    lines[0]["n_params"] = 1000  # Σ|x| = 30 with ‖x‖₂ = 2.5 needs D ≥ 144 values
    lines[0]["initial"]["state_sums"] = {"m": dict.fromkeys(sums["m"], 0.0),
                                         "theta": {"sum": 1.0, "weighted_sum": 5.0, "abs_sum": 2.0,
                                                   "phase_sum": 3.0}}
    a = _write(tmp_path / "a.jsonl", lines)
    zeros = [json.loads(x) for x in open(_zeros(tmp_path))]
    zeros[0]["n_params"] = 1000
    zeros[0]["initial"]["state_sums"] = {k: dict.fromkeys(v, 0.0) for k, v in sums.items()}
    for r in zeros[1:]:
        r["state_sums"] = {k: {stat: 0.0 for stat in v} for k, v in sums.items()}
    b = _write(tmp_path / "b.jsonl", zeros)
    line = refused(_cli(a, b, "--atol", atol, "--no-checksums"), f"--atol {atol}", "checks nothing",
                   "state_sums.theta.abs_sum", "|A| = 30")
    assert "agree" not in line.replace("agrees with every", "")
    res = _cli(a, b, "--atol", "29.99", "--no-checksums")  # below |A| − rtol·Σ|x|: compared
    assert res.exit_code == 1 and "traces diverge at round 1, field state_sums.theta.abs_sum" in res.output, \
        res.output

def test_the_vacuous_bound_is_over_the_values_compared_not_every_value_of_a(ref, tmp_path, refused):
    """A records Krum scores of 1e7 that B leaves null (rule: null), and B's state norms,
    losses and gradient norms are 0: with --atol 10 the scores, never compared, put the
    bound at 1e7, and the traces 'agreed' though 10 is above every value compared (6)."""
    lines = _lines()
    for r in lines[1:]:
        r["rule"]["scores"] = [1.0, 1e7]
    a = _write(tmp_path / "a.jsonl", lines)
    b = _zeros(tmp_path)
    zeros = [json.loads(x) for x in open(b)]
    for r in zeros[1:]:
        r["rule"] = None
    b = _write(tmp_path / "b.jsonl", zeros)
    line = refused(_cli(a, b, "--atol", "10", "--no-checksums"),
                   "--atol 10", "checks nothing", "grad_norms[1]", "round 3", "|A| = 6")
    assert "1e+07" not in line and "agree" not in line.replace("agrees with every", "")
    # below the largest value compared, the zeros diverge; the scores do not count
    res = _cli(a, b, "--atol", "5.99", "--no-checksums")
    assert res.exit_code == 1 and "traces diverge at round 3, field grad_norms[1]" in res.output, res.output
    # an atol above the scores B leaves out but below what is compared is not refused
    lines2 = copy.deepcopy(lines)
    for r in lines2[1:]:
        r["state_norms"]["theta"] *= 1e9
    lines2[0]["initial"]["state_norms"]["theta"] *= 1e9
    a2 = _write(tmp_path / "a2.jsonl", lines2)
    b2 = copy.deepcopy(lines2)
    for r in b2[1:]:
        r["rule"] = None
    res = _cli(a2, _write(tmp_path / "b2.jsonl", b2), "--atol", "2e7", "--no-checksums")
    assert res.exit_code == 0 and "the traces agree" in res.output, res.output


# -- traces that compare no state, values with nothing to compare to -----------------------------------

def _stateless(norms=None) -> list[dict]:
    """A trace whose header names no state array and whose rounds record no state."""
    lines = _lines()
    lines[0].pop("state_arrays")
    lines[0]["initial"] = {}
    for r in lines[1:]:
        r["state_norms"] = dict(norms or {})
        r.pop("state_checksums")
    return lines


def test_a_nonfinite_state_norm_against_a_reference_without_state_diverges(tmp_path):
    """A with no state arrays and B with state_norms {"m": 1e9, "theta": NaN} 'agreed' with
    a note: the NaN had nothing to be compared with, and no state was compared."""
    a = _write(tmp_path / "a.jsonl", _stateless())
    text = "".join(json.dumps(x) + "\n" for x in _stateless({"m": 1e9, "theta": 12345.0}))
    b = tmp_path / "b.jsonl"
    b.write_text(text.replace("12345.0", "NaN"))
    res = _cli(a, b)
    assert res.exit_code == 1, res.output
    assert "traces diverge at round 1, field state_norms.theta" in res.output, res.output
    assert "nothing to compare it to" in res.output
    assert "the traces agree" not in res.output


@pytest.mark.parametrize("norms", [{}, {"m": 1e9, "theta": 2.0}])
def test_a_comparison_that_compared_no_state_is_refused(tmp_path, norms, refused):
    a = _write(tmp_path / "a.jsonl", _stateless())
    b = _write(tmp_path / "b.jsonl", _stateless(norms))
    refused(_cli(a, b), "no value of the state", "trace A records no state")
    refused(_cli(a, a), "no value of the state")


def test_ignoring_the_whole_state_is_refused(ref, refused):
    refused(_cli(ref, ref, "--ignore", "state_norms", "--ignore", "initial", "--no-checksums"),
            "no value of the state", "--ignore")
    # the initial state alone says where the runs began, not what their rounds trained
    refused(_cli(ref, ref, "--ignore", "state_norms", "--no-checksums"), "no value of the state",
            "compared in 3 of the 3 rounds", "--ignore state_norms and checksums not compared")
    assert _cli(ref, ref, "--ignore", "state_norms").exit_code == 0  # the rounds' checksums remain


def test_a_reference_recording_only_its_initial_state_is_refused(ref, tmp_path, refused):
    """A whose rounds record no state (state_norms {}, no checksums) but whose header has
    its initial checksums 'agreed' ("values and checksums") with a B whose every round's
    state was anything at all: only the initial state had been compared."""
    a = _lines()
    a[0].pop("state_arrays")
    for r in a[1:]:
        r["state_norms"] = {}
        r.pop("state_checksums")
    b = _lines()
    b[0].pop("state_arrays")
    for r in b[1:]:
        r["state_norms"] = {"m": 1e9, "theta": 5e9}
        r["state_checksums"] = {"m": "e" * 64, "theta": "d" * 64}
    refused(_cli(_write(tmp_path / "a.jsonl", a), _write(tmp_path / "b.jsonl", b)),
            "no value of the state", "compared in 3 of the 3 rounds (the first: round 1)",
            "trace A records no state there", never="the traces agree")
    # nor does one round's state stand for the others': A records it in round 1 only
    a[1]["state_norms"] = {"m": 0.1, "theta": 2.5}
    a[1]["state_checksums"] = {"m": "01" * 32, "theta": "cd" * 32}
    b[1]["state_norms"] = {"m": 0.1, "theta": 2.5}
    b[1]["state_checksums"] = {"m": "01" * 32, "theta": "cd" * 32}
    refused(_cli(_write(tmp_path / "a.jsonl", a), _write(tmp_path / "b.jsonl", b)),
            "no value of the state", "compared in 2 of the 3 rounds (the first: round 2)",
            never="the traces agree")


@pytest.mark.parametrize("side", ["A", "B"])
@pytest.mark.parametrize("where", ["state_norms", "rule", "metrics", "resilience"])
def test_a_nonfinite_value_on_one_side_only_diverges(ref, tmp_path, side, where):
    """A key (or a field) that one trace records and the other does not is skipped with a
    note, but a NaN or ±inf in it is no agreement."""
    lines = _lines()
    r = lines[2]
    if where == "state_norms":
        r["state_norms"]["extra"] = 12345.0
        field = "state_norms.extra"
    elif where == "rule":
        r["rule"]["objective"] = 12345.0
        field = "rule.objective"
    else:
        r[where] = {"hr@5": 12345.0}
        field = f"{where}.hr@5"
    text = json.dumps(r).replace("12345.0", "Infinity")
    other = [json.dumps(x) for x in _lines()]
    mine = [json.dumps(x) for x in lines[:2]] + [text] + [json.dumps(x) for x in lines[3:]]
    pa, pb = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    pa.write_text("\n".join(mine if side == "A" else other) + "\n")
    pb.write_text("\n".join(other if side == "A" else mine) + "\n")
    if where == "state_norms" and side == "A":
        pytest.skip("an array of A missing in B already diverges (test_a_dropped_state_array_diverges)")
    res = _cli(pa, pb, "--no-checksums")
    assert res.exit_code == 1 and f"traces diverge at round 2, field {field}" in res.output, res.output
    assert "nothing to compare it to" in res.output
    # a finite value there is skipped with a note, as before
    pa.write_text(pa.read_text().replace("Infinity", "2.5"))
    pb.write_text(pb.read_text().replace("Infinity", "2.5"))
    res = _cli(pa, pb, "--no-checksums")
    assert res.exit_code == 0 and "note:" in res.output, res.output


def test_a_trace_of_another_dataset_is_noted_as_another_run_is(ref, tmp_path):
    """A B whose header says ml100k with 943 users, and seed true where A says 1, agreed
    without a note: the dataset was never looked at, and True == 1 in Python."""
    lines = _lines()
    lines[0]["dataset"] = {"name": "ml100k", "users": 943}
    lines[0]["run"]["seed"] = True
    res = _cli(ref, _write(tmp_path / "b.jsonl", lines))
    assert res.exit_code == 0 and "the traces agree" in res.output, res.output
    assert "the datasets differ in name ('tiny' vs 'ml100k')" in res.output, res.output
    assert "the run configurations differ in seed (1 vs True)" in res.output, res.output
    assert "users" not in res.output  # a key of one header only is no difference


def _consistent_sums(lines):
    """State sums that agree with the synthetic norms (D = 4; ‖m‖ = 0.1t, ‖θ‖ = 1.5 + t, and
    initially ‖m‖ = 0, ‖θ‖ = 1.5)."""
    lines[0]["initial"]["state_sums"] = {
        "m": {"sum": 0.0, "weighted_sum": 0.0, "abs_sum": 0.0, "phase_sum": 0.0},
        "theta": {"sum": 1.0, "weighted_sum": 5.0, "abs_sum": 2.4, "phase_sum": 3.0}}
    for r in lines[1:]:
        t = r["round"]
        r["state_sums"] = {"m": {"sum": 0.05 * t, "weighted_sum": 0.2 * t, "abs_sum": 0.15 * t, "phase_sum": 0.1 * t},
                           "theta": {"sum": 1.0, "weighted_sum": 5.0, "abs_sum": 1.6 * (1.5 + t), "phase_sum": 3.0}}
    return lines


@pytest.mark.parametrize("stat, value, broken", [
    ("abs_sum", 1e30, "Σ|x| ≤ √D·‖x‖₂ = 7"),  # ‖θ‖ = 3.5 with D = 4 values: Σ|x| ≤ 7
    ("abs_sum", 3.0, "Σ|x| ≥ ‖x‖₂ = 3.5"),
    ("abs_sum", -1.0, "Σ|x| ≥ 0"),
    ("sum", 100.0, "Σ|x| ≥ |sum| = 100"),
    ("weighted_sum", -700.0, "Σ|x| ≥ |weighted_sum|/7 = 100"),
    ("phase_sum", 200.0, "Σ|x| ≥ |phase_sum|/2 = 100"),
])
def test_a_reference_whose_sums_contradict_its_own_norms_is_refused(tmp_path, refused, stat, value, broken):
    """A's Σ|x| sets the tolerance of B's sums: with Σ|x| = 1e30 recorded for an array of
    norm 3.5 and 4 values, B's sums agreed within 1e24 whatever they were."""
    a_lines = _consistent_sums(_lines())
    assert _cli(_write(tmp_path / "ok.jsonl", a_lines), _write(tmp_path / "ok2.jsonl", a_lines)).exit_code == 0
    a_lines[2]["state_sums"]["theta"][stat] = value
    a = _write(tmp_path / "a.jsonl", a_lines)
    b_lines = copy.deepcopy(a_lines)  # its round 2 sums of θ are anything A's scale lets through
    b_lines[2]["state_sums"]["theta"].update(
        {k: v for k, v in {"sum": -1e20, "weighted_sum": 3e20, "phase_sum": 1e18}.items() if k != stat})
    b = _write(tmp_path / "b.jsonl", b_lines)
    refused(_cli(a, b, "--no-checksums"), "a.jsonl:3: round 2: state_sums.theta.abs_sum", broken,
            "the trace's own values require")
    with pytest.raises(T.TraceFormatError, match="round 2"):
        T.compare(a, a)


@pytest.mark.parametrize("value", ["null", "NaN", "Infinity"])
@pytest.mark.parametrize("line", [0, 2])
def test_a_reference_whose_sums_are_not_finite_where_its_norm_is_is_refused(tmp_path, refused, value, line):
    """A with every sum of m null (its norms finite) and B with the same nulls and m's sign
    flipped agreed under --no-checksums: a null matched a null, and no sum of m was
    compared. A finite norm bounds every sum, so such a reference is refused."""
    a_lines = _consistent_sums(_lines())
    b_lines = _flip_m(a_lines)
    for lines in (a_lines, b_lines):
        for obj in [lines[0]["initial"]] + lines[1:]:
            obj["state_sums"]["m"] = {k: 12345.0 for k in obj["state_sums"]["m"]}
    a_text = "".join(json.dumps(x) + "\n" for x in a_lines)
    a = tmp_path / "a.jsonl"
    a.write_text(a_text.replace("12345.0", value))
    b = tmp_path / "b.jsonl"
    b.write_text("".join(json.dumps(x) + "\n" for x in b_lines).replace("12345.0", value))
    refused(_cli(a, b, "--no-checksums"), "a.jsonl:1: the header's initial state: state_sums.m.sum is",
            "where state_norms.m = 0.0 is finite", never="agree")
    # one line's sums of θ alone, the others consistent
    a_lines = _consistent_sums(_lines())
    target = a_lines[0]["initial"] if line == 0 else a_lines[line]
    target["state_sums"]["theta"]["weighted_sum"] = 12345.0
    a.write_text("".join(json.dumps(x) + "\n" for x in a_lines).replace("12345.0", value))
    where = "a.jsonl:1: the header's initial state" if line == 0 else f"a.jsonl:{line + 1}: round {line}"
    refused(_cli(a, a, "--no-checksums"), where, "state_sums.theta.weighted_sum is", never="agree")
    # a norm that is not finite bounds nothing: null sums there are the array's
    target["state_norms"]["theta"] = None
    target["state_sums"]["theta"] = {k: None for k in target["state_sums"]["theta"]}
    a.write_text("".join(json.dumps(x) + "\n" for x in a_lines))
    assert "is finite" not in _cli(a, a).output


# -- a reference that switches its own checks off ------------------------------------------------------

@pytest.mark.parametrize("which", ["a", "b"])
@pytest.mark.parametrize("n_params", [pytest.param(10**400, id="1e400"), 4.0, True, 0, -3,
                                      pytest.param(2**40 + 1, id="2**40+1"), "4"])
def test_a_header_whose_parameter_count_is_not_a_count_is_refused(tmp_path, refused, which, n_params):
    """n_params = 10**400 ended the comparison with an OverflowError traceback (D·2⁻⁵³); 4.0
    or 10**60 switched off the check of the reference's sums against its norms."""
    lines = _consistent_sums(_lines())
    bad = copy.deepcopy(lines)
    bad[0]["n_params"] = n_params
    a = _write(tmp_path / "a.jsonl", bad if which == "a" else lines)
    b = _write(tmp_path / "b.jsonl", bad if which == "b" else lines)
    refused(_cli(a, b), f"{which}.jsonl:1", "n_params must be an integer from 1 to 2**40",
            never="agree")


def test_a_reference_with_sums_and_no_parameter_count_is_refused(tmp_path, refused):
    """Without n_params the bound Σ|x| ≤ √D·‖x‖₂ was not checked: A's Σ|x| = 1e30 for a θ of
    norm 3.5 let B's sums of θ be anything."""
    lines = _consistent_sums(_lines())
    del lines[0]["n_params"]
    lines[2]["state_sums"]["theta"]["abs_sum"] = 1e30
    a = _write(tmp_path / "a.jsonl", lines)
    b_lines = copy.deepcopy(lines)
    b_lines[2]["state_sums"]["theta"].update({"sum": -1e20, "weighted_sum": 3e20, "phase_sum": 1e18})
    refused(_cli(a, _write(tmp_path / "b.jsonl", b_lines), "--no-checksums"), "a.jsonl",
            "no n_params", never="agree")
    # without sums, n_params is not needed
    plain = _lines()
    del plain[0]["n_params"]
    p = _write(tmp_path / "plain.jsonl", plain)
    assert _cli(p, p).exit_code == 0


def _flip_m(lines):
    """B: the reference with m's sign flipped everywhere (norms unchanged, sums negated)."""
    out = copy.deepcopy(lines)
    for obj in [out[0]["initial"]] + out[1:]:
        for stat in ("sum", "weighted_sum", "phase_sum"):
            if stat in obj.get("state_sums", {}).get("m", {}):
                obj["state_sums"]["m"][stat] = -obj["state_sums"]["m"][stat]
    return out


@pytest.mark.parametrize("cut", ["only-theta", "empty", "one-round-without", "initial-without"])
def test_a_reference_whose_sums_leave_out_an_array_or_a_line_is_refused(tmp_path, refused, cut):
    """A reference recording the sums of θ only (or {}) let a B whose m is sign-flipped agree,
    without even a note: the norms cannot see a sign flip, and m's sums were compared in
    neither trace."""
    lines = _consistent_sums(_lines())
    a_ok = _write(tmp_path / "ok.jsonl", lines)
    flipped = _write(tmp_path / "flipped.jsonl", _flip_m(lines))
    res = _cli(a_ok, flipped, "--no-checksums")
    assert res.exit_code == 1 and "state_sums.m.sum" in res.output, res.output  # the whole reference sees it
    if cut == "only-theta":
        for obj in [lines[0]["initial"]] + lines[1:]:
            del obj["state_sums"]["m"]
        where = "a.jsonl: the header's initial state: state_sums lacks m"
    elif cut == "empty":
        for obj in [lines[0]["initial"]] + lines[1:]:
            obj["state_sums"] = {}
        where = "state_sums lacks m, theta"
    elif cut == "one-round-without":
        del lines[2]["state_sums"]
        where = "a.jsonl: round 2: no state_sums"
    else:
        del lines[0]["initial"]["state_sums"]
        where = "a.jsonl: the header's initial state: no state_sums"
    a = _write(tmp_path / "a.jsonl", lines)
    refused(_cli(a, flipped, "--no-checksums"), where, never="agree")
    with pytest.raises(T.TraceFormatError):
        T.compare(a, a)


@pytest.mark.parametrize("norm", [[], [1.0], "3.5", True, {"x": 1.0}])
@pytest.mark.parametrize("where", ["initial", "round"])
def test_a_state_norm_that_is_not_a_number_is_refused(tmp_path, refused, norm, where):
    """state_norms.theta = [] passed the format check and counted as a state compared: a
    trace whose norms were all [] 'agreed' with itself having compared no norm."""
    lines = _lines()
    (lines[0]["initial"] if where == "initial" else lines[2])["state_norms"]["theta"] = norm
    a = _write(tmp_path / "a.jsonl", lines)
    refused(_cli(a, a, "--no-checksums"), "a.jsonl:" + ("1" if where == "initial" else "3"),
            "state_norms.'theta' must be a number", never="agree")


@pytest.mark.parametrize("value", [None, float("nan"), float("inf")])
def test_a_state_non_finite_in_both_traces_is_no_state_compared(tmp_path, refused, value):
    """Two traces whose every norm and sum of a round is null (both runs diverged there)
    'agreed' without checksums: null matched null, and counted as a state compared."""
    lines = _consistent_sums(_lines())
    lines[2]["state_norms"] = {"m": value, "theta": value}
    lines[2]["state_sums"] = {k: dict.fromkeys(v, value) for k, v in lines[2]["state_sums"].items()}
    a = _write(tmp_path / "a.jsonl", lines)
    refused(_cli(a, a, "--no-checksums"), "no value of the state", "in round 2",
            "non-finite (null, NaN or ±inf) in both traces", never="traces agree")
    assert _cli(a, a).exit_code == 0  # bit-identical checksums: the same state, whatever it holds
    # one finite norm in the round is a state compared (with its sums: a finite norm bounds them)
    lines[2]["state_norms"]["m"] = 0.2
    lines[2]["state_sums"]["m"] = {"sum": 0.1, "weighted_sum": 0.4, "abs_sum": 0.3, "phase_sum": 0.2}
    a = _write(tmp_path / "a.jsonl", lines)
    assert _cli(a, a, "--no-checksums").exit_code == 0


# -- what the checksums of a line cover -------------------------------------------------------------------

def _without_sums(lines):
    out = copy.deepcopy(lines)
    for obj in [out[0]["initial"]] + out[1:]:
        obj.pop("state_sums", None)
    return out


@pytest.mark.parametrize("how", ["ignore-round", "ignore-all", "no-round-checksums", "theta-only", "empty"])
def test_sums_may_be_left_out_only_where_every_arrays_checksum_is_compared(tmp_path, how):
    """B with m sign-flipped and no state_sums agreed, saying 'values and checksums', when
    --ignore state_checksums (or a reference with no, partial or empty round checksums) left
    the round's checksums uncompared: the line's sums were excused by the headers alone."""
    a_lines = _consistent_sums(_lines())
    b_lines = _without_sums(_flip_m(a_lines))
    for r in b_lines[1:]:
        r["state_checksums"]["m"] = _digest(f"flipped m{r['round']}")  # m's bytes differ
    extra = []
    if how == "ignore-round":
        extra = ["--ignore", "state_checksums"]
    elif how == "ignore-all":
        extra = ["--ignore", "state_checksums", "--ignore", "initial.state_checksums"]
    for r in a_lines[1:]:
        if how == "no-round-checksums":
            del r["state_checksums"]
        elif how == "theta-only":
            del r["state_checksums"]["m"]
        elif how == "empty":
            r["state_checksums"] = {}
    a = _write(tmp_path / "a.jsonl", a_lines)
    res = _cli(a, _write(tmp_path / "b.jsonl", b_lines), *extra)
    assert res.exit_code == 1 and "state_sums" in res.output and "missing in B" in res.output, res.output
    assert "agree:" not in res.output


def test_the_report_claims_checksums_only_when_a_rounds_were_compared(tmp_path):
    """With round checksums ignored, the header's initial checksums made the report say
    'values and checksums'."""
    lines = _consistent_sums(_lines())
    a = _write(tmp_path / "a.jsonl", lines)
    res = _cli(a, a, "--ignore", "state_checksums")
    assert res.exit_code == 0 and "values (checksums not compared)" in res.output, res.output
    assert "checksums not compared in the rounds" in res.output
    assert "values and checksums" in _cli(a, a).output


@pytest.mark.parametrize("field", ["state_checksums", "state_norms", "state_sums"])
def test_ignoring_one_arrays_state_field_is_honoured(tmp_path, field):
    """--ignore state_checksums.m still failed at state_checksums.m 'missing in B': only the
    whole path was looked at."""
    lines = _consistent_sums(_lines())
    a = _write(tmp_path / "a.jsonl", lines)
    b_lines = copy.deepcopy(lines)
    for r in b_lines[1:]:
        del r[field]["m"]
    b = _write(tmp_path / "b.jsonl", b_lines)
    assert _cli(a, b).exit_code == 1
    res = _cli(a, b, "--ignore", f"{field}.m")
    assert res.exit_code == 0, res.output


def test_integer_norms_of_the_reference_are_norms(tmp_path):
    """A writer that prints 0.0 as 0 (JavaScript): the integer norms compared exactly and
    counted as no state, so the comparison was refused as if nothing were compared."""
    lines = _lines()
    for r in lines[1:]:
        r["state_norms"] = {"m": 1, "theta": 2}
    a = _write(tmp_path / "a.jsonl", lines)
    b_lines = copy.deepcopy(lines)
    for r in b_lines[1:]:
        r["state_norms"] = {"m": 1.0000000001, "theta": 2.0}
    res = _cli(a, _write(tmp_path / "b.jsonl", b_lines), "--no-checksums")
    assert res.exit_code == 0 and "the traces agree" in res.output, res.output


def test_a_round_number_written_as_a_float_is_that_round(tmp_path):
    lines = _lines()
    b_lines = copy.deepcopy(lines)
    for r in b_lines[1:]:
        r["round"] = float(r["round"])
    res = _cli(_write(tmp_path / "a.jsonl", lines), _write(tmp_path / "b.jsonl", b_lines))
    assert res.exit_code == 0, res.output
    b_lines[2]["round"] = 2.5
    assert "round 2.5 after round 1" in _cli(_write(tmp_path / "a.jsonl", lines),
                                             _write(tmp_path / "b.jsonl", b_lines)).output


def test_a_megabyte_string_is_shown_cut(tmp_path):
    lines = _lines()
    b_lines = copy.deepcopy(lines)
    b_lines[1]["rule"]["name"] = "x" * 1_000_000
    lines[1]["rule"]["name"] = "krum"
    b_lines[0]["layout"] = "y" * 1_000_000
    res = _cli(_write(tmp_path / "a.jsonl", lines), _write(tmp_path / "b.jsonl", b_lines))
    assert res.exit_code == 1 and "field rule.name" in res.output, res.output[:2000]
    assert max(map(len, res.output.splitlines())) < 1000


def test_an_ignore_path_that_matches_nothing_is_noted(ref):
    res = _cli(ref, ref, "--ignore", "rule.objectiv", "--ignore", "rule.scores")
    assert res.exit_code == 0
    notes = [x for x in res.output.splitlines() if "no field of these traces has this path" in x]
    assert len(notes) == 1 and "rule.objectiv" in notes[0] and "rule.scores" not in notes[0], res.output


def test_the_sums_of_an_array_whose_norm_is_not_finite_set_no_scale(tmp_path):
    """A's θ with a null norm and Σ|x| = 1e30: no bound checks that Σ|x|, and it let B's sum
    of θ be anything within 1e24."""
    lines = _consistent_sums(_lines())
    lines[2]["state_norms"]["theta"] = None
    lines[2]["state_sums"]["theta"].update(abs_sum=1e30, sum=1.0)
    a = _write(tmp_path / "a.jsonl", lines)
    b_lines = copy.deepcopy(lines)
    b_lines[2]["state_sums"]["theta"]["sum"] = 1e20
    res = _cli(a, _write(tmp_path / "b.jsonl", b_lines), "--no-checksums")
    assert res.exit_code == 1 and "round 2, field state_sums.theta.sum" in res.output, res.output


# -- values only one trace records, names that are not one line --------------------------------------

@pytest.mark.parametrize("case", ["B's phase_sum, A's absent", "an array only B sums",
                                  "B's sums, A's absent", "a statistic only B records"])
def test_a_nonfinite_sum_only_the_candidate_records_diverges(tmp_path, case):
    """A NaN in a sum that A does not record has nothing to be compared with: it diverges,
    as any one-sided non-finite value does (it was passed over, with no note)."""
    a_lines, b_lines = _consistent_sums(_lines()), _consistent_sums(_lines())
    if case == "B's phase_sum, A's absent":
        for obj in [a_lines[0]["initial"], *a_lines[1:]]:
            for x in obj["state_sums"].values():
                del x["phase_sum"]
        b_lines[2]["state_sums"]["theta"]["phase_sum"] = float("nan")
        field = "round 2, field state_sums.theta.phase_sum"
    elif case == "an array only B sums":
        b_lines[2]["state_sums"]["v"] = {"sum": float("inf"), "weighted_sum": 1.0, "abs_sum": 1.0}
        field = "round 2, field state_sums.v.sum"
    elif case == "B's sums, A's absent":
        for obj in [a_lines[0]["initial"], *a_lines[1:]]:
            del obj["state_sums"]
        b_lines[2]["state_sums"]["m"]["sum"] = float("nan")
        field = "round 2, field state_sums.m.sum"
    else:
        b_lines[2]["state_sums"]["theta"]["extra"] = float("nan")
        field = "round 2, field state_sums.theta.extra"
    res = _cli(_write(tmp_path / "a.jsonl", a_lines), _write(tmp_path / "b.jsonl", b_lines),
               "--no-checksums")
    assert res.exit_code == 1 and f"traces diverge at {field}" in res.output, res.output
    assert "A has nothing to compare it to" in res.output, res.output


def test_finite_sums_only_the_candidate_records_are_noted(tmp_path):
    a_lines, b_lines = _consistent_sums(_lines()), _consistent_sums(_lines())
    for obj in [b_lines[0]["initial"], *b_lines[1:]]:
        obj["state_sums"]["v"] = {"sum": 1.0, "weighted_sum": 1.0, "abs_sum": 1.0}
    res = _cli(_write(tmp_path / "a.jsonl", a_lines), _write(tmp_path / "b.jsonl", b_lines),
               "--no-checksums")
    assert res.exit_code == 0 and "state_sums: keys present in one trace only, not compared: v" in res.output, \
        res.output


def test_round_fields_the_format_does_not_define_are_compared_like_keys(ref, tmp_path):
    """A field outside the format that both traces write is compared; one that only one
    writes is noted, and diverges if it is not finite (all were passed over in silence)."""
    lines = _lines()
    for r in lines[1:]:
        r["extra"] = 1.0
    a = _write(tmp_path / "a.jsonl", lines)
    assert _cli(a, a).exit_code == 0
    b_lines = copy.deepcopy(lines)
    b_lines[2]["extra"] = 2.0
    res = _cli(a, _write(tmp_path / "b.jsonl", b_lines))
    assert res.exit_code == 1 and "traces diverge at round 2, field extra: A 1.0, B 2.0" in res.output, res.output
    b_lines = _lines()
    b_lines[1]["only_b"] = 3
    res = _cli(ref, _write(tmp_path / "c.jsonl", b_lines))
    assert res.exit_code == 0 and "note: only_b: present in one trace only, not compared" in res.output, res.output
    b_lines[1]["only_b"] = float("nan")
    res = _cli(ref, _write(tmp_path / "d.jsonl", b_lines))
    assert res.exit_code == 1 and "field only_b: A None, B nan" in res.output, res.output


@pytest.mark.parametrize("name", ["x\nthe traces agree: 3 rounds, values and checksums", "y\u2028z",
                                  "r\x1b[31mred", "cr\rlf"])
def test_a_name_with_a_line_break_stays_on_its_line(tmp_path, name):
    """A key of a trace is shown escaped: with a raw newline a divergence report printed a
    forged "the traces agree" line of its own, and a note or an error split in two."""
    a_lines, b_lines = _lines(), _lines()
    a_lines[1]["rule"][name] = 1.0
    b_lines[1]["rule"][name] = 2.0
    res = _cli(_write(tmp_path / "a.jsonl", a_lines), _write(tmp_path / "b.jsonl", b_lines))
    assert res.exit_code == 1 and len(res.output.splitlines()) == 2, res.output
    assert "\x1b" not in res.output and "\r" not in res.output  # no terminal control either
    assert res.output.startswith("traces diverge at round 1, field rule.") and "agree:" not in res.output.splitlines()[1]
    del a_lines[1]["rule"][name]
    res = _cli(_write(tmp_path / "a2.jsonl", a_lines), _write(tmp_path / "b.jsonl", b_lines))
    assert res.exit_code == 0 and len(res.output.splitlines()) == 2, res.output  # a note and the verdict
    lines = _consistent_sums(_lines())
    for obj in [lines[0]["initial"], *lines[1:]]:
        obj["state_norms"][name] = 1.0
        obj["state_sums"][name] = {"sum": 1.0, "weighted_sum": 1.0, "abs_sum": 1e30, "phase_sum": 1.0}
    lines[0]["state_arrays"].append(name)
    a = _write(tmp_path / "c.jsonl", lines)
    res = _cli(a, a)
    assert res.exit_code == 1 and len(res.output.splitlines()) == 1 and "breaks Σ|x|" in res.output, res.output


def test_sums_without_norms_in_the_initial_state_are_refused(tmp_path, refused):
    """The initial state's Σ|x| = 1e30 with no norm to check it against set the tolerance of
    B's initial sums: a B with every array sign-flipped and scaled by 1000 agreed."""
    lines = _consistent_sums(_lines())
    del lines[0]["initial"]["state_norms"]
    del lines[0]["initial"]["state_checksums"]
    refused(_cli(_write(tmp_path / "a.jsonl", lines), _write(tmp_path / "b.jsonl", _consistent_sums(_lines())),
                 "--no-checksums"),
            "a.jsonl: the header's initial state: state_sums without state_norms", never="agree")


@pytest.mark.parametrize("round_", [2**53 + 1, 10**4000], ids=["2**53+1", "10**4000"])
def test_a_round_number_beyond_two_to_the_53_is_refused_in_a_short_line(ref, tmp_path, round_, refused):
    lines = _lines()
    lines[3]["round"] = round_
    line = refused(_cli(ref, _write(tmp_path / "b.jsonl", lines)), "b.jsonl:4: round",
                   "rounds are integers from 1 to 2**53")
    assert len(line) < 400, line


def test_a_digest_written_in_capitals_is_the_same_digest(ref, tmp_path):
    """A sha256 digest is a number in hex: an implementation writing it in capitals (the
    format accepts both cases) computed the same checksum, and was reported as a state
    that differs in at least one bit. A digest that differs still diverges."""
    lines = _lines()
    for obj in [lines[0]["initial"]] + lines[1:]:
        obj["state_checksums"] = {k: v.upper() for k, v in obj["state_checksums"].items()}
    res = _cli(ref, _write(tmp_path / "upper.jsonl", lines))
    assert res.exit_code == 0 and "values and checksums" in res.output, res.output
    lines[2]["state_checksums"]["theta"] = _digest("other").upper()
    d = T.compare(ref, _write(tmp_path / "other.jsonl", lines)).divergence
    assert (d.round, d.field) == (2, "state_checksums.theta") and "checksums differ" in d.reason
