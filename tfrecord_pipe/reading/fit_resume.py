"""Keras `fit` resumed at the exact next batch after a preemption.

Keras 3's `BackupAndRestore(save_freq=N)` saves the weights (the optimizer's step count with
them) every N steps, but restores only the epoch number: a killed `fit` replays its epoch from
the first batch. With a seeded input every batch is a function of its position, so the step
count the weights hold says where the input goes on. `FitResume`, beside the backup, restores
before `fit` builds its input, starts the input at that step, and makes the interrupted epoch
end where it would have ended:

    backup = keras.callbacks.BackupAndRestore(backup_dir, save_freq=50)
    resume = distribute.FitResume(backup, steps_per_epoch=steps)
    data = resume.restore(model, train_fn, strategy)   # None: no tf.distribute strategy
    model.fit(data, epochs=epochs, steps_per_epoch=steps, callbacks=[backup, resume])

The position comes from the weights file itself, so it cannot disagree with the weights (the
backup writes its epoch file after the weights; a kill between the two leaves them apart).
"""

from __future__ import annotations

import tensorflow as tf

from tfrecord_pipe.reading import distribute


class FitResume(tf.keras.callbacks.Callback):
    """Resumes a killed `fit` at the exact next batch, beside `BackupAndRestore`.

    Args:
      backup: the run's `keras.callbacks.BackupAndRestore` (any `save_freq`).
      steps_per_epoch: the `steps_per_epoch` given to `fit` (a seeded training input repeats,
        so Keras counts an epoch in steps).
    """

    def __init__(self, backup: tf.keras.callbacks.BackupAndRestore, steps_per_epoch: int):
        super().__init__()
        if not isinstance(backup, tf.keras.callbacks.BackupAndRestore):
            raise TypeError(
                f"FitResume goes beside a keras.callbacks.BackupAndRestore; got "
                f"{type(backup).__name__}"
            )
        if not isinstance(steps_per_epoch, int) or steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be a positive int, got {steps_per_epoch!r}")
        self.backup = backup
        self.steps_per_epoch = steps_per_epoch
        self.restored_steps: int | None = None  # steps the restored weights were trained for
        self._restored_into = None
        self._left_in_epoch = 0  # steps of the interrupted epoch still to run, then its end
        self._cut = False

    def restore(self, model, input_fn, strategy: tf.distribute.Strategy | None = None):
        """Restores `model` from the backup (nothing happens on a first run) and returns the
        input for `fit`, from the step after the restored one: distributed over `strategy`,
        or `input_fn`'s dataset when there is none (Keras on JAX)."""
        config = getattr(input_fn, "config", None)
        if config is None or not config.seeded:
            raise ValueError(
                "FitResume needs a seeded training input: make_input_fn(..., is_training=True, "
                "seed=...). Without a seed the batches after a restart are not the ones that "
                "would have come."
            )
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError("Compile the model before FitResume.restore (its optimizer counts "
                             "the steps trained)")  # fmt: skip
        self.backup.set_model(model)
        self.backup.on_train_begin()  # the backup's own restore; fit's repeats it harmlessly
        self._restored_into = model
        self.restored_steps = int(optimizer.iterations.numpy())
        if strategy is None:
            return input_fn(start_batches=self.restored_steps)
        return distribute.distribute(strategy, input_fn, start_steps=self.restored_steps)

    def on_train_begin(self, logs=None):
        if self._restored_into is None or self.model is not self._restored_into:
            raise RuntimeError(
                "Call resume.restore(model, input_fn, strategy) before fit, and give fit the "
                "input it returns: the input must start where the restored weights stopped."
            )
        steps = self.params.get("steps")
        if steps != self.steps_per_epoch:
            raise ValueError(
                f"fit runs {steps} steps per epoch, FitResume was told {self.steps_per_epoch}: "
                "give both the same steps_per_epoch."
            )
        per_execution = int(getattr(self.model, "steps_per_execution", 1) or 1)
        if self.steps_per_epoch % per_execution:
            raise ValueError(
                f"steps_per_epoch={self.steps_per_epoch} is not a multiple of "
                f"steps_per_execution={per_execution}: Keras then runs past the epoch's end, "
                "and a resumed epoch could not end where the first run's did."
            )
        epoch, done = divmod(self.restored_steps, self.steps_per_epoch)
        # After the backup's on_train_begin (it sets the epoch from its own file).
        self.model._initial_epoch = epoch
        self._first_epoch = epoch
        self._left_in_epoch = self.steps_per_epoch - done if done else 0

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self._first_epoch and self.model._initial_epoch != self._first_epoch:
            raise RuntimeError("Put FitResume after BackupAndRestore in fit's callbacks.")

    def on_train_batch_end(self, batch, logs=None):
        if self._left_in_epoch and batch + 1 >= self._left_in_epoch:
            # The interrupted epoch's last step: end it here, as the first run did (a stop
            # another callback asked for stays asked for).
            self._left_in_epoch = 0
            self._cut = not self.model.stop_training
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        if self._cut:
            self._cut = False
            self.model.stop_training = False  # only the epoch ended; training goes on
