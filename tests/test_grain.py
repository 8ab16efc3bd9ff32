"""The Grain path (`tfrecord_pipe.grain`) over ArrayRecord shards, with the real Grain and
array-record packages: the tf.data reader's semantics (every record once per epoch, seeded
and exact, resumable, padded evaluation, this host's share) and its evaluation pixels."""

import json
import logging
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from beam_jobs import convert
from benchmarks import photos
from tfrecord_pipe import grain, serving
from tfrecord_pipe._core import array_records, crops, schema
from tfrecord_pipe._grain import images
from tfrecord_pipe._reading import preprocess

from helpers import IN_PROCESS, run_python, write_image_folder
from preloaded import python as preloaded_python

ROOT = pathlib.Path(__file__).resolve().parents[1]

SIZE = 24
# Sides that make the evaluation crop decode at every DCT scale the reader uses (1, 2, 4, 8
# for SIZE and for 224), and small ones.
SIDES = [(40, 30), (64, 90), (130, 100), (300, 200), (520, 400), (1000, 700), (1900, 1300)]


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """A dataset in both formats: 3 labels of small images plus photo-like ones of SIDES."""
    root = tmp_path_factory.mktemp("grain")
    src = write_image_folder(root / "src", per_label=7)
    rng = np.random.default_rng(0)
    for number, (width, height) in enumerate(SIDES):
        (src / "red" / f"photo{number}.jpg").write_bytes(photos.photo_like_jpeg(rng, width, height))
    out = root / "out"
    convert.run([str(src), str(out), "--formats", "tfrecord,array_record", "--num_shards", "3",
                 "--validation_fraction", "0.4", *IN_PROCESS])  # fmt: skip
    return out


def records_of(out, split) -> list[schema.ImageRecord]:
    found = grain.find_split(str(out), split)
    return [schema.decode_example(r, label_offset=found.label_offset)
            for file in found.files for r in array_records.records(file)]  # fmt: skip


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_evaluation_pixels_are_the_tf_readers_and_servings_within_decoder_tolerance(both):
    config = serving.ServingConfig.for_dataset(str(both), image_size=224, dtype="uint8")
    encoded = [record.encoded for split in ("train", "validation")
               for record in records_of(both, split)]  # fmt: skip
    served = serving.model_inputs(tf.constant(encoded), config).numpy().astype(int)
    for image_size in (SIZE, 224):
        for number, jpeg in enumerate(encoded):
            ours = grain.eval_image(jpeg, image_size, "uint8").astype(int)
            theirs = preprocess.eval_image(tf.constant(jpeg), image_size, "uint8").numpy()
            # TensorFlow decodes with libjpeg's fast integer IDCT, OpenCV with its accurate one.
            difference = np.abs(ours - theirs)
            assert difference.max() <= 8 and difference.mean() <= 1.5, (number, image_size)
            # With TensorFlow's accurate IDCT the window, scale and resize give the same
            # pixels but for rounding (a window or resize half a pixel off would not).
            accurate = accurate_eval_image(jpeg, image_size)
            assert np.abs(ours - accurate).max() <= 1, (number, image_size)
            if image_size == 224:
                assert np.abs(ours - served[number]).max() <= 8
        floats = grain.eval_image(encoded[0], image_size, "float32")
        expected = preprocess.eval_image(tf.constant(encoded[0]), image_size, "float32").numpy()
        assert floats.dtype == np.float32 and np.abs(floats - expected).max() <= 8 / 58


def accurate_eval_image(jpeg: bytes, image_size: int) -> np.ndarray:
    """The reader's evaluation crop, made with TensorFlow's ops as `preprocess.eval_image`
    makes it, but decoded with the accurate IDCT (dct_method="INTEGER_ACCURATE")."""
    height, width = (int(n) for n in tf.image.extract_jpeg_shape(jpeg).numpy()[:2])
    window = (int(n) for n in preprocess.centre_window(height, width, image_size).numpy())
    return accurate_image(jpeg, tuple(window), False, image_size)


