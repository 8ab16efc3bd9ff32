"""A training run that checkpoints its input as a real one would, and can be killed: what the
preemption tests run in fresh processes, once killed with SIGKILL mid-epoch and once resumed.

    python tests/resume_run.py MODE DATASET WORKDIR STEPS [KILL_AT]

MODE:
  loop      a custom loop, tf.train.CheckpointManager over model, optimizer, step and the
            tf.data iterator (every 5 steps)
  mirrored  the same under a MirroredStrategy of two logical CPUs, checkpointing the
            distributed iterator
  jax0/jax1 host 0 or 1 of 2 feeding JAX: numpy batches, their state saved beside the step
            in a JSON file (every 5 steps)
  fit       Keras fit, epochs of 6 steps, 2 steps per execution, BackupAndRestore(save_freq=3)
            with FitResume beside it
  fit_mirrored  the same under a MirroredStrategy of two logical CPUs, 1 step per execution
  fit_term  fit, its backup with double_checkpoint=True, sent SIGTERM instead of SIGKILL (a
            spot VM's notice): FitResume saves after the step in flight, then the run ends
  fit_jax   Keras fit under KERAS_BACKEND=jax (set by the caller): no per-step log (the
            steps are JAX's), but the final weights' hash, "WEIGHTS sha", at the end

Each step appends "STEP s KEYS k,k,... PIXELS sha" to WORKDIR/log (under fit_mirrored one line
per replica, with "REPLICA r" after it; fit also logs "EPOCH e ENDS s" at each epoch's end);
the run kills itself with SIGKILL (fit_term: SIGTERM) right after step KILL_AT.
"""

import contextlib
import hashlib
import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SIZE, BATCH, SEED, EVERY = 16, 4, 11, 5


def log_step(workdir, step, keys, images, replica=None):
    pixels = hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest()[:16]
    which = "" if replica is None else f" REPLICA {replica}"
    log_line(workdir, f"STEP {step} KEYS {','.join(map(str, keys))} PIXELS {pixels}{which}")


def log_line(workdir, line):
    with open(os.path.join(workdir, "log"), "a") as log:
        log.write(line + "\n")
        log.flush()
        os.fsync(log.fileno())


def mirrored_cpus():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def model():
    inputs = tf.keras.Input((SIZE, SIZE, 3))
    x = tf.keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(3)(x))


