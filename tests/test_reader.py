"""reader.py: the TPU-ready pipeline, on small datasets in the real on-disk format."""

import collections
import functools
import logging
import os
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tfrecord_pipe import dataset as dataset_lib
from tfrecord_pipe import reader
from tfrecord_pipe._reading import tpu_ready

from dataset_factory import write_dataset
from helpers import run_python

SIZE = 24
FIVE = ("a", "b", "c", "d", "e")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """train: 2 shards (7 records); validation: 2 shards of 6 and 5 records (11)."""
    folder = str(tmp_path_factory.mktemp("reader") / "ds")
    write_dataset(
        folder,
        {
            "train": [[0, 1, 2, 0], [1, 2, 0]],
            "validation": [[0, 1, 2, 0, 1, 2], [0, 0, 1, 2, 1]],
        },
    )
    return folder


@pytest.fixture(scope="module")
def one_class_per_shard(tmp_path_factory):
    """validation: 5 shards, shard i holds only label i (3 records each)."""
    folder = str(tmp_path_factory.mktemp("reader") / "by_shard")
    write_dataset(folder, {"validation": [[label] * 3 for label in range(5)]}, labels=FIVE)
    return folder


def batches(dataset, limit=100):
    return [tuple(part.numpy() for part in element) for element in dataset.take(limit)]


def real_labels(elements):
    """Labels of weight-1 examples in padded evaluation batches."""
    return [int(label) for _, labels, weights in elements for label, w in zip(labels, weights) if w]


@pytest.mark.parametrize(
    "dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow), "uint8"]
)
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("is_training", [True, False])
def test_every_mode_has_static_tpu_ready_shapes(dataset, is_training, transpose, dtype):
    input_fn = reader.make_input_fn(
        dataset,
        is_training=is_training,
        image_size=SIZE,
        transpose_input=transpose,
        batch_size=4,
        dtype=dtype,
    )
    ds = input_fn()
    image_shape = (SIZE, SIZE, 3, 4) if transpose else (4, SIZE, SIZE, 3)
    expected = [tf.TensorSpec(image_shape, tf.as_dtype(dtype)), tf.TensorSpec((4,), tf.int32)]
    if not is_training:
        expected.append(tf.TensorSpec((4,), tf.float32))
    assert list(ds.element_spec) == expected
    tpu_ready.check(ds, 4, "HWCN" if transpose else "NHWC")
    first = next(iter(ds))
    assert tuple(first[0].shape) == image_shape


def test_labels_come_out_zero_based_and_match_the_images(dataset):
    ds = reader.make_input_fn(
        dataset, is_training=False, image_size=SIZE, batch_size=11, dtype="uint8"
    )()
    ((images, labels, weights),) = batches(ds)
    assert sorted(labels.tolist()) == sorted([0, 1, 2, 0, 1, 2, 0, 0, 1, 2, 1])
    dominant = images.reshape(11, -1, 3).mean(axis=1).argmax(axis=1)  # red, green, blue
    np.testing.assert_array_equal(dominant, labels)


def test_training_repeats_every_record_once_per_epoch(dataset):
    ds = reader.make_input_fn(
        dataset, is_training=True, image_size=SIZE, batch_size=7, shuffle_buffer=1
    )()
    seen = collections.Counter(int(label) for _, labels in batches(ds, 60) for label in labels)
    # 60 epochs of 3 x label 0, 2 x label 1, 2 x label 2. Epochs blend where the interleave
    # moves from one epoch's files to the next, so the files open at the end (at most 7
    # records) may be read partly.
    for label, per_epoch in {0: 3, 1: 2, 2: 2}.items():
        assert abs(seen[label] - 60 * per_epoch) <= 7


def test_padded_evaluation_counts_every_record_once(dataset):
    ds = reader.make_input_fn(dataset, is_training=False, image_size=SIZE, batch_size=4)()
    elements = batches(ds)
    assert len(elements) == 3  # 11 records in batches of 4: 4 + 4 + 3 and one filler
    assert sum((weights > 0).sum() for _, _, weights in elements) == 11
    # Every record weighs the pass's 12 slots over its 11 records (reader.padded_weight).
    assert sum(weights.sum() for _, _, weights in elements) == pytest.approx(12)
    assert sorted(real_labels(elements)) == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]


def test_keras_evaluate_on_padded_batches_scores_exactly_the_records(dataset):
    # A model that always answers class 0: its accuracy is the share of label 0, 4 of 11.
    inputs = tf.keras.Input((SIZE, SIZE, 3))
    pooled = tf.keras.layers.GlobalAveragePooling2D()(inputs)
    logits = tf.keras.layers.Dense(
        3, kernel_initializer="zeros", bias_initializer=tf.keras.initializers.Constant([5, 0, 0])
    )(pooled)
    model = tf.keras.Model(inputs, logits)
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"],
    )
    ds = reader.make_input_fn(dataset, is_training=False, image_size=SIZE, batch_size=4)()
    result = model.evaluate(ds, return_dict=True, verbose=0)
    assert result["accuracy"] == pytest.approx(4 / 11)


@pytest.mark.parametrize("is_training", [True, False])
def test_runs_one_call_per_core_without_the_autotuner_unless_asked(dataset, is_training):
    # Deleting an autotuned iterator could wait seconds for the autotuner's thread, and on 2
    # cores it cost training throughput (reader.data_options): off unless autotune=True.
    def options(**autotune):
        input_fn = reader.make_input_fn(
            dataset, is_training=is_training, image_size=SIZE, batch_size=4, **autotune
        )
        return input_fn().options()

    fixed = options()
    assert fixed.autotune.enabled is False
    assert fixed.autotune.initial_parallelism == os.cpu_count()
    assert options(autotune=True).autotune.enabled is not False


