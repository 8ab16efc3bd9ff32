"""Keras `fit` resumed at the exact next batch after a preemption.

Keras 3's `BackupAndRestore(save_freq=N)` saves the weights (the optimizer's step count with
them) every N steps, but restores only the epoch number: a killed `fit` replays its epoch from
the first batch. With a seeded input every batch is a function of its position, so the step
count the weights hold says where the input goes on. `FitResume`, beside the backup, restores
before `fit` builds its input, starts the input at that step, and makes the interrupted epoch
end where it would have ended:

    backup = keras.callbacks.BackupAndRestore(backup_dir, save_freq=50, double_checkpoint=True)
    resume = distribute.FitResume(backup, steps_per_epoch=steps)
    data = resume.restore(model, train_fn, strategy)   # None: no tf.distribute strategy
    model.fit(data, epochs=epochs, steps_per_epoch=steps, callbacks=[backup, resume])

The position comes from the weights file itself, so it cannot disagree with the weights (the
backup writes its epoch file after the weights; a kill between the two leaves them apart).
What the position means (the dataset, seed, batch, host share, epoch length) is kept beside
the backup, and a restart with other settings is refused. On SIGTERM (a spot VM's notice) the
backup is saved after the step in flight, and the process then ends as SIGTERM ends it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid

import tensorflow as tf

from tfrecord_pipe._reading import distribute, epochs, held_term, seeded

log = logging.getLogger(__name__)

FACTS_NAME = "tfrecord_pipe_position.json"  # in the backup's folder: what its steps mean
START_NAME = "tfrecord_pipe_start.json"  # and the optimizer's step count when the run began
# Kept in that file beside the settings, never compared: which run writes the backup, or that
# two did (`_still_ours`).
_RUN, _BY, _CONFLICT = "run", "written_by", "conflict"


def facts_name(context) -> str:
    """The file of one host's facts in the backup's folder: FACTS_NAME on one host, a name of
    each host's own where hosts share the folder (each reads its own share of the records)."""
    index, count = (context.input_pipeline_id, context.num_input_pipelines) if context else (0, 1)
    if count == 1:
        return FACTS_NAME
    stem, suffix = os.path.splitext(FACTS_NAME)
    return f"{stem}.host-{index:05d}-of-{count:05d}{suffix}"


class _EpochCut:
    """What FitResume sets `stop_training` to when it ends an interrupted epoch: true enough
    for Keras to end the epoch, and told apart from a stop another callback asks for."""

    def __bool__(self):
        return True


_CUT = _EpochCut()


