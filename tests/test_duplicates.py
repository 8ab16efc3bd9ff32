"""The same picture under two names: reported at conversion (summary, manifest, inspect,
duplicates.jsonl), removed with --dedupe, and checked by verify either way."""

import dataclasses
import json

import pytest

from beam_jobs import convert, duplicates
from tfrecord_pipe._core import images, manifest, naming
from tfrecord_pipe._reading import dataset
from tfrecord_pipe._tools import verify_rules

from helpers import IN_PROCESS, jpeg_bytes, run_cli, verified_both_ways

pytestmark = pytest.mark.slow  # each test runs the conversion job


def write(path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.fixture
def leaky(tmp_path):
    """Split folders where one picture is in train and validation (under two labels too),
    one is twice in train/cat, and the rest are distinct."""
    src = tmp_path / "src"
    leaked, twice = jpeg_bytes(9, 9, (10, 200, 10)), jpeg_bytes(11, 7, (200, 10, 10))
    write(src / "train" / "cat" / "leaked.jpg", leaked)
    write(src / "validation" / "dog" / "leaked_too.jpg", leaked)
    write(src / "train" / "cat" / "b.jpg", twice)
    write(src / "train" / "cat" / "a.jpg", twice)
    for i in range(3):
        write(src / "train" / "dog" / f"{i}.jpg", jpeg_bytes(8 + i, 8, (0, 0, 250)))
        write(src / "validation" / "cat" / f"{i}.jpg", jpeg_bytes(8 + i, 9, (250, 250, 0)))
    return src


def groups_in(out) -> list[dict]:
    return [json.loads(line) for line in (out / naming.DUPLICATES_NAME).open()]


def test_duplicates_are_reported_cross_split_first_and_all_kept(leaky, tmp_path, capsys):
    out = tmp_path / "out"
    result = convert.run([str(leaky), str(out), *IN_PROCESS])
    assert result.splits["train"].num_examples == 6 and result.num_rejected == 0
    assert result.duplicates == {"groups": 2, "copies": 2, "cross_split_groups": 1,
                                 "cross_label_groups": 1}  # fmt: skip
    assert "WARNING: 2 picture(s) found under more than one name" in capsys.readouterr().out
    first, second = groups_in(out)
    assert first["cross_split"] and first["cross_label"]
    assert [(f["relpath"], f["split"], f["label"]) for f in first["files"]] == [
        ("train/cat/leaked.jpg", "train", "cat"),
        ("validation/dog/leaked_too.jpg", "validation", "dog"),
    ]  # fmt: skip
    assert [f["relpath"] for f in second["files"]] == ["train/cat/a.jpg", "train/cat/b.jpg"]
    inspected = run_cli("inspect", out)
    assert "WARNING: 2 picture(s)" in inspected.stdout and "1 across splits" in inspected.stdout
    assert run_cli("verify", leaky, out).returncode == 0


def test_dedupe_keeps_the_first_by_path_and_rejects_the_others(leaky, tmp_path):
    out = tmp_path / "out"
    result = convert.run([str(leaky), str(out), "--dedupe", *IN_PROCESS])
    assert result.rejected_reasons == {images.DUPLICATE_CONTENT: 2}
    lines = [json.loads(line) for f in sorted(out.glob("rejected/*.jsonl")) for line in f.open()]
    assert sorted((line["relpath"], line["split"]) for line in lines) == [
        ("train/cat/b.jpg", "train"), ("validation/dog/leaked_too.jpg", "validation")
    ]  # fmt: skip
    assert all("train/cat/a.jpg" in line["error"] or "train/cat/leaked.jpg" in line["error"] for line in lines)
    assert len(groups_in(out)) == 2  # what was removed stays on record
    assert run_cli("verify", leaky, out).returncode == 0
    # A picture added later that repeats a kept one: verify says the dataset is out of date.
    write(leaky / "train" / "cat" / "0.jpg", jpeg_bytes(11, 7, (200, 10, 10)))
    report = verified_both_ways(leaky, out)  # the Beam pipeline finds the same
    assert not report.ok and any("duplicates.jsonl" in p for p in report.problems)
    assert "train/cat/a.jpg: the same bytes as train/cat/0.jpg, yet stored (--dedupe)" in (
        report.problems
    )


def test_verify_finds_a_report_that_no_longer_matches(leaky, tmp_path):
    out = tmp_path / "out"
    convert.run([str(leaky), str(out), *IN_PROCESS])
    (out / naming.DUPLICATES_NAME).write_text(
        (out / naming.DUPLICATES_NAME).read_text().splitlines()[0] + "\n"
    )
    report = verified_both_ways(leaky, out)  # the Beam pipeline finds the same
    assert not report.ok
    assert any("train/cat/a.jpg (2) are not listed as one group" in p for p in report.problems)
    # A group whose files differ now: found both ways too.
    (leaky / "validation" / "dog" / "leaked_too.jpg").write_bytes(jpeg_bytes(12, 7))
    report = verified_both_ways(leaky, out)
    assert "duplicates.jsonl: lists train/cat/leaked.jpg and others, which differ now" in (
        report.problems
    )
    # Put back, for the overwrite below.
    (leaky / "validation" / "dog" / "leaked_too.jpg").write_bytes(
        (leaky / "train" / "cat" / "leaked.jpg").read_bytes()
    )
    # Replaced by a dataset without duplicates: the old report goes with the old dataset.
    (leaky / "train" / "cat" / "b.jpg").unlink()
    (leaky / "validation" / "dog" / "leaked_too.jpg").unlink()
    assert convert.run([str(leaky), str(out), "--overwrite", *IN_PROCESS]).duplicates == {}
    assert not (out / naming.DUPLICATES_NAME).exists()
    assert run_cli("verify", leaky, out).returncode == 0


def test_verify_finds_a_report_or_a_rejection_edited_to_hide_a_leak(leaky, tmp_path):
    # duplicates.jsonl's splits and labels, and a --dedupe copy's split in rejected/, were
    # taken as written: a leak across splits could be edited out of the report, and verify
    # said OK.
    out = tmp_path / "out"
    convert.run([str(leaky), str(out), *IN_PROCESS])
    lines = (out / naming.DUPLICATES_NAME).read_text().splitlines()
    leak = json.loads(lines[0])
    leak["files"][1]["split"], leak["cross_split"] = "train", False
    (out / naming.DUPLICATES_NAME).write_text("\n".join([json.dumps(leak), *lines[1:]]) + "\n")
    report = verified_both_ways(leaky, out)
    assert report.problems == ("duplicates.jsonl: the group of train/cat/leaked.jpg gives other "
                               "splits or labels than its inputs have (edited?)",)  # fmt: skip
    # The manifest's counts of copies and of groups across labels went unchecked, and inspect
    # warned of what the edit made up (a helper's trial).
    (out / naming.DUPLICATES_NAME).write_text("\n".join(lines) + "\n")  # as written
    found = dataset.read_manifest(str(out))
    copies, across = found.duplicates["copies"], found.duplicates["cross_label_groups"]
    edited = {**found.duplicates, "copies": copies + 3, "cross_label_groups": across + 1}
    dataset.write_manifest(str(out), dataclasses.replace(found, duplicates=edited))
    report = verified_both_ways(leaky, out)
    assert report.problems == (
        f"manifest.json's duplicate counts are not the sources': copies {copies + 3} (the "
        f"sources: {copies}); cross_label_groups {across + 1} (the sources: {across})",)
    # A file a CSV list names in train and validation, the copy --dedupe drops in both.
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes(9, 9, (10, 200, 10)))
    (tmp_path / "b.jpg").write_bytes(jpeg_bytes(9, 9, (10, 200, 10)))
    (tmp_path / "c.jpg").write_bytes(jpeg_bytes(9, 9, (200, 10, 10)))
    listed = tmp_path / "list.csv"
    listed.write_text("a.jpg,x,train\nb.jpg,x,train\nb.jpg,x,validation\nc.jpg,y,validation\n")
    out = tmp_path / "csv"
    convert.run([str(listed), str(out), "--dedupe", *IN_PROCESS])
    assert verified_both_ways(listed, out).ok
    rejected = out / "rejected" / "rejected-train.jsonl"
    [line] = [json.loads(text) for text in rejected.read_text().splitlines()]
    assert (line["relpath"], line["reason"]) == ("b.jpg", images.DUPLICATE_CONTENT)
    rejected.write_text(json.dumps({**line, "split": "validation"}) + "\n")
    report = verified_both_ways(listed, out)
    assert report.problems == ("b.jpg: rejected in split validation, but listed in train",)