def test_eval_remainder_drop_drops_the_partial_batch(dataset):
    ds = reader.make_input_fn(
        dataset, is_training=False, image_size=SIZE, batch_size=4, eval_remainder="drop"
    )()
    elements = batches(ds)
    assert len(elements) == 2 and all(len(element) == 2 for element in elements)
    # A batch larger than the split gave no batch, and evaluate returned [] without a word.
    records = dataset_lib.resolve(dataset).splits["validation"].num_examples
    with pytest.raises(ValueError, match=f"eval_remainder='drop' with batch {records + 1} over "
                                         f"this pipeline's {records} records of split "
                                         "'validation': no batch would come"):  # fmt: skip
        reader.make_input_fn(dataset, is_training=False, image_size=SIZE,
                             batch_size=records + 1, eval_remainder="drop")()  # fmt: skip


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_eval_remainder_drop_gives_every_pipeline_the_same_whole_steps(tmp_path):
    # Validation shards of 8 and 5 records read by 2 pipelines: each dropped its own remainder
    # (2 batches of 4 and 1), so pipelines ran other step counts, which synchronous replicas
    # cannot (a reviewer). Each now takes the smallest share's whole steps, its length known.
    folder = str(tmp_path / "ds")
    write_dataset(folder, {"train": [[0]], "validation": [[0, 1] * 4, [2] * 5]})
    input_fn = reader.make_input_fn(folder, is_training=False, image_size=SIZE, batch_size=8,
                                    eval_remainder="drop")  # fmt: skip
    # (replicas, what each pipeline gives: its length, its batches' sizes): a step takes 4
    # records of a pipeline, and the smaller share, 5, makes one.
    for replicas, each in ((2, (1, [4])), (4, (2, [2, 2]))):
        got = []
        for pipeline in range(2):
            ds = input_fn(tf.distribute.InputContext(2, pipeline, replicas))
            got.append((int(ds.cardinality()), [len(element[1]) for element in ds]))
        assert got == [each, each], replicas
    # A step of 8 records a pipeline, over 5: no whole step (evaluate returned nothing).
    with pytest.raises(ValueError, match="eval_remainder='drop' with a batch of 8 a step over 5 "
                                         "records"):  # fmt: skip
        reader.make_input_fn(folder, is_training=False, image_size=SIZE, batch_size=16,
                             eval_remainder="drop")(tf.distribute.InputContext(2, 1, 4))
    # A shard holding another count than listed is still said, though its last records are
    # past the batches kept.
    shard = next(pathlib.Path(folder).glob("validation-00001-*"))
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(shard))]
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for record in records[:-1]:
            writer.write(record)
    with pytest.raises(tf.errors.InvalidArgumentError, match="read 4 records, the manifest "
                                                            "lists 5"):  # fmt: skip
        batches(input_fn(tf.distribute.InputContext(2, 1, 2)))


def test_eval_remainder_drop_where_the_records_read_are_not_known_before(tmp_path):
    # With skip_corrupt, or over files without a manifest, each pipeline dropped its own
    # remainder (a helper's trials): two pipelines of a sound dataset gave 4 and 2 batches (a
    # pod's collective waits for ever), and one pipeline feeding two replicas an odd batch (a
    # step of empty batches, which Keras counts). One pipeline now keeps its whole steps as it
    # reads; several are refused.
    folder = str(tmp_path / "ds")
    write_dataset(folder, {"train": [[0]], "validation": [[0, 1] * 4, [2] * 5]})  # 13 records
    bare = tmp_path / "bare"  # the shards without the manifest beside them
    bare.mkdir()
    for shard in pathlib.Path(folder).glob("validation-*"):
        shutil.copy(shard, bare)
    for path, unknown in ((folder, dict(skip_corrupt=True)),
                          (f"{bare}/validation-*", dict(label_offset=1))):  # fmt: skip
        input_fn = reader.make_input_fn(path, is_training=False, image_size=SIZE, batch_size=8,
                                        eval_remainder="drop", **unknown)  # fmt: skip
        # 4 records a replica: 3 batches of 13 records, 1 step of 2 replicas.
        assert [len(labels) for _, labels in input_fn(tf.distribute.InputContext(1, 0, 2))] == [
            4, 4]  # fmt: skip
        with pytest.raises(ValueError, match="eval_remainder='drop' over 2 input pipelines "
                                             ".* one would wait in a collective for ever"):  # fmt: skip
            input_fn(tf.distribute.InputContext(2, 0, 2))


def test_params_batch_size_is_this_pipelines_batch(dataset):
    input_fn = reader.make_input_fn(dataset, mode="eval", image_size=SIZE)
    ds = input_fn({"batch_size": 3})
    assert ds.element_spec[0].shape == (3, SIZE, SIZE, 3)
    with pytest.raises(ValueError, match="batch_size"):
        input_fn({"use_tpu": True})


@pytest.mark.parametrize("num_pipelines", [2, 3])
@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_input_pipelines_share_out_whole_files_and_read_all(one_class_per_shard, num_pipelines):
    input_fn = reader.make_input_fn(
        one_class_per_shard, is_training=False, image_size=SIZE, batch_size=2 * num_pipelines
    )
    per_pipeline, steps = [], set()
    for index in range(num_pipelines):
        context = tf.distribute.InputContext(
            num_pipelines, index, num_replicas_in_sync=num_pipelines
        )
        ds = input_fn(context)
        assert ds.element_spec[0].shape[0] == 2  # the per-replica batch
        elements = batches(ds)
        steps.add(len(elements))
        per_pipeline.append(real_labels(elements))
    # Shard i holds label i: a pipeline's labels tell which files it read.
    for index, labels in enumerate(per_pipeline):
        assert set(labels) == set(range(index, 5, num_pipelines))
    assert sorted(sum(per_pipeline, [])) == sorted([label for label in range(5)] * 3)
    assert len(steps) == 1, "every pipeline must yield the same number of evaluation batches"


