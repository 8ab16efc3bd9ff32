"""distribute.py and the training examples: the resolver's choices, real fit and custom-loop
steps under the default strategy and under MirroredStrategy with two replicas."""

import dataclasses
import json
import math
import os
import pathlib
import socket
import subprocess

import pytest
import tensorflow as tf

from examples import custom_loop, train
from tfrecord_pipe._reading import distribute

from dataset_factory import accuracy_on, loss_on, write_dataset
from preloaded import python as preloaded_python

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "tpu, environ, devices, gpus, kind, target",
    [
        ("my-tpu", {}, [], 0, distribute.TPU, "my-tpu"),
        (None, {"TPU_NAME": "pod-1"}, [], 4, distribute.TPU, "pod-1"),
        (None, {}, ["/dev/accel0", "/dev/accel1"], 0, distribute.TPU, "local"),
        ("", {}, [], 2, distribute.GPUS, None),
        (None, {}, [], 0, distribute.CPU, None),
    ],
)
def test_choose_prefers_a_named_or_present_tpu_then_gpus_then_cpu(
    tpu, environ, devices, gpus, kind, target
):
    choice = distribute.choose(tpu, environ, devices, gpus)
    assert (choice.kind, choice.tpu) == (kind, target)
    assert choice.reason


def test_without_accelerators_the_default_strategy_is_used_and_said(capsys, monkeypatch):
    # Said without logging set up: which strategy, and how many replicas, is what users check.
    monkeypatch.delenv("TPU_NAME", raising=False)
    strategy = distribute.resolve_strategy()
    assert strategy.num_replicas_in_sync == 1
    said = capsys.readouterr().err
    assert "using default strategy (1 replica)" in said and "no TPU and no GPU" in said


def test_an_unreachable_tpu_address_fails_fast_with_what_to_check():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(distribute.TpuUnavailableError, match="cannot be reached"):
        distribute.resolve_strategy(tpu=f"grpc://127.0.0.1:{port}")


def test_a_tpu_name_that_does_not_resolve_says_what_to_check():
    with pytest.raises(distribute.TpuUnavailableError, match="Check the TPU name, zone"):
        distribute.resolve_strategy(tpu="no-such-tpu-here")


def test_a_global_batch_must_split_evenly_among_replicas():
    strategy = tf.distribute.get_strategy()
    assert distribute.per_replica_batch_size(32, strategy) == 32

    class TwoReplicas:
        num_replicas_in_sync = 2

    assert distribute.per_replica_batch_size(32, TwoReplicas()) == 16
    with pytest.raises(ValueError, match="multiple of 2"):
        distribute.per_replica_batch_size(33, TwoReplicas())


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """4 train shards (20 records), 2 validation shards (11 records)."""
    folder = str(tmp_path_factory.mktemp("distribute") / "ds")
    write_dataset(
        folder,
        {"train": [[0, 1, 2, 0, 1]] * 4, "validation": [[0, 1, 2, 0, 1, 2], [0, 1, 2, 0, 1]]},
        size=(20, 20),
    )
    return folder


@pytest.mark.slow
def test_fit_evaluate_and_custom_loop_under_the_default_strategy(dataset, tmp_path):
    strategy = tf.distribute.get_strategy()
    config = train.TrainConfig(image_size=16, global_batch_size=4, epochs=1, steps_per_execution=2)
    model = train.train(strategy, dataset, str(tmp_path / "backup"), config)
    evaluated = train.evaluate(strategy, model, dataset, config)
    # Padded evaluation scores exactly the 11 records, each once.
    assert evaluated["images"] == 11
    assert evaluated["accuracy"] == pytest.approx(accuracy_on(model, dataset, 16))
    assert evaluated["loss"] == pytest.approx(loss_on(model, dataset, 16), rel=1e-4)
    # Stopped after an epoch and run again from its checkpoint, the loop goes on at the next
    # step, with the batches (and so the loss) of a run that was never stopped.
    tf.keras.utils.set_random_seed(3)
    looped = custom_loop.run(strategy, dataset, config, str(tmp_path / "loop"))
    assert looped["images"] == 11
    assert math.isfinite(looped["loss"])
    two_epochs = dataclasses.replace(config, epochs=2)
    resumed = custom_loop.run(strategy, dataset, two_epochs, str(tmp_path / "loop"))
    tf.keras.utils.set_random_seed(3)
    whole = custom_loop.run(strategy, dataset, two_epochs)
    assert (resumed["steps"], whole["steps"]) == (4, 8)
    assert resumed["loss"] == pytest.approx(whole["loss"], rel=1e-4)


@pytest.mark.slow
def test_fit_and_custom_loop_with_two_replicas(dataset):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    done = subprocess.run(
        preloaded_python(ROOT / "tests" / "strategy_run.py", dataset),
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(li for li in done.stdout.splitlines() if li.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result["replicas"] == 2
    # One input pipeline on this one machine, reading every file, each replica half the batch.
    assert result["contexts"] == [[1, 0, 4]]
    assert result["per_replica_images"] == [[4, 16, 16, 3], [4, 16, 16, 3]]
    assert result["fit_accuracy"] == pytest.approx(result["accuracy_on_every_record"])
    assert result["custom_loop_images"] == 11
    assert math.isfinite(result["custom_loop_loss"])
    # The padded evaluation's loss over two replicas is the records' mean at any batch size
    # (Keras ran a step too many, counting 24 slots for 16, until distribute() fixed it).
    before_fit = result["loss_on_every_record_before_fit"]
    assert result["fit_loss"] == pytest.approx(before_fit, rel=1e-4)
    assert result["losses_by_batch"]["2"] == pytest.approx(before_fit, rel=1e-4)
    assert result["losses_by_batch"]["32"] == pytest.approx(before_fit, rel=1e-4)
    assert result["val_loss"] == pytest.approx(result["loss_on_every_record"], rel=1e-4)
    # eval_remainder="drop": the loss of the whole global batches kept (11 records, batch 6:
    # one), as on one replica; it was off, with no word, where a replica's remainder was.
    assert result["drop_records_kept"] == 6
    assert result["drop_loss"] == pytest.approx(result["drop_loss_of_kept"], rel=1e-4)
