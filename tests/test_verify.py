"""`tfrecord-pipe verify SRC OUT`: proves nothing was lost or changed, and finds what was."""

import dataclasses
import errno
import hashlib
import json
import os
import pathlib
import random
import shutil
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from beam_jobs import convert, duplicates, record_reader, shard_plan, sources, spill
from tfrecord_pipe._core import manifest, schema
from tfrecord_pipe._reading import dataset
from tfrecord_pipe._tools import verify, verify_beside, verify_join, verify_reading, verify_rules

from helpers import (
    COLOURS,
    IN_PROCESS,
    encode,
    jpeg_bytes,
    length_delimited,
    run_cli,
    run_command,
    run_python,
    verified_both_ways,
    with_label_added,
    write_image_folder,
)  # fmt: skip


def test_verify_passes_on_an_untouched_conversion(converted):
    src, out = converted
    done = run_cli("verify", src, out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "16 sources listed; 15 records in the shards; 1 rejected" in done.stdout
    assert done.stdout.strip().endswith("OK")


def rewrite_shard(path: pathlib.Path, change) -> None:
    """Rewrites a shard with `change(list of serialized records)` applied (valid CRCs)."""
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in change(records):
            writer.write(record)


def first_shard(out: pathlib.Path) -> pathlib.Path:
    return out / dataset.read_manifest(str(out)).splits["train"].files[0]


def test_verify_catches_a_deleted_shard(converted_copy):
    src, out = converted_copy
    first_shard(out).unlink()
    done = run_cli("verify", src, out)
    assert done.returncode == 1
    assert "is missing (the manifest lists" in done.stdout
    assert "in no shard and not in rejected/ (lost, or added to the source since)" in done.stdout


def test_verify_catches_a_duplicated_record(converted_copy):
    src, out = converted_copy
    rewrite_shard(first_shard(out), lambda records: records + records[:1])
    done = run_cli("verify", src, out)
    assert done.returncode == 1
    assert "written 2 times" in done.stdout


def test_verify_catches_a_modified_record(converted_copy):
    src, out = converted_copy

    def repaint(records):
        record = schema.decode_example(records[0], label_offset=1)
        changed = schema.ImageRecord(
            **{**record.__dict__, "encoded": jpeg_bytes(record.width, record.height, (1, 2, 3))}
        )
        return [schema.serialize(changed, label_offset=1)] + records[1:]

    rewrite_shard(first_shard(out), repaint)
    done = run_cli("verify", src, out)
    assert done.returncode == 1
    assert "(modified record)" in done.stdout


def test_verify_catches_one_byte_changed_in_a_records_image(converted_copy):
    # The image the same length, its record's framing rewritten to match: only its bytes
    # say so (verify compares them with its source's, or their hashes).
    src, out = converted_copy

    def flip(records):
        record = schema.decode_example(records[0], label_offset=1)
        image = bytearray(record.encoded)
        image[len(image) // 2] ^= 0x01
        changed = dataclasses.replace(record, encoded=bytes(image))
        return [schema.serialize(changed, label_offset=1)] + records[1:]

    rewrite_shard(first_shard(out), flip)
    report = verified_both_ways(src, out)
    assert report.num_problems == 1 and "(modified record)" in report.problems[0], report


def test_verify_catches_a_record_with_its_values_in_another_layout(converted_copy):
    # The same values, its entries in another order: TensorFlow reads the same record, but
    # the bytes are not the converter's (verify proves bytes, not values).
    src, out = converted_copy

    def reorder(records):
        _, start = schema._read_varint(memoryview(records[0]), 1)
        entries = [length_delimited(1, bytes(value))
                   for _, _, value in schema._fields(memoryview(records[0])[start:])]
        body = b"".join(reversed(entries))
        moved = length_delimited(1, body)
        assert schema.decode_example(moved, label_offset=1) == schema.decode_example(
            records[0], label_offset=1)  # fmt: skip
        return [moved] + records[1:]

    rewrite_shard(first_shard(out), reorder)
    report = verified_both_ways(src, out)
    assert report.num_problems == 1, report
    assert "bytes are not what the converter writes for this source (modified record)" in (
        report.problems[0])  # fmt: skip


def test_verify_judges_a_record_as_tensorflow_parses_it(converted_copy):
    # A label feature holding a bytes list and then the right int64 list: protobuf's rules
    # (ours, then) kept the last list, TensorFlow's parser refuses the record, and the reader
    # stopped on it with an error naming no file, while verify said OK. Our parser now reads
    # as TensorFlow's does (tests/test_schema.py compares them).
    src, out = converted_copy

    def craft(records):
        record = schema.decode_example(records[0], label_offset=1)
        lists = (length_delimited(1, length_delimited(1, b"x"))
                 + length_delimited(3, length_delimited(1, bytes([record.label_index + 1]))))
        entry = length_delimited(1, schema.LABEL.encode()) + length_delimited(2, lists)
        return [records[0] + length_delimited(1, length_delimited(1, entry))] + records[1:]

    rewrite_shard(first_shard(out), craft)
    done = run_cli("verify", src, out)
    assert done.returncode == 1
    assert f"{schema.LABEL} holds 1 bytes_list values, expected one int64_list" in done.stdout


def test_verify_catches_a_source_in_neither_shards_nor_rejected(converted_copy):
    src, out = converted_copy
    (src / "green" / "999.jpg").write_bytes(jpeg_bytes(9, 9, (0, 250, 0)))  # never converted
    done = run_cli("verify", src, out)
    assert done.returncode == 1
    lost = "green/999.jpg: listed but in no shard and not in rejected/ (lost, or added to the"
    assert f"{lost} source since)" in done.stdout
    # A page of such lines where another folder is given: the one that explains them.
    converted_from = dataset.read_manifest(str(out)).conversion["source"]
    assert done.stdout.rstrip().endswith(f"The manifest says this dataset was converted from "
                                         f"{converted_from}: is that the folder meant?")  # fmt: skip


def test_records_cut_into_shards_otherwise_than_the_converter_cuts_them_are_a_problem(
    converted,
):
    # A helper moved records between shards and made the manifest agree: verify said OK,
    # since the records' order was checked against the manifest's own shard lengths.
    found = dataset.read_manifest(str(converted[1]))
    assert verify_rules.shard_cut_problems(found) == []
    train = found.splits["train"]
    assert train.shard_lengths == (5, 5) and found.conversion["num_shards"] == 2

    def forged(*lengths):
        files = tuple(f"train-{i:05d}-of-{len(lengths):05d}.tfrecord" for i in range(len(lengths)))
        cut = dataclasses.replace(train, shard_lengths=lengths, files=files, file_bytes=(),
                                  shard_digests=())  # fmt: skip
        return dataclasses.replace(found, splits={**found.splits, "train": cut})

    assert verify_rules.shard_cut_problems(forged(4, 6)) == [
        "split train: its shards hold [4, 6] records; the converter cuts 10 into 2 shards as "
        "[5, 5]"]  # fmt: skip
    config = verify_reading.source_config(str(converted[0]), str(converted[1]), found)
    assert verify_rules.shard_count_problems(forged(4, 3, 3), config, {}) == [
        "split train: 3 shards, where --num_shards 2 gives 2 (the manifest edited, or shards "
        "added or removed?)"]  # fmt: skip


def test_verify_counts_the_shards_the_bytes_of_the_records_need(tmp_path):
    # Without --num_shards a split's shard count went unchecked (a helper's trial). It is the
    # least multiple of 64 of shards of at most --shard_mb, records allowing: verify counts
    # the records' bytes as the converter sized them. At --shard_mb just below 1/64 of them,
    # 65 shards' worth: 72 (the records allow no more); at 1/64 of them, 64.
    src = write_image_folder(tmp_path / "src", per_label=24)  # JPEGs stored as they are
    planned = sum(shard_plan.record_size(path.stat().st_size, f"{path.parent.name}/{path.name}",
                                         path.parent.name)
                  for path in src.glob("*/*.jpg"))  # fmt: skip
    least = -(-planned // 64)  # bytes a shard, for 64 of them
    for shard_bytes, shards in ((least - 1, 72), (least, 64)):
        out = tmp_path / str(shards)
        convert.run([str(src), str(out), "--shard_mb", str(shard_bytes / (1 << 20)), *IN_PROCESS])
        assert len(dataset.read_manifest(str(out)).splits["train"].shard_lengths) == shards
        assert verify.verify(str(src), str(out)).ok
    found = dataset.read_manifest(str(out))  # 64 shards, said to be of least - 1 bytes
    dataset.write_manifest(str(out), dataclasses.replace(
        found, conversion={**found.conversion, "shard_bytes": least - 1}))  # fmt: skip
    report = verified_both_ways(src, out)
    assert report.problems == (
        f"split train: 64 shards, where the converter makes 72 for 72 records of "
        f"{planned / 2**20:,.1f} MiB at most {(least - 1) / 2**20:g} MiB a shard, in a multiple "
        "of 64 (the manifest edited, or shards added or removed?)",)  # fmt: skip
    # Converters before 0.5 (manifests without shard_digests) sized shards otherwise.
    config = verify_reading.source_config(str(src), str(out), dataset.read_manifest(str(out)))
    before = {name: dataclasses.replace(info, shard_digests=()) for name, info in found.splits.items()}
    assert verify_rules.shard_count_problems(dataclasses.replace(found, splits=before), config,
                                             {"train": planned}) == []  # fmt: skip


def test_the_source_a_dataset_was_converted_from_is_told_only_where_another_is_given(
    converted, tmp_path, monkeypatch
):
    found = dataset.read_manifest(str(converted[1]))
    found = dataclasses.replace(found, conversion={**found.conversion, "source": "photos/"})
    monkeypatch.chdir(tmp_path)
    # A relative path was relative to where convert ran: any folder of that name may be it.
    for same in ("photos", "photos/", str(tmp_path / "photos"), "/elsewhere/photos/"):
        assert verify_rules.converted_from(found, same) == ""
    for other in ("sp", "gs://b/photos", "/elsewhere/myphotos"):
        assert verify_rules.converted_from(found, other) == "photos/"
    found = dataclasses.replace(found, conversion={**found.conversion, "source": "/data/photos"})
    assert verify_rules.converted_from(found, "/data/photos/") == ""
    assert verify_rules.converted_from(found, "/elsewhere/photos") == "/data/photos"


def test_verify_redoes_the_conversion_with_its_recorded_configuration(tmp_path):
    # Images above --max_side are stored downscaled: verify must redo that from the manifest,
    # not from today's defaults, or every record would look modified.
    src = tmp_path / "src"
    (src / "red").mkdir(parents=True)
    (src / "red" / "big.jpg").write_bytes(jpeg_bytes(64, 48, COLOURS["red"]))
    out = tmp_path / "out"
    convert.run([str(src), str(out), "--max_side", "32", "--jpeg_quality", "70", *IN_PROCESS])
    recorded = dataset.read_manifest(str(out)).conversion
    assert recorded["policy"]["max_side"] == 32 and recorded["policy"]["jpeg_quality"] == 70
    done = run_cli("verify", src, out)
    assert done.returncode == 0, done.stdout + done.stderr


def test_verify_a_folder_that_is_not_a_dataset_exits_2(converted):
    src, out = converted
    done = run_cli("verify", src, src)
    assert done.returncode == 2
    assert "not a finished tfrecord-pipe dataset" in done.stderr
    done = run_cli("verify", src, f"{out}/train-*")  # a pattern, as the reader takes
    assert done.returncode == 2
    assert f"{out}/train-* is a pattern of files: give the dataset folder" in done.stderr
    shard = next(out.glob("train-*"))  # it said "<shard>/manifest.json not found"
    done = run_cli("verify", src, shard)
    assert done.returncode == 2 and done.errors == [
        f"error: {shard} is a file: give the dataset folder, the one holding manifest.json."]
    for args in (("", out), (src, "")):  # it said "error:  does not exist."
        assert run_cli("verify", *args).errors == [
            "error: A path given is empty (''): give a folder, local or gs://."]
    done = run_cli("verify", out, src)  # the dataset first: a new user's slip
    assert done.returncode == 2
    assert f"{src} is not a dataset but {out} is: the arguments look swapped" in done.stderr
    (src / "manifest.json").write_text("{}")  # another tool's file of that name: no hint
    try:
        done = run_cli("verify", src, src / "red")
        assert done.returncode == 2 and "look swapped" not in done.stderr, done.stderr
        assert "not a finished tfrecord-pipe dataset" in done.stderr, done.stderr
    finally:
        (src / "manifest.json").unlink()


def test_convert_given_a_dataset_for_its_images_says_so_and_what_it_was_made_from(
    converted, tmp_path
):
    # Every file of the dataset was rejected `no_label`, and the error said only that.
    src, out = converted
    done = run_cli("convert", out, tmp_path / "new")
    assert done.returncode == 2, done.stderr
    assert f"{out} is a dataset (its manifest.json), not a folder of images" in done.stderr
    assert f"it was converted from {src}." in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "new").exists()


def test_verify_a_dataset_that_does_not_record_its_conversion_exits_2(converted_copy):
    src, out = converted_copy
    found = dataset.read_manifest(str(out))
    dataset.write_manifest(str(out), dataclasses.replace(found, conversion={}))
    done = run_cli("verify", src, out)
    assert done.returncode == 2
    assert "does not record how it was converted" in done.errors[0]


def test_verify_reads_the_flags_that_manifests_of_version_0_1_recorded(converted_copy):
    src, out = converted_copy
    manifest_path = out / "manifest.json"
    written = json.loads(manifest_path.read_text())
    del written["conversion"]
    written["options"] = {  # what 0.1 wrote: the command line's arguments
        "source": str(src), "output": str(out), "layout": "auto", "validation_fraction": 0.3,
        "labels_file": None, "label_offset": 1, "num_shards": 2, "shard_mb": 128.0,
        "max_side": None, "max_pixels": 100000000, "jpeg_quality": 95,
        "reject_other_formats": False, "compress": False, "overwrite": False,
    }  # fmt: skip
    manifest_path.write_text(json.dumps(written))
    done = run_cli("verify", src, out)
    assert done.returncode == 0, done.stdout + done.stderr


def test_verify_a_csv_conversion_with_a_duplicate_line_and_a_missing_file(tmp_path):
    (tmp_path / "imgs").mkdir()
    lines = ["path,label,split"]
    for i, label in enumerate(("blue", "green", "red")):
        (tmp_path / "imgs" / f"{i}.jpg").write_bytes(jpeg_bytes(9, 9, COLOURS[label]))
        lines.append(f"imgs/{i}.jpg,{label},train")
    lines += ["imgs/0.jpg,green,validation", "imgs/missing.jpg,red,train"]
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    convert.run([str(tmp_path / "list.csv"), str(tmp_path / "out"), *IN_PROCESS])
    done = run_cli("verify", tmp_path / "list.csv", tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 sources listed; 3 records in the shards; 2 rejected" in done.stdout
    # The images' folder given instead of the list: said, with the list's name.
    done = run_cli("verify", tmp_path / "imgs", tmp_path / "out")
    assert done.returncode == 2
    assert f"converted from the CSV list {tmp_path / 'list.csv'}: give that file" in done.stderr
    done = run_cli("convert", tmp_path / "imgs", tmp_path / "again", "--layout", "csv")
    assert done.returncode == 2 and "is a folder, not a CSV list" in done.stderr


@pytest.mark.parametrize("twice", ["a", "b"], ids=["the-copy-kept", "the-copy-deduped"])
@pytest.mark.parametrize("dedupe", [[], ["--dedupe"]], ids=["all-kept", "deduped"])
@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_verify_a_csv_naming_a_file_twice_that_has_a_copy_under_another_name(
    tmp_path, dedupe, twice
):
    # The file named twice was left out of its content's group, and verify failed the
    # untouched dataset: "counts 1 duplicate groups; the sources have 0"; with --dedupe
    # rejecting it (b.jpg: a.jpg is first by path), "in rejected/ (duplicate_content), but
    # the converter would store it now".
    for name in ("a", "b"):
        (tmp_path / f"{name}.jpg").write_bytes(jpeg_bytes(9, 9, COLOURS["red"]))
    (tmp_path / "c.jpg").write_bytes(jpeg_bytes(9, 9, COLOURS["blue"]))
    other = "b" if twice == "a" else "a"
    (tmp_path / "list.csv").write_text(f"{twice}.jpg,x\n{twice}.jpg,x\n{other}.jpg,y\nc.jpg,y\n")
    found = convert.run([str(tmp_path / "list.csv"), str(tmp_path / "out"), *dedupe, *IN_PROCESS])
    assert found.duplicates["groups"] == 1
    report = verified_both_ways(tmp_path / "list.csv", tmp_path / "out")
    assert report.ok and (report.sources, report.rejected) == (4, 1 + len(dedupe)), report


def test_verify_catches_records_that_changed_split(converted_copy):
    # A train record and a validation record swapped places, counts untouched: it used to
    # say OK.
    src, out = converted_copy
    splits = dataset.read_manifest(str(out)).splits
    train, validation = (out / splits[name].files[0] for name in ("train", "validation"))
    train_records = [r.numpy() for r in tf.data.TFRecordDataset(str(train))]
    validation_records = [r.numpy() for r in tf.data.TFRecordDataset(str(validation))]
    rewrite_shard(train, lambda records: validation_records[:1] + records[1:])
    rewrite_shard(validation, lambda records: train_records[:1] + records[1:])
    done = run_cli("verify", src, out)
    assert done.returncode == 1
    assert "in split validation, but listed in train" in done.stdout
    assert "in split train, but listed in validation" in done.stdout


def test_verify_catches_a_good_source_moved_into_rejected(converted_copy):
    # The record removed, a rejection line written, every count kept consistent: it used to
    # say OK.
    src, out = converted_copy
    found = dataset.read_manifest(str(out))
    shard = out / found.splits["train"].files[0]
    record = schema.decode_example(
        next(iter(tf.data.TFRecordDataset(str(shard)))).numpy(), label_offset=1
    )
    rewrite_shard(shard, lambda records: records[1:])
    info = found.splits["train"]
    splits = dict(found.splits)
    label_counts = list(info.label_counts)
    label_counts[found.labels.index(record.label_text)] -= 1
    splits["train"] = dataclasses.replace(
        info, num_examples=info.num_examples - 1, rejected=info.rejected + 1,
        shard_lengths=(info.shard_lengths[0] - 1, *info.shard_lengths[1:]),
        label_counts=tuple(label_counts),
    )  # fmt: skip
    dataset.write_manifest(str(out), dataclasses.replace(found, splits=splits))
    line = {"path": str(src / record.filename), "relpath": record.filename, "split": "train",
            "reason": "truncated", "error": "made up"}  # fmt: skip
    with open(out / "rejected" / "rejected-train.jsonl", "a") as lines:
        lines.write(json.dumps(line) + "\n")
    done = run_cli("verify", src, out)
    assert done.returncode == 1
    assert f"{record.filename}: in rejected/ (truncated), but the converter would store it now" in (
        done.stdout
    )


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_verify_checks_the_manifest_s_labels_and_offset_against_the_sources(converted_copy):
    # A manifest edited with the files made from it (labels.txt, TFDS's) and its records
    # left alone, or with records rewritten to match, passed: verify took its labels and
    # offset as given. The converter takes the sorted labels of the sources listed, and the
    # offset it records.
    src, out = converted_copy
    found = dataset.read_manifest(str(out))
    dataset.write_manifest(str(out), with_label_added(found, "zzz"))
    report = verified_both_ways(src, out)
    assert report.num_problems == 1, report
    assert report.problems[0] == (
        "manifest.json: its labels are not the sorted labels of the sources listed now (not "
        "among the sources: 'zzz'): a label folder added or removed since, or the manifest "
        "edited")  # fmt: skip
    conversion = {**found.conversion, "label_offset": found.label_offset + 1}
    dataset.write_manifest(str(out), dataclasses.replace(found, conversion=conversion))
    report = verified_both_ways(src, out)
    assert report.num_problems == 1 and "manifest.json: label_offset 1, but the conversion it " \
        "records wrote labels with 2 (edited?)" in report.problems, report


@pytest.mark.slow  # verifies three times, one of them on Beam's runner
def test_verify_checks_the_manifest_s_labels_against_the_labels_file_while_it_is_there(tmp_path):
    # The labels file was never read: a dataset relabelled throughout (manifest and every
    # record's index alike) passed, and so did a file edited since the conversion, from which
    # the converter now makes other labels (a helper's trial).
    src = write_image_folder(tmp_path / "src", per_label=2, odd=())
    labels_file, out = tmp_path / "labels.txt", tmp_path / "out"
    labels_file.write_text("red\nblue\ngreen\n")
    convert.run([str(src), str(out), "--labels_file", str(labels_file), *IN_PROCESS])
    assert verify.verify(str(src), str(out)).ok
    labels_file.write_text("blue\ngreen\nred\nwhite\n")
    report = verified_both_ways(src, out)
    assert report.problems == (
        f"manifest.json: its labels are not those of the labels file {labels_file} (not in "
        "the manifest: 'white'): the file edited since the conversion, or the manifest",)
    labels_file.unlink()  # gone (a temporary file): nothing to compare
    assert verify.verify(str(src), str(out)).ok


def test_a_split_of_no_input_in_the_manifest_is_a_problem(converted_copy):
    # Added by hand, it passed, and inspect said every input of it was rejected (a helper's
    # trial).
    src, out = converted_copy
    found = dataset.read_manifest(str(out))
    empty = manifest.SplitInfo(0, (), 0, 0, 0, (), label_counts=(0,) * len(found.labels))
    dataset.write_manifest(str(out), dataclasses.replace(found, splits={**found.splits,
                                                                        "test": empty}))  # fmt: skip
    assert verify.verify(str(src), str(out)).problems == (
        "manifest.json: split test holds no input, used or rejected: the converter writes no "
        "such split (edited?)",)


def test_verify_checks_the_manifest_s_records_per_label_against_the_shards(converted_copy):
    # The counts a class weight is made from: two labels' counts swapped (their sum kept)
    # are found by both drivers. Counts that do not sum to the split's are refused as edited.
    src, out = converted_copy
    found = dataset.read_manifest(str(out))
    info = found.splits["train"]
    assert sum(info.label_counts) == info.num_examples and len(set(info.label_counts)) > 1
    swapped = (info.label_counts[1], info.label_counts[0], *info.label_counts[2:])
    edited = {**found.splits, "train": dataclasses.replace(info, label_counts=swapped)}
    dataset.write_manifest(str(out), dataclasses.replace(found, splits=edited))
    report = verified_both_ways(src, out)
    first, second = found.labels[:2]
    assert report.problems == (
        (
            f"split train: the shards read hold other records per label than label_counts says: "
            f"{first!r} {info.label_counts[0]} (the manifest: {swapped[0]}), {second!r} "
            f"{info.label_counts[1]} (the manifest: {swapped[1]}) (the manifest edited, or "
            "shards replaced?)"
        ),
    ), report
    written = json.loads((out / "manifest.json").read_text())
    edits = ((lambda counts: counts.__setitem__(0, counts[0] + 1), "do not sum to"),
             (lambda counts: counts.__setitem__(0, float(counts[0])), "must be counts"),
             (lambda counts: counts.clear(), "in some splits and not others"))  # fmt: skip
    for edit, says in edits:
        edited = json.loads(json.dumps(written))
        edit(edited["splits"]["train"]["label_counts"])
        (out / "manifest.json").write_text(json.dumps(edited))
        with pytest.raises(ValueError, match=says):
            dataset.read_manifest(str(out))
    done = run_cli("verify", src, out)  # the last of them
    assert done.returncode == 2 and "in some splits and not others" in done.stderr


def test_a_shard_s_digest_of_its_inputs_is_the_one_manifests_already_hold():
    # Manifests written before hold digests of these lines; a digest worked out otherwise
    # would fail every such dataset's verify, and every training position saved on it.
    names = [("a/1.jpg", 0, "a"), ('\u00fc"\\\x00\udcff\u2028/\t.jpg', 12345, "\u732b \U0001f408")]
    digest = manifest.ShardPositions()
    for name in names:
        digest.add(*name)
    lines = "".join(json.dumps(list(name)) + "\n" for name in names)
    assert digest.hexdigest() == hashlib.sha256(lines.encode()).hexdigest()[:16]


def test_verify_proves_the_manifest_s_digest_of_which_inputs_each_shard_holds(converted_copy):
    # A resumed training position trusts it: it tells a dataset converted again from other
    # images (the same files and counts) from the one the position was saved on.
    src, out = converted_copy
    found = dataset.read_manifest(str(out))
    info = found.splits["train"]
    assert len(info.shard_digests) == len(info.files) and len(set(info.shard_digests)) > 1
    digests = (info.shard_digests[1], info.shard_digests[0], *info.shard_digests[2:])
    splits = {**found.splits, "train": dataclasses.replace(info, shard_digests=digests)}
    dataset.write_manifest(str(out), dataclasses.replace(found, splits=splits))
    done = run_cli("verify", src, out)
    assert done.returncode == 1
    said = "its records are not the inputs the manifest's digest of them names"
    assert f"shard {info.files[0]}: {said}" in done.stdout, done.stdout
    assert "2 problems" in done.stdout  # the two shards, and nothing else blamed


def test_copying_a_dataset_elsewhere_keeps_it_verifiable(converted, tmp_path):
    src, out = converted
    shutil.copytree(out, tmp_path / "moved")
    done = run_cli("verify", src, tmp_path / "moved")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_give_one_answer_whatever_order_the_rows_come_in(converted):
    # Beam's joins deliver a path's rows in any order: a modified copy written before or
    # after the true one must give the same problems.
    _, out = converted
    found = dataset.read_manifest(str(out))
    source = {"path": "p", "split": "train", "label": "red", "sha256": "s", "encoded_sha256": "e",
              "label_index": 0, "height": 5, "width": 7}  # fmt: skip
    true = {"shard": "b", "split": "train", "sha256": "s", "encoded_sha256": "e", "label": "red",
            "label_index": 0, "height": 5, "width": 7, "written": True,
            "record_problems": []}  # fmt: skip
    modified = dict(true, shard="a", encoded_sha256="x")
    lines = [{"reason": "truncated", "split": "train"}, {"reason": "unreadable", "split": "test"}]
    answers = {
        tuple(verify_rules.check_path("red/1.jpg", {"source": [source], "record": records,
                                                    "rejected": rejected}, dedupe=False))
        for records in ([true, modified], [modified, true])
        for rejected in (lines, lines[::-1])
    }  # fmt: skip
    assert len(answers) == 1 and any("written 2 times" in p for p in answers.pop())
    lines = [duplicates.report_row("s", [(name, "train", "red") for name in names])
             for names in (["b.jpg", "c.jpg"], ["a.jpg", "b.jpg"])]  # fmt: skip
    twice = verify_rules.check_content([], lines, found)[0]
    assert twice[0] == "duplicates.jsonl: lists the bytes of a.jpg 2 times"
    assert verify_rules.check_content([], lines[::-1], found)[0] == twice


def test_verify_never_loads_tensorflow(converted):
    # TensorFlow costs some 700 MB in a process: verify's memory would be four times the
    # conversion's, for reading files it reads as well without.
    src, out = converted
    done = run_python(
        "import sys\n"
        "from tfrecord_pipe._tools import cli\n"
        f"code = cli.main(['verify', {str(src)!r}, {str(out)!r}])\n"
        "print('EXIT', code, 'TENSORFLOW', 'tensorflow' in sys.modules)"
    )
    assert "EXIT 0 TENSORFLOW False" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def test_the_same_report_when_every_row_goes_through_sorts_on_disk(converted_copy, monkeypatch):
    # The joins sort on disk beyond spill.RUN_ITEMS rows: with runs of 2 rows merged 2 at a
    # time, every row goes through several levels of runs, and the report must not change.
    src, out = converted_copy
    rewrite_shard(first_shard(out), lambda records: records + records[:1])  # written twice
    (src / "green" / "999.jpg").write_bytes(jpeg_bytes(9, 9, (0, 250, 0)))  # lost
    (src / "red" / "000.jpg").write_bytes(jpeg_bytes(9, 9, (250, 0, 1)))  # changed
    (src / "blue" / "001.jpg").write_bytes(b"no image now")  # stored, rejected now
    in_memory = verify.verify(str(src), str(out))
    assert "blue/001.jpg: has a record, but the converter would reject it now (not_an_image)" in (
        in_memory.problems)  # fmt: skip
    monkeypatch.setattr(spill, "RUN_ITEMS", 2)
    monkeypatch.setattr(spill, "FAN_IN", 2)
    on_disk = verify.verify(str(src), str(out), processes=1, beside=True)
    assert on_disk == in_memory and in_memory.num_problems >= 4, in_memory
    assert verify.verify(str(src), str(out), processes=1, beside=False) == in_memory
    # The paths judged in three parts, one a worker, beside their records or apart; and in
    # fewer parts than processes.
    assert verify.verify(str(src), str(out), processes=3, beside=True) == in_memory
    assert verify.verify(str(src), str(out), processes=3, beside=False) == in_memory
    monkeypatch.setattr(verify_join, "MOST_PARTS", 2)
    assert verify.verify(str(src), str(out), processes=3, beside=True) == in_memory


def test_problems_judged_in_parts_are_those_judged_in_one():
    rng = random.Random(5)
    found = [(rng.choice([verify_rules.INPUTS, verify_rules.FILES]), f"problem {rng.random()}")
             for _ in range(3 * verify_rules.MAX_PROBLEMS_KEPT)]  # fmt: skip
    whole, parts = verify_join.Problems(), [verify_join.Problems() for _ in range(3)]
    for rank, text in found:
        whole.add(text, rank)
        parts[rng.randrange(3)].add(text, rank)
    joined = verify_join.Problems()
    joined.add("a problem of the launcher's own", verify_rules.FILES)
    whole.add("a problem of the launcher's own", verify_rules.FILES)
    for part in parts:
        joined.take(part.handed_over())
    assert (joined.kept, joined.count) == (whole.kept, whole.count)
    assert whole.count == len(found) + 1 and len(whole.kept) == verify_rules.MAX_PROBLEMS_KEPT


def test_a_worker_that_fails_or_dies_fails_verify_with_nothing_proven(
    converted, monkeypatch, workers_forked
):
    src, out = converted

    def fails(*_):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(verify_rules.Expect, "row_and_image", fails)
    done = run_cli("verify", src, out)
    assert done.returncode == 1 and "OK" not in done.stdout
    assert "RuntimeError: a bug of ours" in done.stderr and "nothing was proven" in done.stderr
    monkeypatch.setattr(verify_reading, "read_shard", lambda *_: os._exit(9))  # a worker killed
    done = run_cli("verify", src, out)
    assert done.returncode == 1 and "OK" not in done.stdout
    assert "BrokenProcessPool" in done.stderr and "nothing was proven" in done.stderr


def test_a_full_disk_fails_verify_saying_where_its_sorts_go(
    converted, tmp_path, monkeypatch, workers_forked
):
    src, out = converted
    monkeypatch.setenv("TMPDIR", str(tmp_path))

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(spill, "write_file", full)
    done = run_cli("verify", src, out)
    assert done.returncode == 1 and "nothing was proven" in done.stderr
    assert f"A disk is full: {tmp_path}, where verify's sorts lie" in done.stderr
    assert "Set TMPDIR to a folder with room." in done.stderr


def _break_first_image(records):
    """The first record with its image cut in half: it parses, its image does not decode."""
    record = schema.decode_example(records[0], label_offset=1)
    broken = dataclasses.replace(record, encoded=record.encoded[: len(record.encoded) // 2])
    return [schema.serialize(broken, label_offset=1)] + records[1:]


@pytest.mark.slow
def test_decode_decodes_every_record_as_the_reader_does(converted_copy):
    # Without --decode a record is proven to be the converter's bytes; with it, its image is
    # also decoded by TensorFlow in the workers (a new process: TensorFlow is not fork-safe
    # once started, and this test's process started it).
    src, out = converted_copy
    rewrite_shard(first_shard(out), _break_first_image)
    plain = run_cli("verify", src, out)  # its workers never touch TensorFlow
    decoded = run_command("verify", src, out, "--decode")
    assert plain.returncode == decoded.returncode == 1, plain.stderr + decoded.stderr
    assert "(modified record)" in plain.stdout and "does not decode" not in plain.stdout
    assert "image does not decode" in decoded.stdout, decoded.stdout + decoded.stderr
    assert "cuda" not in decoded.stderr.lower(), decoded.stderr  # TensorFlow's start-up noise
    # Every other record decoded: the one problem is the broken image (and what it makes).
    assert decoded.stdout.count("does not decode") == 1, decoded.stdout
    # The Beam pipeline decodes as well, and says the same.
    from tfrecord_pipe._tools import verify_job

    beam = verify_job.run(str(src), str(out), ["--runner", "DirectRunner", *IN_PROCESS],
                          decode=True)  # fmt: skip
    lines = decoded.stdout.splitlines()
    assert lines[1:-1] == [f"  {p}" for p in beam.problems]
    # The sources are a copy: both say where the manifest says they were.
    assert lines[-1] == str(beam).splitlines()[-1] and "converted from" in lines[-1]


def test_a_shard_that_is_a_fifo_is_a_problem_not_a_hang(converted_copy):
    src, out = converted_copy
    shard = first_shard(out)
    shard.unlink()
    os.mkfifo(shard)
    done = run_cli("verify", src, out)
    assert done.returncode == 1
    assert f"shard {shard.name} is corrupt after 0 records" in done.stdout
    assert "not a regular file" in done.stdout


def test_ctrl_c_during_verify_exits_130_with_nothing_proven(converted, monkeypatch):
    src, out = converted

    def interrupted(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(verify, "verify", interrupted)
    done = run_cli("verify", src, out)
    assert done.returncode == 130 and "interrupted; nothing was proven" in done.stderr


def test_sigterm_during_verify_exits_143_saying_so(converted):
    # A scheduler's stop ended verify without a word, leaving its sorts in TMPDIR.
    src, out = converted
    done = run_python(
        "import os, signal, sys, time\n"
        "from tfrecord_pipe._tools import cli, verify\n"
        "def stopped(*_, **__):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(60)\n"
        "verify.verify = stopped\n"
        f"sys.exit(cli.main(['verify', {str(src)!r}, {str(out)!r}]))\n"
    )
    assert done.returncode == 143, done.stderr
    assert done.stderr.strip() == "error: terminated (SIGTERM); nothing was proven either way."


def test_records_out_of_the_converters_order_or_stray_shards_are_problems(converted_copy):
    # Placement is part of the conversion: records reordered in a shard, or a file named like
    # a shard that the manifest does not list (a `train-*` pattern reads it), are found.
    src, out = converted_copy
    rewrite_shard(first_shard(out), lambda records: records[::-1])
    (out / "train-00000-of-00009.tfrecord").write_bytes(b"")
    # A shard's copy by another name: `train-*` read its records twice, and verify said OK.
    shutil.copy(first_shard(out), out / f"{first_shard(out).name}.bak")
    (out / "validation-grid.png").write_bytes(b"")  # `inspect --grid` put there
    (out / "notes-train.txt").write_bytes(b"")  # no split's pattern reads it
    (out / "train-00001-of-00009.tfrecord").mkdir()  # a pattern's reader fails on a folder
    done = run_cli("verify", src, out)
    assert done.returncode == 1
    assert f"shard {first_shard(out).name}: its records are not in the order" in done.stdout
    assert "train-00000-of-00009.tfrecord: named like a shard of split train" in done.stdout
    assert (f"{first_shard(out).name}.bak: the pattern train-* of split train reads it as part "
            "of the dataset, but the manifest does not list it") in done.stdout  # fmt: skip
    assert "validation-grid.png: the pattern validation-* of split validation" in done.stdout
    assert ("train-00001-of-00009.tfrecord/: a folder, which the pattern train-* of split train "
            "matches (a reader of that pattern fails on it)") in done.stdout  # fmt: skip
    assert "5 problems" in done.stdout  # nothing said twice (the shard's digest)


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_shards_swapped_whole_are_found_by_both_drivers(converted_copy):
    # Each shard keeps the manifest's count and the order inside it; only the order across
    # the shards says the records were moved.
    src, out = converted_copy
    first, second = (out / name for name in dataset.read_manifest(str(out)).splits["train"].files)
    records = [r.numpy() for shard in (first, second) for r in tf.data.TFRecordDataset(str(shard))]
    cut = len(records) - len(list(tf.data.TFRecordDataset(str(first))))
    rewrite_shard(first, lambda _: records[cut:])
    rewrite_shard(second, lambda _: records[:cut])
    report = verified_both_ways(src, out)
    swapped = (f"shards {first.name} and {second.name} of split train: records are not in the "
               "order the converter writes them across the shards (shards swapped or renamed?)")
    assert swapped in report.problems
    # Besides, each shard's size, where theirs differ (the manifest lists each file's).
    assert all(" holds " in problem and "the manifest lists" in problem
               for problem in report.problems if problem != swapped)


def test_what_verify_cannot_work_with_exits_2_saying_why(converted_copy, monkeypatch):
    src, out = converted_copy
    for source in (out, out.parent):  # the dataset twice; a folder that holds it
        done = run_cli("verify", source, out)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "is the source folder" in done.stderr and "verify SRC OUT" in done.stderr
    monkeypatch.setenv("TMPDIR", str(out / "no such folder"))  # where the sorts would spill
    done = run_cli("verify", src, out)
    assert done.returncode == 2 and "is not a writable folder" in done.stderr
    monkeypatch.delenv("TMPDIR")
    # The dataset reached through a link inside the source: the listing would follow it.
    os.symlink(out, src / "link")
    done = run_cli("verify", src, src / "link")
    assert done.returncode == 2 and "is the source folder" in done.stderr
    os.unlink(src / "link")
    # The other way round is a conversion the converter makes: verified as usual.
    shutil.move(src, out / "images")
    assert run_cli("verify", out / "images", out).returncode == 0


def test_an_edited_source_hash_blames_the_record_not_the_source(converted_copy):
    src, out = converted_copy

    def rehash(records):
        record = schema.decode_example(records[0], label_offset=1)
        edited = dataclasses.replace(record, sha256="0" * 64)
        return [schema.serialize(edited, label_offset=1)] + records[1:]

    rewrite_shard(first_shard(out), rehash)
    done = run_cli("verify", src, out)
    assert done.returncode == 1 and "1 problem\n" in done.stdout + "\n"
    assert "the record's source hash is not its source's" in done.stdout
    assert "changed since conversion" not in done.stdout


def test_a_manifest_that_disagrees_with_itself_is_a_problem(converted_copy):
    src, out = converted_copy
    path = out / "manifest.json"
    written = json.loads(path.read_text())
    written["rejected_reasons"] = {"truncated": 5}  # the splits reject 1
    written["format_version"] = 99
    written["conversion"]["compress"] = True  # its shards are not compressed
    path.write_text(json.dumps(written))
    done = run_cli("verify", src, out)
    assert done.returncode == 1
    assert "manifest.json: its rejection reasons count 5 rejected, its splits 1" in done.stdout
    assert "manifest.json: record format 99, but this version reads format" in done.stdout
    assert ("manifest.json: compression '', but the conversion it records ran with compress "
            "True (edited?)") in done.stdout  # fmt: skip


def test_a_manifest_s_rejections_moved_to_another_reason_are_found_by_both_drivers(
    converted_copy,
):
    # A helper's forgery: the total kept, one reason's count given to another. Verify checked
    # the total only, and said OK.
    src, out = converted_copy
    found = dataset.read_manifest(str(out))
    assert found.rejected_reasons == {"truncated": 1}
    dataset.write_manifest(str(out), dataclasses.replace(found, rejected_reasons={"unreadable": 1}))
    report = verified_both_ways(src, out)
    assert report.problems == (
        "manifest.json: counts 0 rejected as truncated, where rejected/ has 1 lines of that "
        "reason (edited?)",
        "manifest.json: counts 1 rejected as unreadable, where rejected/ has 0 lines of that "
        "reason (edited?)",
    ), report


def test_each_source_is_checked_beside_its_record_and_its_image_hashed_once(
    converted, monkeypatch
):
    # A worker reading a shard reads each record's source beside it: the rows are those of
    # the two sides read apart, and each image is hashed once (the source's bytes), where
    # read apart it is hashed twice (the record's copy too).
    src, out = converted
    found = verify_reading.read_conversion(str(out))
    config = verify_reading.source_config(str(src), str(out), found)
    expect = verify_rules.Expect(found, config.policy)
    shard = verify_reading.shards_of(found)[0]
    images = {schema.decode_example(record, label_offset=1).encoded
              for record in record_reader.records(str(out / shard[1]))}  # fmt: skip
    hashed, sha256 = [], hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda data=b"": hashed.append(data) or sha256(data))

    def image_hashes():
        counted = sum(data in images for data in hashed)
        hashed.clear()
        return counted

    apart = [value for kind, value in verify_reading.read_shard(str(out), found, shard)
             if kind == verify_rules.RECORD]  # fmt: skip
    assert image_hashes() == len(apart) >= 5  # the records' images, read apart
    beside = verify_beside.Beside(config, expect)
    rows = list(beside.with_found(verify_reading.read_shard(str(out), found, shard, beside=beside)))
    pairs = [value for kind, value in rows if kind == verify_beside.PAIR]
    assert [(relpath, record) for relpath, (record, _) in pairs] == apart
    assert image_hashes() == len(apart)  # the sources' bytes, once; not the records' copies
    for relpath, (_, source_row) in pairs:  # the row a check on its own gives
        assert source_row == expect(sources.source_finder(config)(relpath))
    assert image_hashes() == len(apart)


def test_sources_are_checked_beside_records_only_where_records_are_large(converted, tmp_path):
    # Beside its record, a source's image is hashed once, but pairing costs more than the
    # hash saves on small images: verify chooses by the records' mean size.
    def chosen(src, out):
        found = verify_reading.read_conversion(str(out))
        return verify_beside.chosen(verify_reading.source_config(str(src), str(out), found), found)

    assert not chosen(*converted)  # records of a few hundred bytes
    noise = np.random.default_rng(0).integers(0, 256, (160, 160, 3), dtype=np.uint8)
    (tmp_path / "src" / "red").mkdir(parents=True)
    (tmp_path / "src" / "red" / "1.jpg").write_bytes(encode(noise, quality=95))
    assert (tmp_path / "src" / "red" / "1.jpg").stat().st_size >= verify_beside.FROM_RECORD_BYTES
    convert.run([str(tmp_path / "src"), str(tmp_path / "out"), *IN_PROCESS])
    assert chosen(tmp_path / "src", tmp_path / "out")
    done = run_cli("verify", tmp_path / "src", tmp_path / "out")
    assert done.returncode == 0, done.stdout
    assert "1 source listed; 1 record in the shards" in done.stdout, done.stdout
    (tmp_path / "list.csv").write_text("src/red/1.jpg,red\n")
    convert.run([str(tmp_path / "list.csv"), str(tmp_path / "csv_out"), *IN_PROCESS])
    assert not chosen(tmp_path / "list.csv", tmp_path / "csv_out")  # names lead to no path


def _beside_over_first_shard(src, out):
    """The rows of the first shard with its sources checked beside its records."""
    found = verify_reading.read_conversion(str(out))
    config = verify_reading.source_config(str(src), str(out), found)
    beside = verify_beside.Beside(config, verify_rules.Expect(found, config.policy))
    shard = verify_reading.shards_of(found)[0]
    return list(beside.with_found(verify_reading.read_shard(str(out), found, shard, beside=beside)))


def test_a_record_named_with_a_nul_byte_is_a_record_of_no_source(converted_copy):
    # Beside its records, such a name made the shard "unreadable" and lost its other records.
    src, out = converted_copy

    def rename(records):
        record = schema.decode_example(records[0], label_offset=1)
        named = dataclasses.replace(record, filename=record.filename + "\x00x")
        return [schema.serialize(named, label_offset=1)] + records[1:]

    rewrite_shard(first_shard(out), rename)
    said = "\n".join(verified_both_ways(src, out).problems)
    assert "\x00x: in shard" in said and "but not among the sources" in said, said
    assert "could not be read" not in said and "listed but in no shard" in said


def test_an_error_of_verify_s_own_beside_a_record_fails_it_not_blamed_on_the_shard(
    converted, monkeypatch
):
    src, out = converted
    row_and_image, calls = verify_rules.Expect.row_and_image, []

    def once(self, *args):
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("for a moment")
        return row_and_image(self, *args)

    monkeypatch.setattr(verify_rules.Expect, "row_and_image", once)
    with pytest.raises(MemoryError, match="for a moment"):
        _beside_over_first_shard(src, out)


def test_a_source_that_became_a_fifo_is_not_opened_beside_its_record(converted_copy):
    # The walk never opens a special file (a FIFO, a device through a link: opening some has
    # effects), and neither does the check beside a record that names one.
    src, out = converted_copy
    fifo = src / schema.decode_example(
        next(record_reader.records(str(first_shard(out)))), label_offset=1
    ).filename
    fifo.unlink()
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: os.close(os.open(fifo, os.O_WRONLY)))
    writer.start()  # waits until a reader opens the FIFO
    try:
        rows = _beside_over_first_shard(src, out)
        time.sleep(0.2)
        assert writer.is_alive(), "the FIFO was opened"
        assert not [value for kind, value in rows if kind == verify_beside.PAIR
                    and value[0] == fifo.relative_to(src).as_posix()]  # fmt: skip
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join()


def test_a_shard_cut_short_gives_every_record_before_the_cut_window_by_window(
    converted_copy, monkeypatch
):
    # Beside their records, sources are read ahead a window of records at a time: the
    # records of a window before a cut must still be judged, and the cut said after them.
    src, out = converted_copy
    shard = first_shard(out)
    whole = shard.read_bytes()
    shard.write_bytes(whole[: len(whole) * 2 // 3])
    monkeypatch.setattr(verify_reading, "WINDOW_RECORDS", 2)
    found = verify_reading.read_conversion(str(out))
    config = verify_reading.source_config(str(src), str(out), found)
    (shard_row,) = [s for s in verify_reading.shards_of(found) if s[1] == shard.name]
    apart = list(verify_reading.read_shard(str(out), found, shard_row))
    beside = verify_beside.Beside(config, verify_rules.Expect(found, config.policy))
    rows = beside.with_found(verify_reading.read_shard(str(out), found, shard_row, beside=beside))
    together = [(verify_rules.RECORD, (v[0], v[1][0])) if k == verify_beside.PAIR else (k, v)
                for k, v in rows]  # fmt: skip
    assert together == apart
    records = [v for k, v in apart if k == verify_rules.RECORD]
    said = f"is corrupt after {len(records)} records"
    assert len(records) > 2 and any(said in str(v) for _, v in apart), apart  # windows of 2