def test_fewer_files_than_pipelines_shares_records_with_a_warning(tmp_path, caplog):
    folder = str(tmp_path / "ds")
    labels = tuple(f"class{i}" for i in range(10))
    write_dataset(folder, {"validation": [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]}, labels=labels)
    input_fn = reader.make_input_fn(folder, is_training=False, image_size=SIZE, batch_size=6)
    seen = []
    with caplog.at_level(logging.WARNING, logger="tfrecord_pipe._reading.file_share"):
        for index in range(3):
            elements = batches(input_fn(tf.distribute.InputContext(3, index, 3)))
            seen.append(real_labels(elements))
    assert "2 files for 3 input pipelines" in caplog.text
    assert sorted(sum(seen, [])) == list(range(10)), "records lost or read twice"
    assert all(seen), "a pipeline got nothing"


@pytest.mark.parametrize("compression", ["", "GZIP"])
def test_a_shuffle_buffer_too_large_for_the_machine_is_warned_of_before_it_fills(
    tmp_path, caplog, monkeypatch, compression
):
    # A buffer of 10,000 photos of 9.6 MB filled a 24 GB machine: killed, without a word.
    from tfrecord_pipe._reading import buffer_memory

    folder = str(tmp_path / "ds")
    write_dataset(folder, {"train": [[0, 1, 2] * 20]}, compression=compression)
    files = reader.resolve_source(reader.ReaderConfig(folder)).split.files
    record = len(next(iter(tf.data.TFRecordDataset(files[:1], compression))).numpy())
    monkeypatch.setattr(buffer_memory, "_SAID", set())
    logger = "tfrecord_pipe._reading.buffer_memory"
    with caplog.at_level(logging.WARNING, logger=logger):
        reader.make_input_fn(folder, is_training=True, image_size=SIZE, batch_size=4)()
    assert not caplog.records  # this machine holds 60 such records
    memory = 50 * record  # a machine that does not (an epoch is the buffer: 60)
    monkeypatch.setattr(buffer_memory, "machine_bytes", lambda: memory)
    with caplog.at_level(logging.WARNING, logger=logger):
        for _ in range(2):  # said once
            reader.make_input_fn(folder, is_training=True, image_size=SIZE, batch_size=4)()
        reader.make_input_fn(folder, "train", is_training=False, image_size=SIZE, batch_size=4)()
    [said] = [r.getMessage() for r in caplog.records]
    assert said.startswith("The shuffle buffer of 60 records would hold about ")
    assert f"Give shuffle_buffer={int(0.1 * memory // record)} or less" in said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=logger):  # as advised: no warning
        reader.make_input_fn(folder, is_training=True, image_size=SIZE, batch_size=4,
                             shuffle_buffer=int(0.1 * memory // record))()  # fmt: skip
    assert not caplog.records


def test_empty_shards_deal_records_with_a_warning_that_says_so(tmp_path, caplog):
    # The warning said "5 files for 3 input pipelines ... write at least 3 shards".
    folder = str(tmp_path / "ds")
    write_dataset(folder, {"validation": [[0] * 5, [], [], [1], [2, 2]]})
    input_fn = reader.make_input_fn(folder, is_training=False, image_size=SIZE, batch_size=6)
    with caplog.at_level(logging.WARNING, logger="tfrecord_pipe._reading.file_share"):
        seen = [real_labels(batches(input_fn(tf.distribute.InputContext(3, i, 3))))
                for i in range(3)]  # fmt: skip
    assert "some pipeline's files would hold no record (empty shards)" in caplog.text
    assert "at least 3 shards" not in caplog.text
    assert sorted(sum(seen, [])) == [0] * 5 + [1, 2, 2]


@pytest.mark.parametrize("counts, warned", [((6, 5, 5, 5, 5), True), ((5, 5, 5, 5), False)])
def test_training_shares_of_uneven_totals_are_warned_of(tmp_path, caplog, counts, warned):
    # Two hosts on 5 shards: shares of 16 and 10 records, each host going round its own, so
    # over 10 epochs' steps 10 records were trained on 13 times and 16 on 8 (a reviewer).
    folder = str(tmp_path / "ds")
    write_dataset(folder, {"train": [[0] * n for n in counts]})
    input_fn = reader.make_input_fn(folder, is_training=True, image_size=SIZE, batch_size=2,
                                    host_index=0, host_count=2)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="tfrecord_pipe._reading.file_share"):
        input_fn()
        # Once a process: the pipeline built again (an epoch's loop), and the other host's
        # (hosts simulated in one process said it once each, 16 times for 16).
        input_fn()
        reader.make_input_fn(folder, is_training=True, image_size=SIZE, batch_size=2,
                             host_index=1, host_count=2)()  # fmt: skip
    said = "their shares hold 10 to 16 records" in caplog.text and "multiple of 2" in caplog.text
    assert said is warned
    assert caplog.text.count("their shares hold") == int(warned)


def test_a_training_step_drawing_more_than_the_share_is_warned_of(tmp_path, caplog):
    # Batches of 8 from 6 records: every batch held records twice, and nothing said so.
    folder = str(tmp_path / "ds")
    write_dataset(folder, {"train": [[0, 1, 2], [3, 4, 5]]}, labels=tuple(f"c{i}" for i in range(6)))
    said = "every step holds some of them more than once"
    # (Seeded or not: the check comes before the two paths part.)
    make = functools.partial(reader.make_input_fn, folder, is_training=True, image_size=SIZE)
    with caplog.at_level(logging.WARNING, logger="tfrecord_pipe._reading.file_share"):
        make(batch_size=6)()
        make(batch_size=6)(tf.distribute.InputContext(1, 0, 2))  # 3 for each of 2 replicas
        assert said not in caplog.text
        make(batch_size=8)()
        make(batch_size=8)()  # (once a process)
    assert caplog.text.count(said) == 1
    assert ("Each training step draws 8 records (1 replica(s) x 8) from this input pipeline's "
            "6 records of split 'train': every step holds some of them more than once. Give a "
            "batch_size of at most 6, or train on more records.") in caplog.text  # fmt: skip
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tfrecord_pipe._reading.file_share"):
        # One pipeline feeding 2 replicas a batch of 4 each: 8 records a step (a reviewer).
        make(batch_size=8)(tf.distribute.InputContext(1, 0, 2))
        # Two pipelines of 3 records each: the global batch of 16 takes 8 from each.
        make(batch_size=16)(tf.distribute.InputContext(2, 0, 2))
    assert "draws 8 records (2 replica(s) x 4) from this input pipeline's 6 records" in \
        caplog.text  # fmt: skip
    assert "Give a batch_size of at most 6, or" in caplog.text
    assert ("draws 8 records (1 replica(s) x 8) from this input pipeline's 3 records of split "
            "'train': every step holds some of them more than once. Give a batch_size of at "
            "most 6,") in caplog.text  # fmt: skip
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tfrecord_pipe._reading.file_share"):
        # A batch given by the caller (TPUEstimator's params) is a replica's.
        reader.build_dataset(make(batch_size=2).config, tf.distribute.InputContext(1, 0, 3),
                             batch_size=4)  # fmt: skip
    assert "draws 12 records (3 replica(s) x 4) from this input pipeline's 6 records" in \
        caplog.text  # fmt: skip
    assert "Give a batch of at most 2 a replica, or" in caplog.text


def test_padded_evaluation_of_a_pattern_on_several_hosts_gives_advice_that_works(tmp_path):
    # It said "or use eval_remainder='drop'", which several hosts refuse, and "replicas".
    folder = tmp_path / "ds"
    write_dataset(str(folder), {"validation": [[0, 1], [2]]})
    (folder / "manifest.json").unlink()
    with pytest.raises(ValueError, match=r"over 2 hosts needs record counts.*Read a dataset "
                                         r"folder\.$"):  # fmt: skip
        reader.make_input_fn(str(folder / "validation-*"), is_training=False, image_size=SIZE,
                             batch_size=2, label_offset=1, host_index=0, host_count=2)()


@pytest.mark.slow  # a subprocess: a regression would hang, and a test must not
def test_more_pipelines_than_shards_gives_every_host_records_or_one_error_never_a_hang(tmp_path):
    # 10 shards of 2 records for 11 hosts: dealing each file's own records left hosts with
    # nothing, and their training spun for ever. 40 one-record shards for 64 pipelines
    # cannot give every pipeline a record: every pipeline stops with the same error.
    ten, forty = str(tmp_path / "ten"), str(tmp_path / "forty")
    write_dataset(ten, {"train": [[i % 3, (i + 1) % 3] for i in range(10)]})
    write_dataset(forty, {"train": [[i % 3] for i in range(40)]})
    code = f"""
import tensorflow as tf
from tfrecord_pipe import reader
for index in range(11):
    input_fn = reader.make_input_fn({ten!r}, is_training=True, image_size=8, batch_size=11,
                                    host_index=index, host_count=11)
    images, labels = next(iter(input_fn()))
    print("HOST", index, labels.shape[0])
    # TPUEstimator-style params: this host's batch size, the host's position as above.
    print("PARAMS", index, next(iter(input_fn({{"batch_size": 1}})))[1].shape[0])
for how in ("context", "hosts", "params"):
    for index in (0, 1, 63):
        try:
            if how == "context":
                fn = reader.make_input_fn({forty!r}, is_training=True, image_size=8, batch_size=64)
                fn(tf.distribute.InputContext(64, index, 64))
            else:
                fn = reader.make_input_fn({forty!r}, is_training=True, image_size=8, batch_size=64,
                                          host_index=index, host_count=64)
                fn() if how == "hosts" else fn({{"batch_size": 1}})
        except ValueError as err:
            print("REFUSED", how, index, err)
"""
    done = run_python(code, timeout=180, preloaded=True)
    assert done.returncode == 0, done.stderr[-3000:]
    hosts = [line for line in done.stdout.splitlines() if line.startswith("HOST")]
    assert hosts == [f"HOST {i} 1" for i in range(11)]
    assert [line for line in done.stdout.splitlines() if line.startswith("PARAMS")] == [
        f"PARAMS {i} 1" for i in range(11)
    ]
    refused = [line for line in done.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 9, done.stdout
    assert all("holds 40 record(s) for 64 input pipelines" in line for line in refused)
    assert all("at most 40 pipelines" in line for line in refused)


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_every_record_goes_to_exactly_one_of_more_hosts_than_shards(tmp_path):
    folder = str(tmp_path / "ds")
    write_dataset(folder, {"train": [[0, 1], [2], [0, 1, 2], [1]], "validation": [[0], [1, 2]]})
    for split, hosts in (("train", 5), ("train", 7), ("validation", 3)):
        seen = []
        for index in range(hosts):
            config = reader.ReaderConfig(folder, split=split, is_training=False)
            context = tf.distribute.InputContext(hosts, index, hosts)
            seen += [bytes(r) for r in reader.read_records(config, context).as_numpy_iterator()]
        everything = reader.read_records(reader.ReaderConfig(folder, split, is_training=False))
        assert sorted(seen) == sorted(everything.as_numpy_iterator()), (split, hosts)


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_evaluation_on_more_hosts_than_files_pads_the_hosts_with_none(tmp_path):
    # 4 one-record validation files for 8 hosts (36 for 64 on a pod): hosts 4-7 get no file,
    # and their pipeline failed with a TypeError (an empty list of names made a float tensor).
    folder = str(tmp_path / "ds")
    write_dataset(folder, {"train": [[0, 1]], "validation": [[0], [1], [2], [0]]})
    labels, steps = [], set()
    for index in range(8):
        ds = reader.make_input_fn(folder, is_training=False, image_size=8, batch_size=16,
                                  host_index=index, host_count=8)()  # fmt: skip
        elements = batches(ds)
        steps.add(len(elements))  # every host runs the same steps, or the pod waits for ever
        labels += real_labels(elements)
        if index >= 4:
            assert all(not weights.any() for _, _, weights in elements), index
    assert steps == {1} and sorted(labels) == [0, 0, 1, 2]


@pytest.mark.slow  # a subprocess: a regression would spin for ever
def test_skip_corrupt_with_nothing_readable_stops_naming_the_files(tmp_path):
    folder = tmp_path / "ds"
    write_dataset(str(folder), {"train": [[0, 1, 2]]})
    (folder / "train-00000-of-00001.tfrecord").write_bytes(b"")
    code = f"""
from tfrecord_pipe import reader
ds = reader.make_input_fn({str(folder)!r}, is_training=True, image_size=8, batch_size=2,
                          skip_corrupt=True)()
next(iter(ds))
"""
    done = run_python(code, timeout=120, preloaded=True)
    assert done.returncode != 0
    assert "gave no record" in done.stderr and "train-00000-of-00001.tfrecord" in done.stderr
    assert done.stderr.count("WARNING tfrecord-pipe") == 1, "one warning, not one per spin"


def test_a_truncated_shard_stops_with_an_error_naming_the_file(tmp_path):
    folder = tmp_path / "ds"
    write_dataset(str(folder), {"validation": [[0, 1, 2, 0], [1, 2, 1]]})
    shard = folder / "validation-00001-of-00002.tfrecord"
    shard.write_bytes(shard.read_bytes()[:-200])
    ds = reader.make_input_fn(str(folder), is_training=False, image_size=SIZE, batch_size=2)()
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"validation-00001-of-00002\.tfrecord"
    ):
        batches(ds)


@pytest.mark.parametrize("batch_size", [2, 4])  # the records fill the batches, or padding does
@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_a_shard_holding_records_past_its_count_stops_evaluation_naming_it(tmp_path, batch_size,
                                                                          capfd):  # fmt: skip
    # Evaluation took the manifest's count of records and stopped there: the record past a
    # shard's count was never read, and the shard's end, where counts were checked, never
    # reached. A shard swapped for another went unnoticed.
    folder = tmp_path / "ds"
    write_dataset(str(folder), {"validation": [[0, 1, 2], [1, 2, 1]]})
    shard = folder / "validation-00000-of-00002.tfrecord"
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(shard))]
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for record in [*records, *records, *records]:
            writer.write(record)
    ds = reader.make_input_fn(str(folder), is_training=False, image_size=SIZE,
                              batch_size=batch_size)()  # fmt: skip
    # Not "truncated": a file with more records is most likely a dataset converted again
    # while it was read (a helper's trial: `convert --overwrite` beside a reader).
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"with more records than listed .*validation-00000-of-00002\.tfrecord: "
                             r"read 4 records, the manifest lists 3 \(another file by its name, "
                             "or the dataset converted again"):  # fmt: skip
        batches(ds)
    # skip_corrupt keeps the records listed, and says so once.
    ds = reader.make_input_fn(str(folder), is_training=False, image_size=SIZE,
                              batch_size=batch_size, skip_corrupt=True)()  # fmt: skip
    assert sorted(real_labels(batches(ds))) == [0, 1, 1, 1, 2, 2]
    assert capfd.readouterr().err.count("WARNING tfrecord-pipe") == 1


