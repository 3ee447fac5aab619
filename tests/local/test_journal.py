"""The journal's file format: records read back in order, a record torn by a crash dropped and
named, damage anywhere else refused with the file named, segments after a snapshot."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from llmtasks_local.emulator import journal
from llmtasks_local.emulator.journal import Journal, StateError
from tests.helpers import eventually

pytestmark = pytest.mark.unit


def written(directory: Path, records: list[object]) -> Journal:
    writer = Journal(directory, next_seq=1)
    for record in records:
        writer.append(record)
    return writer


def test_records_come_back_in_order_with_their_numbers(tmp_path: Path) -> None:
    writer = written(
        tmp_path,
        [("call", "put", {"k": 1, "body": b"\x00\xff"}), ("delete", ["m-1"]), ("received", "m-2", 5)],
    )
    writer.close()

    replay = journal.read(tmp_path)

    # JSON, not pickles: a record's tuples come back as lists, its bytes as bytes
    assert replay.records == [
        (1, ["call", "put", {"k": 1, "body": b"\x00\xff"}]),
        (2, ["delete", ["m-1"]]),
        (3, ["received", "m-2", 5]),
    ]
    assert journal.segments(tmp_path)[0].read_bytes()[16:17] == b"["
    assert replay.torn is None


def test_a_start_reads_only_what_comes_after_its_snapshot(tmp_path: Path) -> None:
    written(tmp_path, ["a", "b", "c", "d"]).close()

    assert [seq for seq, _ in journal.read(tmp_path, after_seq=2).records] == [3, 4]


def test_a_reopened_journal_goes_on_numbering_in_a_new_segment_after_rotation(tmp_path: Path) -> None:
    writer = written(tmp_path, ["a", "b"])
    older = writer.rotate()
    writer.append("c")
    writer.close()

    assert [path.name for path in older] == [journal.segment_name(1)]
    assert [path.name for path in journal.segments(tmp_path)] == [
        journal.segment_name(1),
        journal.segment_name(3),
    ]
    assert [record for _, record in journal.read(tmp_path).records] == ["a", "b", "c"]


def test_rotating_an_empty_segment_keeps_it(tmp_path: Path) -> None:
    writer = written(tmp_path, ["a"])
    writer.rotate()
    assert writer.rotate() == [tmp_path / journal.segment_name(1)]
    writer.append("b")
    writer.close()

    assert [record for _, record in journal.read(tmp_path).records] == ["a", "b"]


@pytest.mark.parametrize("cut", [1, 10, 17])
def test_a_last_record_cut_short_by_a_crash_is_dropped_and_named(tmp_path: Path, cut: int) -> None:
    written(tmp_path, ["kept", "also kept", "torn"]).close()
    segment = journal.segments(tmp_path)[-1]
    whole = segment.read_bytes()
    segment.write_bytes(whole[:-cut])

    replay = journal.read(tmp_path)

    assert [record for _, record in replay.records] == ["kept", "also kept"]
    assert replay.torn is not None
    assert replay.torn.path == segment
    assert replay.torn.dropped_bytes == len(whole) - cut - replay.torn.offset
    assert str(segment) in str(replay.torn)
    assert f"byte {replay.torn.offset}" in str(replay.torn)


def test_a_last_record_whose_bytes_were_garbled_is_dropped_too(tmp_path: Path) -> None:
    written(tmp_path, ["kept", "garbled"]).close()
    segment = journal.segments(tmp_path)[-1]
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF
    segment.write_bytes(bytes(data))

    replay = journal.read(tmp_path)

    assert [record for _, record in replay.records] == ["kept"]
    assert replay.torn is not None


def test_damage_before_the_last_record_stops_the_start_naming_the_file(tmp_path: Path) -> None:
    written(tmp_path, ["first", "second", "third"]).close()
    segment = journal.segments(tmp_path)[-1]
    data = bytearray(segment.read_bytes())
    data[20] ^= 0xFF  # inside the first record's payload
    segment.write_bytes(bytes(data))

    with pytest.raises(StateError) as refused:
        journal.read(tmp_path)

    assert refused.value.path == segment
    assert "damaged at byte 0" in refused.value.what


def test_a_torn_record_in_an_older_segment_is_damage_not_a_crash(tmp_path: Path) -> None:
    writer = written(tmp_path, ["a", "b"])
    writer.rotate()
    writer.append("c")
    writer.close()
    older = journal.segments(tmp_path)[0]
    older.write_bytes(older.read_bytes()[:-3])

    with pytest.raises(StateError) as refused:
        journal.read(tmp_path)

    assert refused.value.path == older


def test_a_missing_segment_is_a_gap_in_the_numbers(tmp_path: Path) -> None:
    writer = written(tmp_path, ["a"])
    writer.rotate()
    writer.append("b")
    writer.rotate()
    writer.append("c")
    writer.close()
    journal.segments(tmp_path)[1].unlink()

    with pytest.raises(StateError, match="skips from record 1 to 3"):
        journal.read(tmp_path)


_FULL_DISK = """
import json, resource, signal, sys
from pathlib import Path
from llmtasks_local.emulator.journal import Journal, JournalUnavailable
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
writer = Journal(Path(sys.argv[1]), next_seq=1)
writer.append("before")
size = writer.path.stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 30, resource.RLIM_INFINITY))  # part of a record fits
try:
    writer.append("refused" * 10)
    refused = None