def test_an_older_version_claimed_does_not_hide_an_edited_report():
    # duplicates.jsonl was checked only where the manifest's version counted duplicates (0.3
    # on): a manifest edited to say 0.2 hid a leak edited out of the report.
    old = manifest.Manifest(labels=("x",), label_offset=1, compression="", splits={},
                            tool_version="0.2.0")  # fmt: skip
    group = [{"relpath": "a.jpg", "split": "train", "label": "x", "became": "record"},
             {"relpath": "b.jpg", "split": "validation", "label": "x", "became": "record"}]
    line = duplicates.report_row("s", [("a.jpg", "train", "x"), ("b.jpg", "train", "x")])
    problems, counts = verify_rules.check_content(group, [line], old)
    assert problems == ["duplicates.jsonl: the group of a.jpg gives other splits or labels "
                        "than its inputs have (edited?)"]  # fmt: skip
    assert counts == {"groups": 1, "copies": 1, "cross_split_groups": 1, "cross_label_groups": 0}
    assert verify_rules.check_content(group, [], old)[0] == []  # 0.2 wrote no report
    # Nor does a manifest say an older version wrote what only a newer one writes.
    info = manifest.SplitInfo(1, (1,), 10, 1, 0, ("train-00000-of-00001.tfrecord",),
                              label_counts=(1,))  # fmt: skip
    claims = (("0.4.0", {"splits": {"train": info}}, "label_counts"),
              ("0.2.0", {"duplicates": {"groups": 1}}, "duplicates"))  # fmt: skip
    for version, fields, says in claims:
        with pytest.raises(ValueError, match=f"it holds {says}, which the tfrecord-pipe it names "
                                             rf"\(tool_version '{version}'\) does not write"):
            manifest.Manifest(**{"labels": ("x",), "label_offset": 1, "compression": "",
                                 "splits": {}, "tool_version": version, **fields})  # fmt: skip