def test_skip_corrupt_reads_what_it_can_and_reports_the_skip(tmp_path, capfd):
    folder = tmp_path / "ds"
    write_dataset(str(folder), {"validation": [[0, 0, 0], [1, 1, 1, 1]]})
    shard = folder / "validation-00001-of-00002.tfrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped bit: a CRC error in the middle of the shard
    shard.write_bytes(bytes(data))
    ds = reader.make_input_fn(
        str(folder), is_training=False, image_size=SIZE, batch_size=2, skip_corrupt=True
    )()
    labels = real_labels(batches(ds))
    assert labels.count(0) == 3 and 0 < labels.count(1) < 4
    err = capfd.readouterr().err
    assert "validation-00001-of-00002.tfrecord" in err
    assert f"read {labels.count(1)} records, the manifest lists 4" in err


def test_gzip_shards_are_read_from_the_manifest_and_from_the_suffix(tmp_path):
    folder = str(tmp_path / "ds")
    write_dataset(folder, {"validation": [[0, 1], [2]]}, compression="GZIP")
    from_manifest = reader.make_input_fn(folder, is_training=False, image_size=SIZE, batch_size=3)
    assert sorted(real_labels(batches(from_manifest()))) == [0, 1, 2]
    tf.io.gfile.remove(f"{folder}/manifest.json")
    by_suffix = reader.make_input_fn(
        f"{folder}/validation-*", is_training=False, image_size=SIZE, batch_size=3, label_offset=1
    )
    assert sorted(real_labels(batches(by_suffix()))) == [0, 1, 2]


