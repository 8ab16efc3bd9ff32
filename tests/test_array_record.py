"""`--formats tfrecord,array_record`: one conversion writes both formats, the same records in
the same shards, with the same guarantees; TFDS opens either from the one folder, and
`verify` and `inspect` read ArrayRecord as they read TFRecord."""

import json

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from google.cloud import storage

from beam_jobs import convert, finalise
from tfrecord_pipe import reader
from tfrecord_pipe._core import array_records, naming, tfds_metadata
from tfrecord_pipe._reading import dataset, records

from helpers import IN_PROCESS, run_cli, verified_both_ways, write_image_folder

BOTH = ["--formats", "tfrecord,array_record"]


def run(src, out, *args):
    return convert.run([str(src), str(out), *map(str, args), *IN_PROCESS])


def tfrecords(path) -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(str(path))]


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(source, dataset in both formats, its manifest)."""
    root = tmp_path_factory.mktemp("both")
    src = write_image_folder(root / "src", per_label=6, odd=("truncated_jpeg.jpg",))
    out = root / "out"
    return src, out, run(src, out, *BOTH, "--num_shards", 3, "--validation_fraction", 0.3)


@pytest.mark.slow
def test_both_formats_hold_the_same_records_shard_for_shard_and_the_same_bytes_each_run(
    both, tmp_path
):
    src, out, written = both
    for split, info in written.splits.items():
        assert len(info.files) == len(info.array_record_files) == 3
        for tfrecord, array_record, length in zip(
            info.files, info.array_record_files, info.shard_lengths
        ):
            assert array_record == tfrecord.replace(".tfrecord", ".array_record")
            assert naming.split_of(array_record) == split
            records_there = tfrecords(out / tfrecord)
            assert len(records_there) == length
            assert list(array_records.records(str(out / array_record))) == records_there
    assert written.file_formats == (naming.TFRECORD, naming.ARRAY_RECORD)
    assert written.rejected_reasons == {"truncated": 1}
    again = run(src, tmp_path / "again", *BOTH, "--num_shards", 3, "--validation_fraction", 0.3)
    for info in again.splits.values():
        for name in info.all_files:
            assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name
    assert verified_both_ways(src, out).ok


@pytest.mark.slow
def test_tfds_opens_either_format_from_the_one_folder(both):
    _, out, written = both
    info = json.loads((out / tfds_metadata.DATASET_INFO).read_text())
    assert info["fileFormat"] == "tfrecord" and info["alternativeFileFormats"] == ["array_record"]
    for split, expected in written.splits.items():
        builder = tfds.builder_from_directory(str(out))
        from_tf_data = sorted(
            e["image/filename"] for e in tfds.as_numpy(builder.as_dataset(split=split))
        )
        source = tfds.builder_from_directory(str(out)).as_data_source(split=split)
        assert len(source) == expected.num_examples
        from_source = sorted(source[i]["image/filename"] for i in range(len(source)))
        assert from_source == from_tf_data and len(from_tf_data) == expected.num_examples
    # tfds.data_source, TFDS's own entry point for random access, takes the folder too.
    builder_dir = tfds.builder_from_directory(str(out))
    assert len(builder_dir.as_data_source(split="train")) == written.splits["train"].num_examples


@pytest.mark.slow
def test_an_array_record_only_dataset_is_verified_and_inspected_and_the_reader_says_what_to_use(
    tmp_path,
):
    src = write_image_folder(tmp_path / "src", per_label=3)
    out = tmp_path / "out"
    written = run(src, out, "--formats", "array_record", "--num_shards", 2)
    assert written.splits["train"].files == () and len(written.splits["train"].array_record_files) == 2
    assert not list(out.glob("*.tfrecord"))
    # The summary says the files are not the TFRecord ones a reader would look for.
    assert finalise.summary_line(written, "out", 0.1).startswith(
        "Converted into out (.array_record files) in 0.1 s: train: 9 in 2 shards;")
    info = json.loads((out / tfds_metadata.DATASET_INFO).read_text())
    assert info["fileFormat"] == "array_record" and "alternativeFileFormats" not in info
    assert run_cli("verify", src, out).returncode == 0
    report = run_cli("inspect", out, "--check", "--grid", tmp_path / "grid.png")
    assert report.returncode == 0, report.stderr
    assert "shards in array_record" in report.stdout
    assert f"counts checked against the shards: OK ({written.splits['train'].num_examples}" in (
        report.stdout
    )
    assert (tmp_path / "grid.png").stat().st_size > 0
    with pytest.raises(ValueError, match="ArrayRecord shards only.*tfrecord_pipe.grain"):
        reader.build_dataset(reader.ReaderConfig(data=str(out), is_training=True, image_size=32))
    with pytest.raises(ValueError, match="has no tfrecord shards.*--formats tfrecord,array_record"):
        dataset.resolve(str(out), naming.TFRECORD)


def test_a_pattern_of_a_datasets_array_record_files_is_told_the_tfrecord_ones(both):
    # It said to convert again with both formats, which the dataset had.
    with pytest.raises(ValueError, match="matches ArrayRecord shards, and the tf.data reader "
                                         "reads TFRecord: pass the dataset folder"):  # fmt: skip
        reader.make_input_fn(str(both[1] / "train-*.array_record"), is_training=True,
                             image_size=32, batch_size=2)()  # fmt: skip


@pytest.mark.slow
def test_verify_finds_an_array_record_shard_damaged_cut_or_swapped(both, tmp_path):
    import shutil

    src, out, written = both
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    train, validation = written.splits["train"], written.splits["validation"]
    damaged = copy / train.array_record_files[0]
    data = bytearray(damaged.read_bytes())
    first = tfrecords(out / train.files[0])[0]
    data[data.index(first) + len(first) // 2] ^= 0xFF  # a byte inside the first record
    damaged.write_bytes(bytes(data))
    cut = copy / train.array_record_files[1]
    cut.write_bytes(cut.read_bytes()[: 70_000])
    (copy / validation.array_record_files[0]).write_bytes(
        (out / validation.array_record_files[1]).read_bytes()
    )
    (copy / validation.array_record_files[2]).unlink()
    report = run_cli("verify", src, copy)
    assert report.returncode == 1
    text = report.stdout
    assert f"shard {train.array_record_files[0]} is corrupt" in text
    assert f"shard {train.array_record_files[1]} is corrupt" in text
    assert (
        f"shard {validation.array_record_files[0]} does not hold the records of "
        f"{validation.files[0]}" in text
    )
    assert f"shard {validation.array_record_files[2]} is missing" in text
    # inspect --check reads the ArrayRecord copy when asked, and finds the cut file too.
    inspected = run_cli("inspect", copy, "--check", "--format", "array_record")
    assert inspected.returncode == 1 and train.array_record_files[1] in inspected.stdout


@pytest.mark.slow
def test_overwriting_with_tfrecord_only_leaves_no_array_record_file_and_a_new_output_is_refused(
    both, tmp_path
):
    import shutil

    src, out, _ = both
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    assert "into out (.tfrecord and .array_record files) in" in finalise.summary_line(
        finalise.read_manifest(str(out)), "out", 0.1)
    written = run(src, copy, "--overwrite", "--num_shards", 2)
    assert written.file_formats == (naming.TFRECORD,)
    assert finalise.summary_line(written, "out", 0.1).startswith("Converted into out in 0.1 s")
    assert not list(copy.glob("*.array_record"))
    # A TFRecord dataset's manifest records no formats: tfrecord-pipe 0.4.0 still reads it.
    recorded = json.loads((copy / "manifest.json").read_text())
    assert "formats" not in recorded["conversion"]
    assert all("array_record_files" not in info for info in recorded["splits"].values())
    assert run_cli("verify", src, copy).returncode == 0
    # ArrayRecord shards alone make a dataset too, that a run without --overwrite must keep.
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(out / "train-00000-of-00003.array_record", lone)
    for overwrite in ([], ["--overwrite"]):  # no manifest says whose: refused either way
        with pytest.raises(FileExistsError, match="named like a dataset's files, but no "
                                                  "manifest.json"):  # fmt: skip
            run(src, lone, *overwrite)
    assert sorted(p.name for p in lone.iterdir()) == ["train-00000-of-00003.array_record"]


@pytest.mark.slow
def test_both_formats_to_gs_are_verified_there(gcs, tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=3)
    bucket = storage.Client().bucket(gcs.bucket)
    for path in src.rglob("*.jpg"):
        bucket.blob(f"ar-src/{path.relative_to(src)}").upload_from_filename(path)
    out = gcs.url("ar-out")
    written = run(gcs.url("ar-src"), out, *BOTH, "--num_shards", 2)
    info = written.splits["train"]
    for tfrecord, array_record in zip(info.files, info.array_record_files):
        assert list(records.array_record_records(f"{out}/{array_record}")) == [
            r.numpy() for r in tf.data.TFRecordDataset(f"{out}/{tfrecord}")
        ]
    assert not tf.io.gfile.glob(out + "/.tmp-*/*")
    assert run_cli("verify", gcs.url("ar-src"), out).returncode == 0


def test_formats_are_checked_before_anything_runs(tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=1)
    for formats, said in (("parquet", "formats must be one or more of"),
                          ("tfrecord,tfrecord", "lists a format twice"),
                          (",", "formats must be one or more of")):  # fmt: skip
        with pytest.raises(ValueError, match=said):
            run(src, tmp_path / "out", "--formats", formats)
    assert not (tmp_path / "out").exists()