class FitResume(tf.keras.callbacks.Callback):
    """Resumes a killed `fit` at the exact next batch, beside `BackupAndRestore`.

    Args:
      backup: the run's `keras.callbacks.BackupAndRestore` (any `save_freq`;
        `double_checkpoint=True` survives a kill while the weights are written).
      steps_per_epoch: the `steps_per_epoch` given to `fit` (a seeded training input repeats,
        so Keras counts an epoch in steps).
      save_on_sigterm: on SIGTERM (a spot VM's notice) during an epoch's steps, save the
        backup once the step in flight ends, then end as SIGTERM would have (`held_term.py`;
        as the epoch ends, end without a save, so that the restart runs its end). Only with
        `double_checkpoint=True` (the VM may stop before the save ends), on one worker, in
        the main thread, where the program has no SIGTERM handler or wakeup pipe of its own.

    Give `fit` the input `restore` returns: another input is not detected.
    """

    def __init__(self, backup: tf.keras.callbacks.BackupAndRestore, steps_per_epoch: int,
                 save_on_sigterm: bool = True):  # fmt: skip
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
        self.save_on_sigterm = save_on_sigterm
        self._held: held_term.HeldTerm | None = None  # SIGTERM, while fit runs
        self._workers = 1
        self.restored_steps: int | None = None  # steps of this run the restored weights hold
        self._restored_into = None
        self._first_epoch: int | None = None  # the epoch fit must start at; checked once
        self._left_in_epoch = 0  # steps of the interrupted epoch still to run, then its end
        self._facts_path: str | None = None  # this run's record, with its id
        self._run = self._by = ""

    def restore(self, model, input_fn, strategy: tf.distribute.Strategy | None = None):
        """Restores `model` from the backup (nothing happens on a first run) and returns the
        input for `fit`, from the step after the restored one: distributed over `strategy`,
        or `input_fn`'s dataset when there is none (Keras on JAX).

        Raises:
          ValueError: not a seeded input, an optimizer whose step count is not the steps
            trained, or a backup saved with other settings (dataset, seed, batch, hosts,
            replicas, steps per epoch).
        """
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
        if not model.built:  # Keras's own refusal names fit, which the caller has not called
            raise ValueError(
                "Build the model before FitResume.restore, which restores the backup into its "
                "weights: give it its input shape (tf.keras.Input((size, size, 3)) as its first "
                "layer), or call model.build((None, size, size, 3))."
            )
        _check_counts_steps(optimizer)
        before = _steps(optimizer)
        self.backup.set_model(model)
        _without_a_cut_epoch_file(self.backup)
        try:
            self.backup.on_train_begin()  # the backup's own restore; fit's repeats it harmlessly
        except OSError as err:  # its weights file cannot be read, nor a copy of an earlier one
            _start_afresh_if_none_was_whole(self.backup, err)
            self.backup.on_train_begin()
        self._restored_into = model
        restored = tf.io.gfile.exists(self.backup._weights_path)  # (Keras 3's name; after
        # the restore: a torn first backup is set aside)
        self.restored_steps = self._steps_of_this_run(before, _steps(optimizer), restored)
        if self.restored_steps:  # in the run's log, where Keras's own restore says nothing
            epoch, step = divmod(self.restored_steps, self.steps_per_epoch)
            print(f"FitResume: resumed from {self.backup.backup_dir} after step "
                  f"{self.restored_steps} (epoch {epoch + 1}, step {step} of "
                  f"{self.steps_per_epoch})", flush=True)  # fmt: skip

        contexts = []

        def pipeline(context, start_batches=0):
            contexts.append(context)
            return input_fn(context, start_batches=start_batches)

        pipeline.config = config
        in_multi_worker_mode = getattr(strategy.extended, "_in_multi_worker_mode", None) \
            if strategy is not None else None  # fmt: skip
        self._workers = 2 if in_multi_worker_mode and in_multi_worker_mode() else 1
        if strategy is None:
            context = input_fn.host_context()
            data = input_fn(start_batches=self.restored_steps)
        else:
            data = distribute.distribute(strategy, pipeline, start_steps=self.restored_steps)
            context = contexts[0]
        self._keep_facts(_facts(config, context, self.steps_per_epoch), facts_name(context),
                         batch_of="a replica's" if strategy is not None else "this host's")
        return data

    def _steps_of_this_run(self, before: int, after: int, restored: bool) -> int:
        """The steps this run trained before its restart: the restored optimizer's count
        (`after`) less its count when the run began (a model trained or loaded before counted
        steps of its own), which is kept beside the backup. A restart that builds a fresh
        model, where the run began from a trained one, has no other way to know it. Where no
        backup was `restored`, the run begins here, with the count `before`. (A backup saved
        before 0.5 has no such file: `before` is taken off, as it was then.)"""
        path = os.path.join(self.backup.backup_dir, START_NAME)
        if not restored:
            _write_whole(path, {"optimizer_steps": before})
            return 0
        try:
            began = _read_record(path)["optimizer_steps"]
        except tf.errors.NotFoundError:
            return after - before
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"{path}, which says how many steps the model had when the run began, is "
                f"damaged ({err!r}): the backup cannot be resumed safely. Delete "
                f"{self.backup.backup_dir} to train from the start."
            ) from None
        return after - began

    def _keep_facts(self, facts: dict, name: str, batch_of: str) -> None:
        """Refuses a backup saved with other settings, or whose settings are lost (their file
        removed, damaged, or never written: a backup made before FitResume was used);
        records these beside a new one, replaced whole, in this host's file `name`.
        `batch_of`: whose batch the facts' batch_size is."""
        folder = self.backup.backup_dir
        path = os.path.join(folder, name)
        start_afresh = f"Delete {folder} to train from the start."
        saved = None
        if tf.io.gfile.exists(path):
            with tf.io.gfile.GFile(path) as f:
                text = f.read()
            try:
                saved = json.loads(text)
            except ValueError as err:
                if self.restored_steps:
                    raise ValueError(
                        f"{path}, which says what the backup's steps mean, is damaged ({err}): "
                        f"the backup cannot be resumed safely. {start_afresh}"
                    ) from None
        if self.restored_steps and isinstance(saved, dict) and saved.get(_CONFLICT):
            raise ValueError(
                f"Two runs wrote the backup in {folder} at once ({saved[_CONFLICT]}): its "
                f"weights and steps may be either's, so it cannot be resumed safely. "
                f"{start_afresh} Give each run a backup folder of its own."
            )
        if self.restored_steps and not isinstance(saved, dict):
            stem, suffix = os.path.splitext(FACTS_NAME)
            others = sorted(other for other in tf.io.gfile.listdir(folder)
                            if other.startswith(stem) and other.endswith(suffix))  # fmt: skip
            if not others:
                why = "removed, or the backup was made before FitResume was used"
            elif others == [FACTS_NAME]:
                why = (f"the backup holds {FACTS_NAME}, one file for every host: written on "
                       "one host, or on several by tfrecord-pipe before 0.5, where the last "
                       "host to write it decided what it says")
            else:
                why = (f"the backup holds {', '.join(others[:2])}: saved by a run of another "
                       "number of hosts?")
            raise ValueError(
                f"The backup in {folder} holds {self.restored_steps} steps, but not what they "
                f"mean: {name} is missing ({why}), so its position may mean other batches. "
                f"{start_afresh}"
            )
        settings = {k: v for k, v in (saved or {}).items() if k not in (_RUN, _BY, _CONFLICT)}
        said = epochs.differences(settings, facts, batch_of)
        if self.restored_steps and said:
            raise ValueError(
                epochs.other_records(f"The backup in {self.backup.backup_dir}", said,
                                     "delete that folder to train from the start")  # fmt: skip
            )
        self._run, self._by = uuid.uuid4().hex, f"{socket.gethostname()} pid {os.getpid()}"
        self._facts_path = path
        _write_whole(path, {**facts, _RUN: self._run, _BY: self._by})

    def _still_ours(self) -> None:
        """After a save: the backup's record still names this run. Another run started in
        the same folder writes its own record, and the two runs' saves then mix: resumed, a
        run took the other's weights and steps as its own (a helper's trial). Both runs stop
        at their next save, and the backup is marked so that no run resumes from it."""
        path = self._facts_path
        try:
            now = _read_record(path)
        except (tf.errors.NotFoundError, ValueError):  # removed, or not ours (written whole)
            now = None
        except tf.errors.OpError as err:  # the storage failed: no sign of another run
            log.warning("Could not read %s to check that no other run writes the backup (%s); "
                        "checked again at the next save.", path, err.message)  # fmt: skip
            return
        if isinstance(now, dict) and now.get(_RUN) == self._run:
            return
        now = now if isinstance(now, dict) else {}
        if now.get(_CONFLICT):
            said = f"the other found the two runs' saves mixed ({now[_CONFLICT]})"
        else:
            said = f"{now.get(_BY, 'another run')} replaced this run's record of it"
            mixed = f"the runs of {self._by} and {now.get(_BY, 'another')}"
            _write_whole(path, {_CONFLICT: mixed})
        self._let_go()
        raise RuntimeError(
            f"Another run writes the backup in {self.backup.backup_dir}: {said}. This run "
            "stops, and no run will resume from that backup: give each run a backup folder "
            "of its own, and delete this one."
        )

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
        if self.steps_per_epoch % per_execution or self.restored_steps % per_execution:
            raise ValueError(
                f"steps_per_epoch={self.steps_per_epoch} and the {self.restored_steps} steps "
                f"restored must be multiples of steps_per_execution={per_execution}: Keras runs "
                "whole executions, so an epoch could not end where the first run's did. Keep "
                "steps_per_execution as the run began with it."
            )
        epoch, done = divmod(self.restored_steps, self.steps_per_epoch)
        # After the backup's on_train_begin (it sets the epoch from its own file).
        self.model._initial_epoch = epoch
        self._first_epoch = epoch
        self._left_in_epoch = self.steps_per_epoch - done if done else 0
        self._told_why = False

    # SIGTERM is held from an epoch's start to its end (`held_term`): before the epoch's next
    # step (every callback done with the last), the backup is saved and the process ends. Once
    # the epoch's last step has ended, it ends without a save: saved there, the epoch's end
    # (validation, epoch-end callbacks) would never run; and it is let go at the epoch's end,
    # before a stop another callback asks for, after which Keras removes the backup.

    def _hold_sigterm(self) -> None:
        why = None
        if not self.backup.double_checkpoint:
            why = ("the backup keeps no copy before its last (double_checkpoint=True), and a "
                   "save cut short by the VM's stop would leave none whole")  # fmt: skip
        elif self._workers > 1:
            why = "several workers train together, and each would save alone"
        elif not callable(getattr(self.backup, "_save_model", None)):
            why = "this Keras's BackupAndRestore has no save to call"  # (a private method)
        else:
            held = held_term.HeldTerm(self._in_fit)
            why = held.install()
            if why is None:
                self._held = held
                return
        if not self._told_why:
            self._told_why = True
            log.info("No save on SIGTERM: %s; SIGTERM ends the run as by default.", why)

    def _in_fit(self, frame) -> bool:
        """Whether `frame` runs inside this model's `fit` (not after it, ended by an error)."""
        while frame is not None:
            if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is self.model:
                return True
            frame = frame.f_back
        return False

    def _end_if_asked(self, save: bool) -> None:
        """After SIGTERM, between steps: the backup saved (`save`), then the process ended."""
        if self._held is None or not self._held.asked:
            return
        if save:
            self._held.saving()
            if not _saved_at_the_last_step(self.backup):
                self.backup._save_model()
            log.warning("SIGTERM: the backup saved at step %d; ending as asked",
                        _steps(self.model.optimizer))  # fmt: skip
        else:
            log.warning(_ENDS_UNSAVED)
        self._held.end()

    def _let_go(self) -> None:
        """SIGTERM's default again; where it came meanwhile, the process ends now."""
        held, self._held = self._held, None
        if held is not None and held.uninstall():
            log.warning(_ENDS_UNSAVED)
            held.end()

    def on_epoch_begin(self, epoch, logs=None):
        if self._first_epoch is not None:
            first, self._first_epoch = self._first_epoch, None
            if epoch != first:
                raise RuntimeError(
                    f"fit began at epoch {epoch}, not at {first} where the backup's steps end: "
                    "put FitResume after BackupAndRestore in fit's callbacks, and give fit no "
                    "initial_epoch."
                )
        if self.save_on_sigterm and self._held is None:
            self._hold_sigterm()

    def on_train_batch_begin(self, batch, logs=None):
        self._end_if_asked(save=True)

    def on_train_batch_end(self, batch, logs=None):
        if _saved_at_the_last_step(self.backup):
            self._still_ours()
        if self._left_in_epoch and batch + 1 >= self._left_in_epoch:
            # The interrupted epoch's last step: end it here, as the first run did. A stop
            # another callback asks for (now or at the epoch's end) stays asked for.
            self._left_in_epoch = 0
            if not self.model.stop_training:
                self.model.stop_training = _CUT

    def on_test_batch_end(self, batch, logs=None):
        self._end_if_asked(save=False)

    def on_epoch_end(self, epoch, logs=None):
        if self.backup.save_freq == "epoch":
            self._still_ours()
        if self.model.stop_training is _CUT:
            self.model.stop_training = False  # only the epoch ended; training goes on
        self._let_go()

    def on_train_end(self, logs=None):
        self._let_go()