def test_a_pattern_without_a_manifest_needs_an_explicit_label_offset(tmp_path):
    folder = str(tmp_path / "ds")
    write_dataset(folder, {"train": [[0, 1, 2]]}, label_offset=0)
    tf.io.gfile.remove(f"{folder}/manifest.json")
    pattern = f"{folder}/train-*"
    with pytest.raises(ValueError, match="label_offset"):
        reader.make_input_fn(pattern, is_training=True, batch_size=3)()
    ds = reader.make_input_fn(
        pattern, is_training=False, batch_size=3, label_offset=0, image_size=SIZE
    )()
    assert sorted(real_labels(batches(ds))) == [0, 1, 2]
    # A wrong offset is caught by the range check instead of training on shifted labels.
    wrong = reader.make_input_fn(
        pattern, is_training=False, batch_size=3, label_offset=1, image_size=SIZE
    )()
    with pytest.raises(tf.errors.InvalidArgumentError, match="label_offset=1"):
        batches(wrong)


def test_a_pattern_beside_a_manifest_uses_its_offset_and_counts(dataset):
    ds = reader.make_input_fn(
        f"{dataset}/validation-*", is_training=False, image_size=SIZE, batch_size=4
    )()
    assert sorted(real_labels(batches(ds))) == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize(
    "data_suffix, options, message",
    [
        ("/nothing-*", {}, "matched no files"),
        ("", {"split": "test"}, r"has no split 'test'; it has \['train', 'validation'\]"),
        ("", {"label_offset": 0}, "says its labels were written with offset 1"),
        ("/train-*", {"split": "train"}, "drop split"),
        ("", {"host_index": 0, "host_count": 4},
         r"Global batch size 2 does not divide among 4 replicas \(hosts"),  # TensorFlow's: no host
    ],
)
def test_wrong_inputs_get_errors_that_say_what_to_do(dataset, data_suffix, options, message):
    with pytest.raises(ValueError, match=message):
        reader.make_input_fn(dataset + data_suffix, is_training=True, batch_size=2, **options)()