def accurate_image(jpeg: bytes, window, flip: bool, image_size: int) -> np.ndarray:
    """The crop `window` (top, left, height, width) of a JPEG, mirrored if `flip`, resized,
    made with TensorFlow's ops as the reader's preprocessing makes it (decoded at the same DCT
    scale, flipped before the resize), but with the accurate IDCT, as uint8."""
    top, left, height, width = window
    ratio = crops.dct_ratio(height, width, image_size)
    scaled = tf.io.decode_jpeg(jpeg, channels=3, ratio=ratio, dct_method="INTEGER_ACCURATE")
    crop = scaled[top // ratio : top // ratio + height // ratio,
                  left // ratio : left // ratio + width // ratio]  # fmt: skip
    if flip:
        crop = tf.image.flip_left_right(crop)
    resized = tf.image.resize(tf.cast(crop, tf.float32), [image_size, image_size])
    return tf.cast(resized + 0.5, tf.uint8).numpy().astype(int)


def test_a_training_image_is_its_drawn_window_mirrored_when_drawn_as_tensorflow_makes_it(both):
    """The window and flip drawn from the record's Generator, made as the reader makes a
    window (flip, then resize) within rounding: the Grain path mirrors after the resize."""
    flips = set()
    for number, record in enumerate(records_of(both, "train")):
        for image_size in (SIZE, 224):
            ours = grain.train_image(record.encoded, image_size, np.random.default_rng(number),
                                     "uint8", size=(record.height, record.width))  # fmt: skip
            replay = np.random.default_rng(number)
            window = images.random_window(record.height, record.width, replay)
            flip = bool(replay.random() < 0.5)
            expected = accurate_image(record.encoded, window, flip, image_size)
            assert np.abs(ours.astype(int) - expected).max() <= 1, (number, image_size, flip)
            flips.add(flip)
    assert flips == {False, True}


def test_evaluation_gives_every_record_once_in_padded_batches_the_same_count_on_every_host(both):
    records = records_of(both, "validation")
    expected = [grain.eval_image(r.encoded, SIZE, "uint8") for r in records]
    hosts, batch = 3, 4
    per_host = [list(grain.make_dataset(str(both), is_training=False, batch_size=batch,
                                        image_size=SIZE, dtype="uint8", host_index=host,
                                        host_count=hosts))
                for host in range(hosts)]  # fmt: skip
    assert len({len(batches) for batches in per_host}) == 1  # no host waits for another
    steps = len(per_host[0])
    assert steps == -(-(-(-len(records) // hosts)) // batch)
    seen = 0
    for host, batches in enumerate(per_host):
        images = np.concatenate([b[0] for b in batches])
        labels = np.concatenate([b[1] for b in batches])
        weights = np.concatenate([b[2] for b in batches])
        mine = list(range(host, len(records), hosts))
        real = weights > 0
        assert real.sum() == len(mine) and real[: len(mine)].all()
        for image, label, index in zip(images, labels, mine):
            assert np.array_equal(image, expected[index])
            assert label == records[index].label_index
        assert not images[~real].any()
        # Weighted as the tf.data reader weighs them: the mean over all slots is the mean
        # over the records.
        np.testing.assert_allclose(weights[real], steps * batch * hosts / len(records), rtol=1e-6)
        seen += len(mine)
    assert seen == len(records)


def keys_of(batches) -> list[int]:
    return [int(k) for batch in batches for k in batch[2]]


def train(out, **options):
    settings = dict(is_training=True, batch_size=4, image_size=SIZE, dtype="uint8", seed=7,
                    with_keys=True, host_index=0, host_count=1)  # fmt: skip
    return grain.make_dataset(str(out), **{**settings, **options})


def test_each_epoch_is_a_new_permutation_and_hosts_share_one_stream(both):
    count = grain.find_split(str(both), "train").num_examples
    one = iter(train(both))
    stream = [next(one) for _ in range(3 * count // 4 + 2)]
    keys = keys_of(stream)
    first, second = keys[:count], keys[count : 2 * count]
    assert sorted(first) == sorted(second) == list(range(count))
    assert first != second
    # Two hosts: at each step their batches are the one-host stream's next 8 places, dealt
    # in turn, with the same pixels (augmentation follows the place, not the host).
    two = [iter(train(both, batch_size=2, host_index=h, host_count=2)) for h in range(2)]
    images = np.concatenate([b[0] for b in stream])
    for step in range(5):
        batches = [next(iterator) for iterator in two]
        for host, (host_images, _, host_keys) in enumerate(batches):
            places = [step * 4 + 2 * j + host for j in range(2)]
            assert [int(k) for k in host_keys] == [keys[p] for p in places]
            assert np.array_equal(host_images, images[places])
    assert keys_of([next(iter(train(both, seed=8)))]) != keys[:4]


def test_batch_memory_is_used_again_only_once_nobody_holds_the_batch(both):
    # The batches' arrays are recycled: one the trainer still holds, or a view of, keeps its
    # pixels while many more batches are made.
    expected = [batch[0].copy() for batch, _ in zip(train(both), range(40))]
    stream = iter(train(both))
    held = next(stream)[0]
    view = next(stream)[0][1:]
    for step in range(2, 40):
        assert np.array_equal(next(stream)[0], expected[step])
    assert np.array_equal(held, expected[0])
    assert np.array_equal(view, expected[1][1:])


@pytest.mark.slow
def test_a_batch_put_on_a_jax_device_keeps_its_pixels(both):
    # On CPU, jax.device_put may alias the numpy array rather than copy it. In a process of
    # its own: JAX's threads in the test process would make later forks unsafe.
    done = run_python(
        "import jax, numpy as np\n"
        "from tfrecord_pipe import grain\n"
        f"def train(): return iter(grain.make_dataset({str(both)!r}, is_training=True, "
        f"batch_size=4, image_size={SIZE}, dtype='float32', seed=7, host_index=0, "
        "host_count=1))\n"
        "expected = [next(s)[0].copy() for s in [train()] for _ in range(30)]\n"
        "stream = train()\n"
        "on_device = jax.device_put(next(stream)[0])\n"
        "for _ in range(29): next(stream)\n"
        "assert np.array_equal(np.asarray(on_device), expected[0])\n"
        "print('kept')\n"
    )
    assert done.returncode == 0 and "kept" in done.stdout, done.stderr


def test_a_state_resumes_at_the_next_batch_and_other_settings_are_refused(both):
    reference = list(zip(range(9), iter(train(both))))
    batches = iter(train(both))
    for _ in range(4):
        next(batches)
    state = batches.get_state()
    assert len(repr(state)) < 2000  # a few bytes, beside the model's checkpoint
    resumed = iter(train(both))
    resumed.set_state(state)
    for step in range(4, 9):
        got = next(resumed)
        assert all(np.array_equal(a, b) for a, b in zip(got, reference[step][1])), step
    # Saved another way (orbax, msgpack): numpy numbers and tuples. JSON could not write them.
    numpy_valued = {name: tuple(value) if isinstance(value, list)
                    else np.int64(value) if type(value) is int else value
                    for name, value in state["settings"].items()}  # fmt: skip
    resumed = iter(train(both))
    resumed.set_state({**state, "settings": numpy_valued})
    assert all(np.array_equal(a, b) for a, b in zip(next(resumed), reference[4][1]))
    for other, said in ((dict(seed=8), "seed: saved 7, here 8"),
                        (dict(batch_size=2), "batch_size: saved 4, here 2"),
                        (dict(host_index=1, host_count=2), "host: saved \\[0, 1\\], here \\[1, 2\\]")):  # fmt: skip
        elsewhere = iter(train(both, **other))
        with pytest.raises(ValueError, match=f"reads other batches \\(.*{said}"):
            elsewhere.set_state(state)
    for damaged in ({"next_index": 3}, {**state, "settings": None},
                    {k: v for k, v in state.items() if k != "grain"}):  # fmt: skip
        with pytest.raises(ValueError, match="Not a tfrecord-pipe grain position state"):
            iter(train(both)).set_state(damaged)


def test_grain_s_checkpoint_handler_saves_and_restores_the_iterator(both, tmp_path):
    # What Orbax users save a Grain iterator with: it failed on our iterator ("'dict' object
    # has no attribute 'decode'": not a grain.DatasetIterator), found by a reviewer.
    import grain as grain_lib  # (Grain's own package, beside our tfrecord_pipe.grain)
    from etils import epath

    handler = grain_lib.checkpoint.CheckpointHandler()
    reference = list(zip(range(7), iter(train(both))))
    batches = iter(train(both))
    for _ in range(4):
        next(batches)
    (tmp_path / "step4").mkdir()
    handler.save(epath.Path(tmp_path / "step4"), batches)
    resumed = handler.restore(epath.Path(tmp_path / "step4"), iter(train(both)))
    for step in range(4, 7):
        assert all(np.array_equal(a, b) for a, b in zip(next(resumed), reference[step][1]))
    with pytest.raises(ValueError, match="seed: saved 7, here 8"):  # still checked
        handler.restore(epath.Path(tmp_path / "step4"), iter(train(both, seed=8)))


def test_a_state_on_a_dataset_converted_again_from_other_images_is_refused(tmp_path):
    # The same files and counts (shards are balanced), other images at their places.
    src, out = write_image_folder(tmp_path / "src", per_label=4), tmp_path / "out"
    args = [str(src), str(out), "--formats", "tfrecord,array_record", "--num_shards", "2",
            "--validation_fraction", "0", "--overwrite"]  # fmt: skip
    convert.run(args)
    batches = iter(train(out))
    next(batches)
    state = batches.get_state()
    (src / "red" / "000.jpg").rename(src / "blue" / "900.jpg")
    convert.run(args)
    # (The settings cannot be those it was saved with: the dataset they read is replaced.)
    said = ("reads other batches \\(records \\(the dataset: .*\\): saved .* or start afresh: a "
            "new iterator, without this state, starts at its first batch.")
    with pytest.raises(ValueError, match=said):
        iter(train(out)).set_state(state)


def test_a_number_of_epochs_ends_every_host_at_the_same_step(both):
    count = grain.find_split(str(both), "train").num_examples
    ends = [len(list(train(both, batch_size=3, num_epochs=2, host_index=h, host_count=2)))
            for h in range(2)]  # fmt: skip
    assert ends == [2 * count // 6] * 2
    with pytest.raises(ValueError, match="fewer than one global batch"):
        train(both, batch_size=count, num_epochs=1, host_index=0, host_count=2)
    # Another number of epochs is another stream's end: a state saved at the end (with
    # workers, all of them finished) would resume into a longer stream as ended, silently.
    batches = iter(train(both, num_epochs=1))
    next(batches)
    with pytest.raises(ValueError, match="num_epochs: saved 1, here 3"):
        iter(train(both, num_epochs=3)).set_state(batches.get_state())


def test_a_global_batch_larger_than_the_split_is_warned_of(both, caplog):
    count = grain.find_split(str(both), "train").num_examples
    said = "every global batch holds some records more than once"
    with caplog.at_level(logging.WARNING, logger="tfrecord_pipe._grain.pipeline"):
        train(both, batch_size=count // 2, host_index=0, host_count=2)
        assert said not in caplog.text
        train(both, batch_size=count // 2 + 1, host_index=1, host_count=2)
    assert f"Training global batches of {2 * (count // 2 + 1)} ({count // 2 + 1} a host x 2)" in caplog.text
    assert said in caplog.text


def test_what_the_grain_path_cannot_read_is_refused_with_what_to_do(both, tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=2)
    convert.run([str(src), str(tmp_path / "tfrecord"), *IN_PROCESS])
    with pytest.raises(ValueError, match="no ArrayRecord shards.*--formats tfrecord,array_record"):
        train(tmp_path / "tfrecord")
    with pytest.raises(ValueError, match="seed is required"):
        train(both, seed=None)
    with pytest.raises(ValueError, match="local files only"):
        train("gs://bucket/dataset")
    with pytest.raises(ValueError, match="has no manifest.json"):
        train(tmp_path)
    with pytest.raises(ValueError, match="nope does not exist: pass a dataset folder"):
        train(tmp_path / "nope")  # was "has no manifest.json", as if it were a folder
    with pytest.raises(ValueError, match="has no split 'test'"):
        train(both, split="test")
    broken = tmp_path / "broken"
    shutil.copytree(both, broken)
    found = grain.find_split(str(both), "train")
    names = [os.path.basename(f) for f in found.files]
    (broken / names[0]).unlink()
    with pytest.raises(ValueError, match=f"missing: .*{names[0]}"):
        train(broken)
    # A shard holding other records than the manifest lists: an error, not a short epoch.
    shutil.copy(both / names[1], broken / names[0])
    assert array_records.count(found.files[0]) != array_records.count(found.files[1])
    with pytest.raises(ValueError, match="not the size the manifest lists"):
        train(broken)
    kept = (broken / "manifest.json").read_text()
    listed = json.loads(kept)  # as before sizes were listed: the counts are checked
    for info in listed["splits"].values():
        del info["file_bytes"]
    (broken / "manifest.json").write_text(json.dumps(listed))
    with pytest.raises(ValueError, match="hold .* records; the manifest lists"):
        train(broken)
    (broken / "manifest.json").write_text(kept)
    # A shard cut short: named, with what to do, before anything is read (its size).
    whole = (both / names[0]).read_bytes()
    (broken / names[0]).write_bytes(whole[: len(whole) * 2 // 3])
    said = f"not the size the manifest lists: .*{names[0]} holds {len(whole) * 2 // 3:,} bytes"
    with pytest.raises(ValueError, match=said + ".*tfrecord-pipe verify"):
        train(broken)
    with pytest.raises(ValueError, match="host_count must be >= 1"):
        train(both, host_index=0, host_count=0)
    with pytest.raises(ValueError, match="seed must be an int or None, got 1.5"):
        train(both, seed=1.5)
    # Other types were taken (a str as True) or failed inside Grain.
    for wrong, said in ((dict(batch_size="4"), "batch_size must be an int, got '4'"),
                        (dict(batch_size=4.0), "batch_size must be an int, got 4.0"),
                        (dict(with_keys="no"), "with_keys must be True or False"),
                        (dict(split=["train"]), "split must be a str or None")):  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(said)):
            train(both, **wrong)
    # A pathlib.Path is a path ("argument of type 'PosixPath' is not iterable").
    first = [next(iter(grain.make_dataset(data, is_training=False, batch_size=4, image_size=SIZE)))
             for data in (both, str(both))]  # fmt: skip
    assert isinstance(both, pathlib.Path) and np.array_equal(first[0][1], first[1][1])


@pytest.mark.slow
def test_worker_processes_give_the_batches_of_one_process_and_resume(both):
    # Batches are cut before the workers: each worker makes whole ones, and none drops a
    # remainder of its own (which lost records when each worker batched its own stream).
    count = grain.find_split(str(both), "train").num_examples
    alone = [b[2].tolist() for b in train(both, batch_size=3, num_epochs=1)]
    assert len(alone) == count // 3
    assert [b[2].tolist() for b in train(both, batch_size=3, num_epochs=1,
                                         worker_count=3)] == alone  # fmt: skip
    batches = iter(train(both, worker_count=2))
    seen = [next(batches)[2].tolist() for _ in range(3)]
    state = batches.get_state()
    later = [next(batches)[2].tolist() for _ in range(3)]
    resumed = iter(train(both, worker_count=2))
    resumed.set_state(state)
    assert [next(resumed)[2].tolist() for _ in range(3)] == later
    assert seen + later == keys_batches(train(both), 6)
    # The same batches, but another shape of state: it said "reads other batches".
    with pytest.raises(ValueError, match="saved with worker_count=2, here 0: Grain's state "
                                         "has another shape for each count. Resume with "
                                         "worker_count=2"):  # fmt: skip
        iter(train(both)).set_state(state)
    records = grain.find_split(str(both), "validation").num_examples
    evaluation = list(grain.make_dataset(str(both), is_training=False, batch_size=4,
                                         image_size=SIZE, worker_count=3, host_index=0,
                                         host_count=1))  # fmt: skip
    assert sum(int((b[2] > 0).sum()) for b in evaluation) == records


@pytest.mark.slow
@pytest.mark.parametrize("when", ["workers starting", "workers working", "a forked child lives"])
def test_a_killed_trainer_leaves_no_worker_process_behind(both, when):
    # Grain's workers stop only when told to: a trainer killed with SIGKILL (the OOM killer, a
    # scheduler) left them and their resource tracker running for ever, each busy. Killed
    # while they still start, a first fix missed the ones not yet watching; a second missed
    # them while a process the trainer had forked held their parent's sentinel open.
    first_batch = {
        "workers starting": "import threading; "
        "threading.Thread(target=next, args=(batches,), daemon=True).start()",
        "workers working": "next(batches)",
        "a forked child lives": "next(batches)\n"
        "import os\n"
        "if os.fork() == 0:\n"
        "    time.sleep(60)\n"
        "    os._exit(0)",
    }[when]
    code = (
        "import time\n"
        "from tfrecord_pipe import grain\n"
        f"batches = iter(grain.make_dataset({str(both)!r}, is_training=True, batch_size=2, "
        f"image_size={SIZE}, seed=1, worker_count=2, host_index=0, host_count=1))\n"
        f"{first_batch}\n"
        "print('READY', flush=True)\n"
        "time.sleep(600)\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    never_ready = threading.Timer(120, trainer.kill)  # then READY never comes: a failure
    never_ready.start()
    workers, others = [], []
    try:
        assert trainer.stdout.readline().strip() == "READY"
        deadline = time.monotonic() + 60
        # The workers and Python's resource tracker; killed as soon as they exist.
        while len(workers) < 3 and time.monotonic() < deadline:
            children = children_of(trainer.pid)
            workers = [pid for pid in children if b"multiprocessing" in command_line(pid)]
            others = [pid for pid in children if pid not in workers]  # the forked child
            time.sleep(0.01)
        assert len(workers) == 3, workers
    finally:
        never_ready.cancel()
        trainer.kill()
        trainer.wait(timeout=60)  # (not its output: a worker left behind holds the pipe)
        trainer.stdout.close()
    if when == "a forked child lives":  # Python's resource tracker (idle) ends with the child
        workers = [pid for pid in workers if b"resource_tracker" not in command_line(pid)]
    deadline = time.monotonic() + 30
    while (alive := [pid for pid in workers if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in alive + others:  # (the tracker then ends: no process holds its pipe)
        if running(pid):
            os.kill(pid, signal.SIGKILL)
    assert not alive, f"worker processes {alive} outlived the killed trainer by 30 s"


def command_line(pid: int) -> bytes:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid`, from /proc."""
    found = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    """Whether process `pid` exists and has not ended (a zombie has ended)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def keys_batches(input_, steps) -> list[list[int]]:
    batches = iter(input_)
    return [next(batches)[2].tolist() for _ in range(steps)]


def grain_loop(dataset, work, steps, *more, python=("-m", "examples.grain_loop")):
    """(the command line of examples/grain_loop.py on `dataset`, batches of 4 and a save every
    5 steps, its environment). Forked with the imports done: the runs, not their start, are
    tested. `python`: how the example is run (`-c CODE` for one run with something patched)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    return preloaded_python(*python, dataset, work, "--steps", steps, "--batch_size", "4",
                            "--save_every", "5", *more, env=env), env  # fmt: skip


@pytest.mark.slow
def test_the_grain_example_killed_and_run_again_ends_with_the_uninterrupted_parameters(
    both, tmp_path
):
    def command(work):
        return grain_loop(both, work, 40)[0]

    env = grain_loop(both, tmp_path, 40)[1]
    whole = subprocess.run(command(tmp_path / "whole"), cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert whole.returncode == 0, whole.stderr[-2000:]
    killed = subprocess.Popen(command(tmp_path / "killed"), cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    checkpoint = tmp_path / "killed" / "checkpoint.npz"
    deadline = time.monotonic() + 240
    while not checkpoint.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL, "it ended before it was killed"
    again = subprocess.run(command(tmp_path / "killed"), cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    resumed = re.search(r"resumed at step (\d+)", again.stdout)
    assert resumed and int(resumed.group(1)) < 40, again.stdout  # killed mid-run
    final = [line for line in whole.stdout.splitlines() if line.startswith("parameters")]
    assert final and final == [line for line in again.stdout.splitlines()
                               if line.startswith("parameters")]  # fmt: skip


@pytest.mark.slow  # the Grain example, nine times (forked with its imports done)
def test_the_grain_example_resumes_its_own_work_dir_alone_and_says_what_is_wrong(both, tmp_path):
    # A helper's trial (helper-59): a WORK_DIR with glob characters resumed another run's
    # checkpoint ("exp[1]" matched exp1/) or never its own ("run [1]"); two runs in one
    # WORK_DIR mixed their saves; a damaged checkpoint, a file for WORK_DIR or --save_every 0
    # ended in a traceback.
    def run(*args, **python):
        command, env = grain_loop(both, *args, **python)
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip

    def refused(done, *said):
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert all(part in done.stderr.splitlines()[-1] for part in said), done.stderr[-2000:]

    other, work = tmp_path / "exp1", tmp_path / "exp[1]"
    # (exp1's run on a file system without locks: a word, and the run.)
    no_locks = ("import errno, fcntl, runpy, sys\n"
                "def flock(*_):\n    raise OSError(errno.ENOLCK, 'No locks available')\n"
                "fcntl.flock = flock\nsys.argv[0] = 'grain_loop'\n"
                "runpy.run_module('examples.grain_loop', run_name='__main__')")  # fmt: skip
    unlocked = run(other, 5, python=("-c", no_locks))
    assert unlocked.returncode == 0, unlocked.stderr[-2000:]
    assert "warning: no lock on" in unlocked.stderr and "(saved)" in unlocked.stdout
    first = run(work, 10)
    assert first.returncode == 0 and "resumed" not in first.stdout, first.stdout
    again = run(work, 15)
    assert again.returncode == 0 and "resumed at step 10" in again.stdout, again.stdout
    # In the example's words: its flags, and how to start afresh.
    refused(run(work, 20, "--batch_size", "2"), "batch_size: saved 4, here 2",
            "Run with the flags that saved it (--batch_size, --seed, --workers), or give another")
    refused(run(work, 20, "--eval_split", "tests"), "no split 'tests'",
            "pass --eval_split one of those")  # fmt: skip
    refused(run(tmp_path / "new", 5, "--distributed"), "coordinator_address",
            "--coordinator HOST:PORT", "leave --distributed out")  # fmt: skip
    # While a run trains there (it has saved), a second one is refused; killed, it lets go.
    command, env = grain_loop(both, work, 10**6, "--save_every", "1")
    training = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert any("(saved)" in line for line in training.stdout), training.stderr.read()
        refused(run(work, 20), f"another run is training in {work}", "another WORK_DIR")
    finally:
        training.kill()
        training.communicate(timeout=60)  # (ends as the run ends: it holds the pipes)
    done = run(work, 1)  # it has gone past step 1: it evaluates alone
    assert done.returncode == 0 and "resumed at step" in done.stdout, done.stderr[-2000:]
    checkpoint = work / "checkpoint.npz"
    checkpoint.write_bytes(checkpoint.read_bytes()[:200])
    refused(run(work, 20), f"the checkpoint {checkpoint} cannot be read",
            "Delete it (the run then starts from step 0)")  # fmt: skip
    refused(run(tmp_path / "new", 5, "--save_every", "0"), "--save_every", "must be 1 or more")
    refused(run(checkpoint, 5), f"WORK_DIR {checkpoint} is a file")
    refused(run(checkpoint / "below", 5), f"WORK_DIR {checkpoint / 'below'} cannot be made")


def test_a_split_of_no_records_is_refused_saying_where_its_inputs_went(tmp_path):
    write_image_folder(tmp_path / "src" / "train", per_label=2)
    (tmp_path / "src" / "validation" / "red").mkdir(parents=True)
    (tmp_path / "src" / "validation" / "red" / "cut.jpg").write_bytes(b"\xff\xd8\xff")
    out = tmp_path / "out"
    convert.run([str(tmp_path / "src"), str(out), "--formats", "tfrecord,array_record",
                 *IN_PROCESS])  # fmt: skip
    rejected = out / "rejected" / "rejected-validation.jsonl"
    assert "cut.jpg" in rejected.read_text()
    with pytest.raises(ValueError, match="'validation' of .* has no records: every input was "
                                         f"rejected \\({re.escape(str(rejected))} says why\\)"):
        grain.make_dataset(str(out), split="validation", is_training=False, image_size=16,
                           batch_size=1)  # fmt: skip