_ENDS_UNSAVED = ("SIGTERM as an epoch ends: ending without a save (a save there would skip "
                 "the epoch's end on the restart, which goes on from the last backup)")  # fmt: skip


def _read_record(path: str):
    """The JSON file `path`, read."""
    with tf.io.gfile.GFile(path) as f:
        return json.loads(f.read())


def _write_whole(path: str, record: dict) -> None:
    """`record` as the JSON file `path`, replaced whole: a kill while it is written leaves the
    file as it was (hosts sharing the folder each write a part of their own)."""
    tf.io.gfile.makedirs(os.path.dirname(path))
    part = f"{path}.part-{uuid.uuid4().hex[:12]}"
    with tf.io.gfile.GFile(part, "w") as f:
        f.write(json.dumps(record, sort_keys=True))
    tf.io.gfile.rename(part, path, overwrite=True)


def _saved_at_the_last_step(backup) -> bool:
    """Whether the backup saved at the last step's end (its count since, Keras's private;
    read before a step, when every callback is done with the last)."""
    return isinstance(backup.save_freq, int) and getattr(
        backup, "_batches_seen_since_last_saving", None) == 0  # fmt: skip


def _steps(optimizer) -> int:
    return int(tf.keras.ops.convert_to_numpy(optimizer.iterations))