def test_a_folder_without_manifest_is_not_a_dataset(tmp_path):
    (tmp_path / "train-00000-of-00001.tfrecord").touch()
    with pytest.raises(ValueError, match="not a finished tfrecord-pipe dataset"):
        reader.make_input_fn(str(tmp_path), is_training=True, batch_size=2)()


def test_config_errors_list_every_problem():
    with pytest.raises(ValueError) as caught:
        reader.ReaderConfig(data="x", batch_size=0, dtype="float16", eval_remainder="keep",
                            image_size=100_000)  # fmt: skip
    fields = ("batch_size", "dtype", "eval_remainder", "image_size")
    assert all(field in str(caught.value) for field in fields)
    # A dtype object, as a JAX user writes one, is told to give its name (a helper's trial).
    for given, name in ((np.float32, "float32"), (tf.bfloat16, "bfloat16")):
        with pytest.raises(ValueError, match=f"got .*: give its name, '{name}'"):
            reader.ReaderConfig(data="x", dtype=given)
    with pytest.raises(ValueError, match="exactly one"):
        reader.make_input_fn("x", is_training=True, mode="train")
    # A count of the wrong type was a TypeError from deep in TensorFlow, or from a comparison.
    with pytest.raises(ValueError) as caught:
        reader.ReaderConfig(data="x", batch_size=2.5, image_size="32", seed=True)
    assert str(caught.value) == (
        "Invalid ReaderConfig: batch_size must be an int or None, got 2.5 (float); image_size "
        "must be an int, got '32' (str); seed must be an int or None, got True (bool)")
    assert type(reader.ReaderConfig(data="x", batch_size=np.int64(8)).batch_size) is int  # JSON
    # numpy's bools are bools: a flag, and not a count.
    assert reader.ReaderConfig(data="x", is_training=np.True_).is_training is True
    with pytest.raises(ValueError, match="batch_size must be an int or None, got np.True_"):
        reader.ReaderConfig(data="x", batch_size=np.True_)
    # `is_training="no"` was taken as True, and a list as the split failed as unhashable.
    with pytest.raises(ValueError) as caught:
        reader.make_input_fn("x", is_training="no", split=["train"], color_jitter="0.1")
    assert str(caught.value) == (
        "Invalid ReaderConfig: split must be a str or None, got ['train'] (list); is_training "
        "must be True or False, got 'no' (str); color_jitter must be a number, got '0.1' (str)")


def test_a_path_object_is_a_path(dataset):
    # A pathlib.Path failed at a string method ("has no attribute 'rstrip'").
    as_path = reader.make_input_fn(pathlib.Path(dataset), is_training=False, image_size=SIZE,
                                   batch_size=4)()  # fmt: skip
    as_str = reader.make_input_fn(dataset, is_training=False, image_size=SIZE, batch_size=4)()
    assert real_labels(batches(as_path)) == real_labels(batches(as_str))
    with pytest.raises(ValueError, match=r"data must be a path \(a str or a pathlib.Path\), got 7"):
        reader.make_input_fn(7, is_training=False)