def tensorflow_run(mode, dataset, workdir, steps, kill_at):
    from tfrecord_pipe import distribute, reader

    strategy = mirrored_cpus() if mode == "mirrored" else tf.distribute.get_strategy()
    input_fn = reader.make_input_fn(
        dataset, is_training=True, image_size=SIZE, batch_size=BATCH, seed=SEED, with_keys=True
    )
    with strategy.scope():
        net, optimizer = model(), tf.keras.optimizers.SGD(0.01)
        step = tf.Variable(0, dtype=tf.int64)
    if mode == "mirrored":
        iterator = distribute.resumable_iterator(strategy, input_fn)
    else:
        iterator = iter(input_fn())
    checkpoint = tf.train.Checkpoint(model=net, optimizer=optimizer, step=step, iterator=iterator)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(workdir, "ckpt"), max_to_keep=2)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_consumed()
        print("RESTORED", int(step.numpy()), flush=True)

    def train_step(images, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(labels, net(images), True)
            )
        optimizer.apply_gradients(zip(tape.gradient(loss, net.trainable_variables),
                                      net.trainable_variables))  # fmt: skip

    @tf.function
    def distributed_step(images, labels):
        strategy.run(train_step, args=(images, labels))

    while step.numpy() < steps:
        images, labels, keys = next(iterator)
        distributed_step(images, labels)
        local = strategy.experimental_local_results
        log_step(workdir, int(step.numpy()),
                 np.concatenate([k.numpy() for k in local(keys)]),
                 np.concatenate([i.numpy() for i in local(images)]))  # fmt: skip
        step.assign_add(1)
        if step.numpy() % EVERY == 0:
            manager.save()
        if step.numpy() == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def fit_run(mode, dataset, workdir, steps, kill_at):
    from tfrecord_pipe import distribute, reader

    strategy = mirrored_cpus() if mode == "fit_mirrored" else None
    per_execution = 1 if strategy else 2  # Keras fails with more under MirroredStrategy
    on_jax = mode == "fit_jax"
    input_fn = reader.make_input_fn(
        dataset, is_training=True, image_size=SIZE, batch_size=BATCH, seed=SEED,
        with_keys=not on_jax,
    )  # fmt: skip

    def steps_done(model):
        return int(tf.keras.ops.convert_to_numpy(model.optimizer.iterations))

    class Logged(tf.keras.Model):
        """Logs the keys and pixels of each step's batch, as it trains on it."""

        def train_step(self, data):
            images, labels, keys = data
            context = tf.distribute.get_replica_context()
            replica = context.replica_id_in_sync_group if strategy else -1
            tf.py_function(self.log, [self.optimizer.iterations, keys, images, replica], [])
            return super().train_step((images, labels))

        def log(self, step, keys, images, replica):
            replica = int(replica) if int(replica) >= 0 else None
            log_step(workdir, int(step), keys.numpy(), images.numpy(), replica)

    class Ends(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if steps_done(self.model) == kill_at:
                os.kill(os.getpid(), signal.SIGTERM if mode == "fit_term" else signal.SIGKILL)

        def on_epoch_end(self, epoch, logs=None):
            log_line(workdir, f"EPOCH {epoch} ENDS {steps_done(self.model)}")

    tf.keras.utils.set_random_seed(SEED)  # the same initial weights in every run
    with strategy.scope() if strategy else contextlib.nullcontext():
        base = model()
        net = base if on_jax else Logged(base.inputs, base.outputs)
        net.compile(optimizer=tf.keras.optimizers.SGD(0.01), jit_compile=False,
                    steps_per_execution=per_execution,
                    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # fmt: skip
    backup = tf.keras.callbacks.BackupAndRestore(os.path.join(workdir, "backup"), save_freq=3,
                                                 double_checkpoint=mode == "fit_term")  # fmt: skip
    resume = distribute.FitResume(backup, steps_per_epoch=6)
    data = resume.restore(net, input_fn, strategy)
    if resume.restored_steps:
        print("RESTORED", resume.restored_steps, flush=True)
    net.fit(data, epochs=steps // 6, steps_per_epoch=6, verbose=0, shuffle=False,
            callbacks=[backup, resume, Ends()])  # fmt: skip
    weights = b"".join(np.asarray(w).tobytes() for w in net.get_weights())
    log_line(workdir, f"WEIGHTS {hashlib.sha256(weights).hexdigest()[:16]}")


def jax_run(host, dataset, workdir, steps, kill_at):
    import jax.numpy as jnp

    from tfrecord_pipe import reader

    input_fn = reader.make_input_fn(
        dataset, is_training=True, image_size=SIZE, batch_size=BATCH, seed=SEED,
        with_keys=True, host_index=host, host_count=2,
    )  # fmt: skip
    batches = input_fn.numpy_batches()
    saved = os.path.join(workdir, "state.json")
    step = 0
    if os.path.exists(saved):
        with open(saved) as f:
            state = json.load(f)
        step = state["step"]
        batches.set_state(state["input"])
        print("RESTORED", step, flush=True)
    for images, labels, keys in batches:
        float(jnp.mean(jnp.asarray(images)))  # a real JAX computation on the batch
        log_step(workdir, step, keys, images)
        step += 1
        if step % EVERY == 0:
            with open(saved + ".tmp", "w") as f:
                json.dump({"step": step, "input": batches.get_state()}, f)
            os.replace(saved + ".tmp", saved)
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if step >= steps:
            break


if __name__ == "__main__":
    mode, dataset, workdir, steps = sys.argv[1:5]
    kill_at = int(sys.argv[5]) if len(sys.argv) > 5 else -1
    if mode.startswith("jax"):
        jax_run(int(mode[3:]), dataset, workdir, int(steps), kill_at)
    elif mode.startswith("fit"):
        fit_run(mode, dataset, workdir, int(steps), kill_at)
    else:
        tensorflow_run(mode, dataset, workdir, int(steps), kill_at)
    # Without Python's teardown of what TensorFlow made (a CPU-second in each run of the
    # suite's): everything is written and closed by now.
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)
