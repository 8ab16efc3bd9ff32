"""A custom training loop, as many TPU users write it: `strategy.run` inside a `tf.function`
that runs several steps per call, then a padded evaluation loop that counts every image once.

    python -m examples.custom_loop DATASET_DIR [--tpu NAME] [--epochs 5] [--batch_size 64]
                                   [--checkpoint_dir DIR]

DATASET_DIR is a dataset written by `tfrecord-pipe convert` (or examples/train.py). With
--checkpoint_dir, the model, the optimizer and the input's position are saved after every
call; run again with the same folder after a preemption, it goes on at the next step, with
the batches an uninterrupted run would have had (the input is seeded).
"""

from __future__ import annotations

import argparse

from tfrecord_pipe import tensorflow_start

tensorflow_start.start()  # before TensorFlow loads: its start-up lines held back (README)

import tensorflow as tf  # noqa: E402

from examples import train as fit_example  # noqa: E402
from tfrecord_pipe import dataset, distribute, reader  # noqa: E402


def make_train_steps(strategy, model, optimizer, global_batch_size: int):
    """A tf.function running `steps` training steps on the replicas per call; returns the loss."""
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )

    def step(images, labels):
        with tf.GradientTape() as tape:
            per_example = loss_fn(labels, model(images, training=True))
            # Averaged over the GLOBAL batch: replicas' gradients are summed, not averaged.
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_steps(iterator, steps):
        total = tf.constant(0.0)
        for _ in tf.range(steps):  # one host call, many device steps
            losses = strategy.run(step, args=next(iterator))
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
        return total / tf.cast(steps, tf.float32)

    return train_steps


def make_eval_step(strategy, model, global_batch_size: int):
    """A tf.function giving (correct, records, loss) of one padded batch, over all replicas.

    Padding weighs 0 and every record the same (`reader.padded_weight`), so the mean of the
    steps' losses, each averaged over the global batch's slots, is the loss over the records.
    """
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE
    )

    def step(images, labels, weights):
        logits = model(images, training=False)
        real = tf.cast(weights > 0, tf.float32)
        predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
        correct = tf.cast(tf.equal(predicted, labels), tf.float32) * real
        loss = tf.nn.compute_average_loss(
            loss_fn(labels, logits), sample_weight=weights, global_batch_size=global_batch_size
        )
        return tf.reduce_sum(correct), tf.reduce_sum(real), loss

    @tf.function
    def eval_step(batch):
        correct, counted, loss = strategy.run(step, args=batch)
        return tuple(
            strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
            for value in (correct, counted, loss)
        )

    return eval_step


def run(strategy, dataset_dir: str, config: fit_example.TrainConfig,
        checkpoint_dir: str | None = None) -> dict:  # fmt: skip
    """Trains with the custom loop (from the last checkpoint in `checkpoint_dir`, if any, saving
    one after each call) and evaluates; returns the last training loss, the steps this run
    trained, and the evaluation's accuracy, images counted and loss."""
    found = dataset.read_manifest(dataset_dir)
    train_fn = reader.make_input_fn(
        dataset_dir, is_training=True, image_size=config.image_size,
        batch_size=config.global_batch_size, seed=config.seed,
    )  # fmt: skip
    eval_fn = reader.make_input_fn(
        dataset_dir, is_training=False, image_size=config.image_size,
        batch_size=config.global_batch_size,
    )  # fmt: skip
    with strategy.scope():
        model = fit_example.build_model(len(found.labels), config.image_size)
        optimizer = tf.keras.optimizers.Adam(config.learning_rate)
        # Create the optimizer's slots now: created lazily inside the multi-step tf.function
        # they would be born inside a loop on each replica, which TensorFlow cannot do.
        optimizer.build(model.trainable_variables)
    train_steps = make_train_steps(strategy, model, optimizer, config.global_batch_size)
    eval_step = make_eval_step(strategy, model, config.global_batch_size)

    # Saved with the model: a count of steps, from which the input is rebuilt on restore.
    iterator = distribute.resumable_iterator(strategy, train_fn)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, iterator=iterator)
    manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, 2) if checkpoint_dir else None
    if manager and manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    per_call = config.steps_per_execution
    steps_per_epoch = max(1, found.splits["train"].num_examples // config.global_batch_size)
    steps_per_epoch = max(per_call, steps_per_epoch // per_call * per_call)  # whole calls
    total = config.epochs * steps_per_epoch
    iterator.in_function()  # a checkpoint of another input is refused here, before a word
    done = first = int(iterator.steps.numpy())  # steps trained before a restore
    if first:
        finished = ": training was done" if first >= total else ""
        print(f"      resumed from {manager.latest_checkpoint} at step {first}{finished}")
    loss = float("nan")
    while done < total:
        count = min(per_call, total - done)
        # Passed on every call (a restore replaces it); each step is counted as it is taken.
        loss = float(train_steps(iterator.in_function(), tf.constant(count)))
        done += count
        if manager:
            manager.save()
        if done % steps_per_epoch == 0:
            print(f"      epoch {done // steps_per_epoch}/{config.epochs}: loss {loss:.3f}")

    correct = counted = eval_loss = 0.0
    steps = 0
    for batch in distribute.distribute(strategy, eval_fn):
        batch_correct, batch_counted, batch_loss = eval_step(batch)
        correct += float(batch_correct)
        counted += float(batch_counted)
        eval_loss += float(batch_loss)
        steps += 1
    return {"loss": loss, "steps": max(0, total - first),
            "accuracy": correct / counted, "images": int(counted),
            "eval_loss": eval_loss / max(steps, 1)}  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("dataset_dir")
    parser.add_argument("--tpu", default=None)
    parser.add_argument("--epochs", type=int, default=fit_example.TrainConfig.epochs)
    parser.add_argument("--batch_size", type=int, default=fit_example.TrainConfig.global_batch_size)
    parser.add_argument("--image_size", type=int, default=fit_example.TrainConfig.image_size)
    parser.add_argument("--checkpoint_dir", default=None,
                        help="where to save and resume from (local or gs://)")  # fmt: skip
    args = parser.parse_args(argv)
    config = fit_example.TrainConfig(
        image_size=args.image_size, global_batch_size=args.batch_size, epochs=args.epochs
    )
    strategy = distribute.resolve_strategy(args.tpu)
    print(f"custom loop under {distribute.describe(strategy)}")
    result = run(strategy, args.dataset_dir, config, args.checkpoint_dir)
    print(f"validation: accuracy {result['accuracy']:.3f} on all {result['images']} images")
    return result


if __name__ == "__main__":
    from examples import command

    command.run(main)