@pytest.mark.slow
def test_reads_a_dataset_on_gcs(gcs):
    folder = gcs.url("reader", "ds")
    write_dataset(folder, {"train": [[0, 1], [2, 0]], "validation": [[0, 1, 2]]})
    train = reader.make_input_fn(folder, is_training=True, image_size=SIZE, batch_size=2)()
    assert sum(len(labels) for _, labels in batches(train, 4)) == 8
    evaluation = reader.make_input_fn(folder, is_training=False, image_size=SIZE, batch_size=2)()
    assert sorted(real_labels(batches(evaluation))) == [0, 1, 2]
    # Without its manifest (a conversion stopped as it finalised): it said "an empty folder"
    # of a folder holding shards (a helper's trial), as it was never listed.
    tf.io.gfile.remove(f"{folder}/manifest.json")
    with pytest.raises(ValueError, match="holds no manifest.json: not a finished tfrecord-pipe "
                                         "dataset. If a conversion into it was stopped, run it "
                                         "again"):  # fmt: skip
        reader.make_input_fn(folder, is_training=True, image_size=SIZE, batch_size=2)()
    # An outage is no missing dataset: it was a FileNotFoundError (a helper's trial).
    with gcs.faults(error_rate=1.0), pytest.raises(ConnectionError, match="did not answer"):
        reader.make_input_fn(folder, is_training=True, image_size=SIZE, batch_size=2)()
    from tfrecord_pipe._reading.dataset import unreachable

    forbidden = tf.errors.PermissionDeniedError(None, None, "403")
    assert isinstance(unreachable("gs://b/ds", forbidden), FileNotFoundError)


def test_image_fn_replaces_the_preprocessing_and_is_checked(dataset):
    config = reader.ReaderConfig(
        data=dataset, is_training=True, batch_size=2, image_size=SIZE, dtype="uint8"
    )

    def gray(encoded):
        image = tf.image.resize(tf.io.decode_jpeg(encoded, channels=3), [SIZE, SIZE])
        return tf.cast(tf.fill([SIZE, SIZE, 3], 128.0) + 0 * image, tf.uint8)

    images, _ = next(iter(reader.build_dataset(config, image_fn=gray)))
    assert (images.numpy() == 128).all()
    with pytest.raises(ValueError, match=r"image_fn returned float32 \(24, 24, 3\)"):
        reader.build_dataset(config, image_fn=lambda encoded: tf.zeros([SIZE, SIZE, 3]))


@pytest.mark.parametrize(
    "options", [dict(is_training=True), dict(is_training=True, seed=3), dict(is_training=False)],
    ids=["train", "seeded", "eval"],
)
def test_an_image_fn_is_converted_by_autograph_as_in_any_tf_function(dataset, options):
    # The reader's own graph code is not converted by autograph (it is written in TensorFlow
    # ops, and converting it cost a process ~1.4 s of CPU at its first pipeline); the user's
    # image_fn still is: a Python `if` on a tensor works in it.
    def flat_if_bright(encoded):
        image = tf.image.resize(tf.io.decode_jpeg(encoded, channels=3), [SIZE, SIZE])
        if tf.reduce_mean(image) >= 0:
            image = tf.fill([SIZE, SIZE, 3], 7.0)
        return tf.cast(image, tf.uint8)

    config = reader.ReaderConfig(data=dataset, batch_size=2, image_size=SIZE, dtype="uint8",
                                 **options)  # fmt: skip
    images, _, *weights = next(iter(reader.build_dataset(config, image_fn=flat_if_bright)))
    real = images.numpy()[weights[0].numpy() > 0] if weights else images.numpy()
    assert len(real) and (real == 7).all()


def test_read_records_gives_the_serialized_records_of_a_pipeline(dataset):
    config = reader.ReaderConfig(data=dataset, is_training=False)
    records = [r.numpy() for r in reader.read_records(config)]
    assert len(records) == 11
    context = tf.distribute.InputContext(2, 1, 2)
    assert len(list(reader.read_records(config, context))) == 5  # the second shard
    # The same tf.data options as build_dataset: a decode ceiling built on these records is
    # timed the way the pipeline is (here: without the autotuner).
    pipeline = reader.build_dataset(config, batch_size=4)
    assert reader.read_records(config).options() == pipeline.options()


def test_padded_evaluation_gives_each_replica_of_a_pipeline_the_same_batches(dataset):
    # 11 records in per-replica batches of 4 need 3 batches; two replicas share one pipeline,
    # so it yields 4: a step where one replica had no batch would be dropped with its images.
    input_fn = reader.make_input_fn(dataset, is_training=False, image_size=SIZE, batch_size=8)
    elements = batches(input_fn(tf.distribute.InputContext(1, 0, num_replicas_in_sync=2)))
    assert len(elements) == 4
    assert sorted(real_labels(elements)) == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]


def test_a_missing_shard_fails_at_once_naming_it_or_is_skipped_when_asked(tmp_path):
    # The reader used to spin forever, with no message.
    folder = tmp_path / "ds"
    write_dataset(str(folder), {"validation": [[0, 0], [1, 1, 1]]})
    (folder / "validation-00001-of-00002.tfrecord").unlink()
    options = dict(is_training=False, image_size=SIZE, batch_size=2)
    missing = r"missing \(or not files\): .*validation-00001-of-00002\.tfrecord"
    with pytest.raises(ValueError, match=missing):
        reader.make_input_fn(str(folder), **options)()
    skipped = reader.make_input_fn(str(folder), skip_corrupt=True, **options)()
    assert real_labels(batches(skipped)) == [0, 0]
    # A FIFO in its place blocked the reader that opened it, for ever.
    os.mkfifo(folder / "validation-00001-of-00002.tfrecord")
    with pytest.raises(ValueError, match=missing):
        reader.make_input_fn(str(folder), **options)()