def _check_counts_steps(optimizer) -> None:
    """Refuses optimizers whose step count is not the number of steps fit ran."""
    if getattr(optimizer, "gradient_accumulation_steps", None):
        raise ValueError(
            "FitResume reads the steps trained from the optimizer's step count, which counts "
            f"one step per {optimizer.gradient_accumulation_steps} with gradient accumulation. "
            "Leave gradient_accumulation_steps unset, or train in a custom loop that "
            "checkpoints distribute.resumable_iterator."
        )
    if isinstance(optimizer, tf.keras.optimizers.LossScaleOptimizer):
        raise ValueError(
            "FitResume reads the steps trained from the optimizer's step count, which a "
            "loss-scaling optimizer (the mixed_float16 policy) does not advance on steps whose "
            "gradients overflow. Use mixed_bfloat16 (no loss scaling), or train in a custom "
            "loop that checkpoints distribute.resumable_iterator."
        )


def _facts(config, context, steps_per_epoch: int) -> dict:
    """What a backup's steps mean: the order of this pipeline's records and its batches."""
    facts = seeded.position_facts(config, context)
    records = facts.pop("fingerprint")  # saved under this name before the others were named
    batch = context.get_per_replica_batch_size(config.batch_size) if context else config.batch_size
    return {
        **facts,
        "records": records,
        "batch_size": batch,
        "replicas": context.num_replicas_in_sync if context else 1,
        "steps_per_epoch": steps_per_epoch,
    }