except JournalUnavailable as error:
    refused = str(error)
said = {"refused": refused, "problem": writer.problem, "size": size}
said["size_after_refusal"] = writer.path.stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
said["seq_after"] = writer.append("after")
said["problem_after"] = writer.problem
writer.close()
print(json.dumps(said))
"""


def test_a_write_the_disk_refuses_is_undone_and_reported_then_the_journal_recovers(tmp_path: Path) -> None:
    # A file size limit (ulimit -f) makes write(2) fail as a full disk does, in a process of its own.
    ran = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    said = json.loads(ran.stdout)

    assert "No space left on device" in said["refused"]  # the write was cut short
    assert said["problem"] == said["refused"]
    assert said["size_after_refusal"] == said["size"]  # the part that fitted was cut off again
    assert said["seq_after"] == 2  # the refused record took no number
    assert said["problem_after"] is None
    assert [record for _, record in journal.read(tmp_path).records] == ["before", "after"]


def test_a_journal_grown_past_its_bound_is_folded_into_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto import mock_aws

    from llmtasks_local.emulator import moto_state

    moto_state.install()
    monkeypatch.setattr(moto_state, "COMPACT_AFTER_BYTES", 4096)
    with mock_aws():
        state = moto_state.DurableState(tmp_path)
        state.open()
        try:
            dynamodb = boto3.client("dynamodb", region_name="us-east-1")
            dynamodb.create_table(
                TableName="tasks",
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST",
            )
            for i in range(100):
                dynamodb.put_item(TableName="tasks", Item={"pk": {"S": f"t{i}"}, "body": {"S": "x" * 100}})
            # The compactor folds in the background (under load, more than once before it catches
            # up): wait until what is left is within the bound, then its segments start after
            # record 1.
            eventually(
                lambda: journal_bytes(tmp_path),
                lambda size: size < 4096 + 1024,
                timeout_s=30,
                what="the journal folded back under its bound",
            )
            assert journal.segments(tmp_path)[0].name != journal.segment_name(1)
        finally:
            state.close()
    with mock_aws():  # an empty endpoint, started again on the state dir
        state = moto_state.DurableState(tmp_path)
        state.open()
        try:
            items = boto3.client("dynamodb", region_name="us-east-1").scan(TableName="tasks")["Items"]
        finally:
            state.close()
    assert len(items) == 100


def journal_bytes(directory: Path) -> int:
    """The journal's size now; a segment the compactor removes between the listing and its
    stat counts as gone."""
    size = 0
    for path in journal.segments(directory):
        with contextlib.suppress(FileNotFoundError):
            size += path.stat().st_size
    return size