@pytest.mark.parametrize("damage", ["cut", "missing"])
def test_seeded_training_on_damaged_shards_is_not_told_to_skip_them(converted_copy, damage):
    # Its error said "pass skip_corrupt=True", which a seeded config then refused (a
    # reviewer): the advice given is one the pipeline takes.
    folder = converted_copy[1]
    shard = folder / "train-00001-of-00002.tfrecord"
    if damage == "cut":
        shard.write_bytes(shard.read_bytes()[:-5])
    else:
        shard.unlink()
    options = dict(is_training=True, image_size=SIZE, batch_size=2)
    with pytest.raises(ValueError) as refused:
        reader.make_input_fn(str(folder), seed=1, **options)()
    assert "train-00001-of-00002.tfrecord" in str(refused.value)
    assert "cannot go on without them (skip_corrupt=True needs seed=None)" in str(refused.value)
    assert "pass skip_corrupt=True" not in str(refused.value)
    with pytest.raises(ValueError, match="pass skip_corrupt=True") as refused:
        reader.make_input_fn(str(folder), **options)()
    reader.make_input_fn(str(folder), skip_corrupt=True, **options)()  # the advice, taken


def test_hosts_whose_copies_lack_other_shards_skip_them_in_the_same_steps(tmp_path):
    # Each host with its own copy (local disks), one copy lacking a shard, skip_corrupt: each
    # host dealt the files of its own copy, so they took 4 and 3 steps (a pod waits for ever
    # in the next collective) and counted 5 records twice (found by a reviewer).
    shards = {"validation": [[0, 0], [1, 1, 1], [2], [0, 1], [2, 2, 2]]}
    copies = [tmp_path / "host0", tmp_path / "host1"]
    for copy in copies:
        write_dataset(str(copy), shards)
    (copies[1] / "validation-00000-of-00005.tfrecord").unlink()  # host 0 reads it
    (copies[0] / "validation-00002-of-00005.tfrecord").unlink()  # host 0's own: skipped
    read = [
        batches(reader.make_input_fn(str(copy), is_training=False, image_size=SIZE, batch_size=2,
                                     host_index=host, host_count=2, skip_corrupt=True)())
        for host, copy in enumerate(copies)
    ]  # fmt: skip
    assert len(read[0]) == len(read[1])
    assert sorted(real_labels(read[0]) + real_labels(read[1])) == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    # Training on a host whose copy lacks its whole share: said, not TensorFlow's "buffer_size
    # must be greater than zero" (a reviewer).
    (copies[0] / "validation-00004-of-00005.tfrecord").unlink()
    (copies[0] / "validation-00000-of-00005.tfrecord").unlink()
    with pytest.raises(ValueError, match="Every file of this input pipeline's share of split "
                                         "'validation' is missing here.*Restore them"):  # fmt: skip
        reader.make_input_fn(str(copies[0]), split="validation", is_training=True,
                             image_size=SIZE, batch_size=2, host_index=0, host_count=2,
                             skip_corrupt=True)()  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("skip_corrupt", [False, True])
def test_a_shard_that_disappears_while_training_stops_or_is_skipped_never_hangs(
    tmp_path, skip_corrupt
):
    folder = tmp_path / "ds"
    write_dataset(str(folder), {"train": [[0, 0], [1, 1]]})
    code = f"""
import os
from tfrecord_pipe import reader
ds = reader.make_input_fn({str(folder)!r}, is_training=True, image_size=8, batch_size=2,
                          skip_corrupt={skip_corrupt}, shuffle_buffer=1)()
os.remove({str(folder / "train-00001-of-00002.tfrecord")!r})
labels = [int(label) for _, labels in ds.take(4) for label in labels]
print("LABELS", labels)
"""
    done = run_python(code, timeout=120, preloaded=True)
    if skip_corrupt:
        assert done.returncode == 0, done.stderr[-2000:]
        assert "LABELS [0, 0, 0, 0, 0, 0, 0, 0]" in done.stdout
        assert "train-00001-of-00002.tfrecord is missing; skipped it" in done.stderr
    else:
        assert done.returncode != 0
        assert "TFRecord file" in done.stderr and "train-00001-of-00002.tfrecord is missing" in done.stderr


def test_an_invalid_manifest_is_named(tmp_path):
    write_dataset(str(tmp_path), {"train": [[0]]})
    # Each said in words, not as Python's TypeError or KeyError.
    for text, why in (('{"labels": ["a"]}', "no 'splits' field"),
                      ("[1, 2, 3]", "a JSON list, not an object of fields"),
                      ('{"labels": ["a"], "label_offset": 0, "compression": "", "splits": '
                       '{"train": {}}}', "split train: no 'shard_lengths' field"),
                      ('{"labels": [', "not JSON: Expecting value at line 1, column 13")):  # fmt: skip
        (tmp_path / "manifest.json").write_text(text)
        with pytest.raises(ValueError, match=r"manifest.json is not a valid tfrecord-pipe "
                                             rf"manifest \({why}\)"):  # fmt: skip
            reader.make_input_fn(str(tmp_path), is_training=True, batch_size=1)()


def test_a_folder_with_brackets_in_its_name_is_read_as_named(tmp_path):
    write_dataset(str(tmp_path / "set[1]"), {"validation": [[0, 0]]})
    write_dataset(str(tmp_path / "set1"), {"validation": [[2, 2, 2]]})  # set[1] as a pattern
    for data in (str(tmp_path / "set[1]"), f"{tmp_path}/set[1]/validation-*"):
        ds = reader.make_input_fn(data, is_training=False, image_size=SIZE, batch_size=2)()
        assert real_labels(batches(ds)) == [0, 0], data


def test_a_dataset_path_from_the_home_folder_is_read_as_the_shell_would(tmp_path, monkeypatch):
    # "~/data" read "matched no files": only a shell expands ~.
    monkeypatch.setenv("HOME", str(tmp_path))
    write_dataset(str(tmp_path / "ds"), {"train": [[0, 1]]})
    input_fn = reader.make_input_fn("~/ds/", split="train", is_training=False, image_size=8,
                                    batch_size=2)  # fmt: skip
    assert input_fn.config.data == f"{tmp_path}/ds/"
    assert next(iter(input_fn()))[1].numpy().tolist() == [0, 1]