def _without_a_cut_epoch_file(backup) -> None:
    """Keras writes the backup's epoch file in place, after the weights: a kill in between
    (a preemption's SIGKILL) left it empty, and every restart failed in its restore
    ("JSONDecodeError: Expecting value"). The epoch it holds is not what the restore goes by
    (the optimizer's steps are), so a file that is no JSON is removed, saying so."""
    path = getattr(backup, "_training_metadata_path", None)  # (Keras 3's name for it)
    if not path or not tf.io.gfile.exists(path):
        return
    with tf.io.gfile.GFile(path) as file:
        text = file.read()
    try:
        json.loads(text)
    except ValueError:
        log.warning("The backup's epoch file %s is %s (a run killed as it wrote it): removed; "
                    "the restore goes by the optimizer's steps.", path,
                    "empty" if not text else "cut short")  # fmt: skip
        tf.io.gfile.remove(path)


def _start_afresh_if_none_was_whole(backup, err: OSError) -> None:
    """A backup whose weights file cannot be read, with no earlier copy (`.bkp`) to fall back
    on. Where no backup was ever whole (no epoch file: Keras writes it after the weights), the
    run was killed as it wrote its first: the weights are set aside and the run starts from
    the start, which is where it stood. Every restart failed in h5py ("truncated file")
    before. Otherwise the backup was written over a whole one (`double_checkpoint=False`)
    and cannot be restored: refused, saying so.

    Raises:
      ValueError: an earlier whole backup was written over.
    """
    weights = backup._weights_path  # (Keras 3's names)
    if tf.io.gfile.exists(backup._training_metadata_path) or tf.io.gfile.exists(
            backup._prev_weights_path):  # fmt: skip
        raise ValueError(
            f"The backup's weights {weights} cannot be read ({err}): the run was killed as it "
            "wrote them over the backup before, and there is no whole copy to fall back on. "
            f"Delete {backup.backup_dir} to train from the start; "
            "BackupAndRestore(..., double_checkpoint=True) keeps one."
        ) from err
    log.warning("The backup's weights %s cannot be read (%s): the run was killed as it wrote "
                "its first backup. Set aside as %s.torn; training starts from the start.",
                weights, err, weights)  # fmt: skip
    try:
        tf.io.gfile.rename(weights, weights + ".torn", overwrite=True)
    except tf.errors.NotFoundError:  # another host sharing the folder set it aside first
        pass
