"""The installed `tfrecord-pipe` command, run as a user runs it."""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from helpers import (
    COMMAND,
    jpeg_bytes,
    run_cli,
    run_command,
    run_python,
    without,
    write_image_folder,
)  # fmt: skip


def test_the_local_engine_s_progress_line_counts_the_records_it_writes(tmp_path):
    # The engine writes the shards after checking every input: its line must go on moving
    # then (on millions of inputs that is half the run), not stop at the last input checked.
    for label in ("cat", "dog"):
        (tmp_path / "src" / label).mkdir(parents=True)
        for i in range(4):
            (tmp_path / "src" / label / f"{i}.jpg").write_bytes(jpeg_bytes(8 + i, 8))
    (tmp_path / "src" / "dog" / "bad.jpg").write_bytes(b"not an image")
    result = run_command("convert", tmp_path / "src", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    finals = [line for line in result.stderr.splitlines() if line.startswith("converting: ")]
    assert finals and finals[-1].startswith(
        "converting: 9 inputs loaded (1 rejected); 8/8 records written"), result.stderr


def test_convert_on_a_missing_folder_exits_2_with_one_clear_line(tmp_path):
    result = run_cli("convert", tmp_path / "missing", tmp_path / "out")
    assert result.returncode == 2
    assert len(result.errors) == 1 and "missing does not exist. Give a folder" in result.errors[0]
    (tmp_path / "empty").mkdir()
    result = run_cli("convert", tmp_path / "empty", tmp_path / "out")
    assert result.returncode == 2
    assert len(result.errors) == 1 and "No files found under" in result.errors[0]
    assert not (tmp_path / "out").exists()
    result = run_cli("convert", tmp_path / "empty", "")  # said "error:  holds the input folder"
    assert result.returncode == 2 and result.errors == [
        "error: OUTPUT is empty: give a folder (local or gs://)."], result.errors  # fmt: skip


@pytest.mark.slow  # a dozen commands in new processes
def test_a_command_needing_a_package_not_installed_says_which_in_one_line(converted, tmp_path):
    # `pip install tfrecord-pipe` installs neither TensorFlow nor Beam: inspect and bench, and
    # Beam's runners, ended in a traceback ("No module named 'tensorflow'"). A local convert
    # and verify need neither.
    src, out = converted

    def run(*args, absent=("tensorflow", "apache_beam")):
        code = (f"import sys\nsys.argv = ['tfrecord-pipe', *{[str(arg) for arg in args]!r}]\n"
                "from tfrecord_pipe._tools import cli\ncli.run()")  # fmt: skip
        return run_python(code, env=without(tmp_path / "-".join(absent), *absent))

    for args, needed, extra in (
        (("inspect", out), "TensorFlow", "reader"),
        (("verify", src, out, "--decode"), "TensorFlow", "reader"),  # the workers decode
        (("convert", src, tmp_path / "beam", "--runner", "DirectRunner"), "Apache Beam", "beam"),
        (("verify", src, out, "--runner", "DirectRunner"), "Apache Beam", "beam"),
    ):
        done = run(*args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-2000:]
        assert done.errors == [
            f"error: this command needs {needed}, which is not installed here: pip install "
            f"'tfrecord-pipe[{extra}]' (in a clone: pip install -c constraints.txt '.[{extra}]'; "
            "make install installs every extra)."
        ]
    assert run("convert", src, tmp_path / "local").returncode == 0
    assert run("verify", src, tmp_path / "local").returncode == 0
    # ArrayRecord shards without array-record: the job failed at its first shard, saying to
    # run it again; verify took each shard for lost, and reported every input missing.
    said = ["error: ArrayRecord files need the array-record package: pip install "
            "'tfrecord-pipe[grain]' (in a clone: pip install -c constraints.txt '.[grain]'; "
            "make install installs every extra)."]
    arrays = tmp_path / "arrays"
    done = run("convert", src, arrays, "--formats", "array_record", absent=["array_record"])
    assert done.returncode == 2 and done.errors == said, done.stderr[-2000:]
    assert not arrays.exists()
    assert run("convert", src, arrays, "--formats", "array_record").returncode == 0
    for args in (("verify", src, arrays), ("verify", src, arrays, "--runner", "DirectRunner"),
                 ("inspect", arrays, "--check")):  # fmt: skip
        done = run(*args, absent=["array_record"])
        assert done.returncode == 2 and done.errors == said, done.stderr[-2000:]


# Root reads whatever a file's mode says: a command of the tests run as root gets that right
# dropped (util-linux's setpriv), as a user without it runs.
AS_A_USER = [] if os.geteuid() else [
    "setpriv", "--bounding-set=-dac_override,-dac_read_search",
    "--inh-caps=-dac_override,-dac_read_search",
]  # fmt: skip
DENIED = "Permission denied. This user may not read or write it: give them the right to " \
         "(chmod, chown), or give another path."  # fmt: skip


@pytest.mark.slow  # commands in new processes
def test_a_file_or_folder_this_user_may_not_read_is_said_in_one_line(converted, tmp_path):
    # A CSV list, a labels file or a source folder this user may not read ended in a
    # traceback (a helper's trial).
    src, _ = converted
    listed, labels, folder = tmp_path / "list.csv", tmp_path / "labels.txt", tmp_path / "src"
    listed.write_text(f"{next(src.rglob('*.jpg'))},red\n")
    labels.write_text("red\ngreen\nblue\n")
    shutil.copytree(src, folder)
    out = tmp_path / "out"
    for path, args in ((listed, [listed, out]), (labels, [src, out, "--labels_file", labels]),
                       (folder, [folder, out])):  # fmt: skip
        path.chmod(0)
        done = subprocess.run([*AS_A_USER, COMMAND, "convert", *map(str, args)],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr == f"error: {path}: {DENIED}\n" and not out.exists()
        path.chmod(0o755)


@pytest.mark.slow  # a command in a new process
def test_tensorflow_s_permission_error_is_said_in_one_line():
    # `inspect` of a dataset whose manifest this user may not read: TensorFlow's error, whose
    # message names the path, ended in a traceback (a helper's trial).
    done = run_python(
        "import tensorflow as tf\n"
        "from tfrecord_pipe._core import program_exit\n"
        "def main():\n"
        "    raise tf.errors.PermissionDeniedError(None, None, 'ds/manifest.json; Permission denied')\n"
        "program_exit.run(main)\n",
        preloaded=True,
    )
    assert done.returncode == 2 and done.stderr == f"error: ds/manifest.json; {DENIED}\n"


@pytest.mark.slow
def test_help_lists_the_commands():
    result = run_command("--help")
    assert result.returncode == 0
    for command in ("convert", "inspect", "verify", "bench"):
        assert command in result.stdout


def test_an_unquoted_pattern_s_files_are_said_to_need_quotes(tmp_path, capsys):
    # The shell gave the command the pattern's files: "unrecognized arguments" alone; then
    # the hint came after every file's name (a helper's 127 shards).
    from tfrecord_pipe._tools import cli

    (tmp_path / "my data").mkdir()  # a space in the path: it was two words, and no hint
    files = [tmp_path / "my data" / f"train-{n:05d}-of-00009.tfrecord" for n in range(9)]
    for file in files:
        file.write_bytes(b"")
    with pytest.raises(SystemExit):
        cli.main(["inspect", *map(str, files)])
    assert capsys.readouterr().err == (
        f"error: unrecognized arguments: {files[1]}, {files[2]}, {files[3]} and 5 more. A shell "
        "pattern such as data/train-* gives one argument per file it matches: quote it, "
        "'data/train-*', for the command to read it. `tfrecord-pipe COMMAND --help` lists a "
        "command's options.\n")


def test_a_path_with_a_tilde_is_the_home_folder_for_every_command(tmp_path, monkeypatch):
    # Where the shell leaves `~` (after `=`, in quotes), convert wrote a folder named `~` in
    # the current one and verify read it there, where inspect read the home folder's (a
    # helper's trial).
    home = tmp_path / "home"
    write_image_folder(home / "photos", per_label=2)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    done = run_cli("convert", "~/photos", "--output=~/ds", "--num_shards", "1")
    assert done.returncode == 0, done.stderr
    assert (home / "ds" / "manifest.json").exists() and not (tmp_path / "~").exists()
    assert run_cli("verify", "~/photos", "~/ds").returncode == 0
    assert run_cli("inspect", "~/ds", "--grid=~/sheet.png").returncode == 0
    assert (home / "sheet.png").exists()


def test_ctrl_c_while_tensorflow_loads_exits_130_in_one_line(converted, monkeypatch):
    from tfrecord_pipe._reading import tensorflow_start

    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(tensorflow_start, "start", interrupted)
    done = run_cli("inspect", converted[1])
    assert done.returncode == 130
    assert done.stderr.strip() == "error: interrupted."


def test_ctrl_c_while_tensorflow_probes_its_devices_keeps_its_noise_held_back(monkeypatch, capfd):
    # The held-back start-up lines (CUDA not found, oneDNN's note) all came out on a Ctrl-C,
    # as for a failed start, above the one line the command ends with.
    import tensorflow as tf

    from tfrecord_pipe._reading import tensorflow_start

    def probing():
        os.write(2, b"I0000 00:00:1.0 7 cudart_stub.cc:31] Could not find cuda drivers\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(tf.config, "list_physical_devices", probing)
    capfd.readouterr()
    with pytest.raises(KeyboardInterrupt):
        tensorflow_start.start()
    assert capfd.readouterr().err == ""


def test_no_command_is_bad_input():
    assert run_cli().returncode == 2


def every_command_parser():
    """(name, parser) of each command: the CLI's sub-commands and the converter's own."""
    from beam_jobs import flags
    from tfrecord_pipe._tools import cli

    (commands,) = [a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction)]
    yield from ((n, p) for n, p in commands.choices.items() if n != "convert")
    yield "convert", flags.make_parser("tfrecord-pipe convert")


@pytest.mark.parametrize("name, parser", list(every_command_parser()))
def test_every_option_has_help_and_help_shows_its_default(name, parser):
    shown = " ".join(parser.format_help().split())  # argparse wraps lines
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.help, f"{name} {action.option_strings[0]} has no help"
        if action.default is not None and action.default is not False:
            assert f"(default: {action.default})" in shown, (name, action.option_strings[0])


# TensorFlow takes other paths by CPU: oneDNN's kernels are on by default on AVX-512 CPUs, and
# then it prints a note at start-up. Both settings are forced here, so that the check holds on
# every x86-64 CPU whichever this machine is.
@pytest.mark.slow
@pytest.mark.parametrize("onednn", ["0", "1"], ids=["oneDNN-off", "oneDNN-on"])
def test_commands_are_quiet_unless_verbose(converted, onednn):
    # TensorFlow's start-up (CUDA probing on a machine without a GPU, CPU feature notes,
    # oneDNN's note, absl's pre-init warning) used to fill stderr on every command.
    _, out = converted
    env = {"TF_ENABLE_ONEDNN_OPTS": onednn}
    quiet = run_command("inspect", out, env=env)
    assert quiet.returncode == 0 and quiet.stderr == ""
    if onednn == "0":
        return  # --verbose shows the same with either setting, oneDNN's note aside
    verbose = run_command("inspect", out, "--verbose", env=env)
    assert verbose.returncode == 0 and verbose.stdout == quiet.stdout
    assert verbose.stderr.strip(), "nothing shown: TensorFlow printed nothing to hold back"
    assert "oneDNN custom operations are on" in verbose.stderr


def test_the_converters_flags_may_be_spelt_with_dashes():
    # A new user's trial: --validation-fraction, as most tools spell flags, was refused.
    from beam_jobs import flags

    parser = flags.make_parser()
    args, beam_args = flags.parse(parser, ["src", "out", "--validation-fraction", "0.2",
                                           "--num-shards=3", "--reject-other-formats=true",
                                           "--temp-location", "gs://t"])  # fmt: skip
    assert (args.validation_fraction, args.num_shards, args.reject_other_formats) == (0.2, 3, True)
    assert beam_args == ["--temp-location", "gs://t"]  # Beam's spelling, refused with a hint
    args, _ = flags.parse(parser, ["--", "--num-shards", "out"])  # after --: names, not flags
    assert (args.source, args.num_shards) == ("--num-shards", None)


@pytest.mark.parametrize("entry", ["tfrecord-pipe --help", "tfrecord-pipe inspect --help",
                                   "python -m beam_jobs.convert"])
def test_a_command_ends_though_a_library_left_a_thread_running(tmp_path, entry):
    # Ctrl-C under --runner DirectRunner printed "interrupted" and never exited: a thread
    # Beam left running held the interpreter at its end (a reviewer: 2 runs in 35). The same
    # for a command that ends in argparse's SystemExit.
    stuck = ("import atexit, runpy, sys, threading; atexit.register(print, 'exit hook ran'); "
             "threading.Thread(target=threading.Event().wait).start(); "
             "from tfrecord_pipe._core import program_exit; program_exit.GRACE_S = 0.5")
    if entry.startswith("tfrecord-pipe"):
        argv = [COMMAND, *entry.split()[1:]]
        code = f"{stuck}; sys.argv = {argv!r}; runpy.run_path({COMMAND!r}, run_name='__main__')"
    else:
        missing = str(tmp_path / "missing")
        code = f"{stuck}; sys.argv = ['convert', {missing!r}, {str(tmp_path / 'out')!r}]; " \
               "runpy.run_module('beam_jobs.convert', run_name='__main__')"
    done = run_python(code, timeout=120)  # (a hang fails the test, naming the timeout)
    assert done.returncode == (2 if "convert" in entry else 0), done.stderr
    assert "exit hook ran" in done.stdout  # (the fork server's end is one)


@pytest.mark.parametrize("argv, said", [
    (["inspect", "ds", "--chek"], "error: unrecognized arguments: --chek. Did you mean --check? "
                                  "`tfrecord-pipe COMMAND --help` lists a command's options."),
    (["convert", "src", "out", "--validation_fraction", "abc"],
     "error: argument --validation_fraction: invalid float value: 'abc'. `tfrecord-pipe convert "
     "--help` lists the options."),
    # A value given to a switch: no path, so no word of shell patterns.
    (["inspect", "ds", "--check", "yes"],
     "error: unrecognized arguments: yes. `tfrecord-pipe COMMAND --help` lists a command's "
     "options."),
])  # fmt: skip
def test_a_mistyped_option_is_one_error_line_naming_the_closest(capsys, argv, said):
    # argparse printed its usage first (15 lines for convert), and no "did you mean".
    from tfrecord_pipe._tools import cli

    with pytest.raises(SystemExit) as ended:
        cli.main(argv)
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines() == [said]


def test_a_command_stopped_while_it_waits_for_its_child_processes_ends_them():
    # Beam's runner, stopped by one SIGTERM or Ctrl-C while its worker processes started,
    # waited for them for ever, renewing the output's claim (a helper's trial: one stop in
    # three). After STOP_GRACE_S the children are ended (one ignores SIGTERM: then SIGKILL),
    # and a wait on anything else is interrupted again.
    code = (
        "import os, signal, subprocess, sys, threading, time\n"
        "from tfrecord_pipe._core import program_exit\n"
        "program_exit.STOP_GRACE_S = 1.0\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']),\n"
        "        subprocess.Popen([sys.executable, '-c', 'import signal, time; '\n"
        "            'signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); '\n"
        "            'time.sleep(300)'], stdout=subprocess.PIPE)]\n"
        "kids[1].stdout.readline()  # its SIGTERM ignored from here\n"
        "with program_exit.signals_as_interrupts() as received:\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(300)\n"
        "    except KeyboardInterrupt:\n"
        "        try:\n"
        "            for kid in kids:\n"
        "                kid.wait()  # as Beam's runner waited for its workers\n"
        "            print('children ended', [kid.returncode for kid in kids], flush=True)\n"
        "            threading.Event().wait()  # a wait on no child\n"
        "        except KeyboardInterrupt:\n"
        "            print('interrupted again', program_exit.stopped_by(received), flush=True)\n"
    )
    done = run_python(code, timeout=60)  # (a hang fails the test, naming the timeout)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["children ended [-15, -9]",
                                        "interrupted again ('terminated (SIGTERM)', 143)"]


def test_a_second_ctrl_c_as_a_command_ends_lets_its_exit_hooks_finish(tmp_path):
    # A second Ctrl-C while the workers' fork server ended (an exit hook) printed a traceback
    # and left the server's sockets folder in TMPDIR (a new user's trial: 3 runs in 3).
    ready, done_file = tmp_path / "ready", tmp_path / "hook-done"
    code = (
        "import atexit, os, pathlib, signal, time\n"
        "from tfrecord_pipe._core import program_exit\n"
        # As Python sets it up when started from a shell: a parent that ignores SIGINT (a job
        # run with `&`) has its children ignore it too, and the command then slept 30 s.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "def hook():\n"
        f"    pathlib.Path({str(ready)!r}).touch()\n"
        "    time.sleep(1.0)\n"
        f"    pathlib.Path({str(done_file)!r}).touch()\n"
        "atexit.register(hook)\n"
        "def main():\n"
        "    os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C, in the command\n"
        "    time.sleep(30)\n"
        "program_exit.run(main)\n"
    )
    running = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert running.poll() is None and time.monotonic() < deadline, running.stderr.read()
        time.sleep(0.01)
    running.send_signal(signal.SIGINT)  # the second, in the exit hook
    _, stderr = running.communicate(timeout=60)
    assert running.returncode == 130 and done_file.exists(), stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert stderr.strip() == "error: interrupted."


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_a_shard_cut_short_is_refused_before_training_named_by_every_tool(converted_copy, caplog):
    # A copy that stopped (rsync, gsutil) left a shard short: the seeded reader failed hours
    # into training with TensorFlow's "truncated record", naming no file.
    from tfrecord_pipe import reader

    src, out = converted_copy
    found = json.loads((out / "manifest.json").read_text())
    for info in found["splits"].values():  # the converter lists every file's size
        assert info["file_bytes"] == [(out / name).stat().st_size for name in info["files"]]
    shard = out / found["splits"]["train"]["files"][0]
    whole = shard.read_bytes()
    shard.write_bytes(whole[:-10])
    options = dict(is_training=True, image_size=8, batch_size=2)
    said = (f"split 'train' of {out} are not the size the manifest lists: {shard} holds "
            f"{len(whole) - 10:,} bytes, the manifest lists {len(whole):,}. Cut short")
    with pytest.raises(ValueError, match=said):
        reader.make_input_fn(str(out), seed=1, **options)()
    reader.make_input_fn(str(out), skip_corrupt=True, **options)()  # warned, read as it can
    assert "not of the size the manifest lists" in caplog.text
    inspected = run_cli("inspect", out, "--check")
    assert "1 of another size than listed" in inspected.stdout, inspected.stdout
    assert f"{shard} holds {len(whole) - 10:,} bytes" in inspected.stdout
    verified = run_cli("verify", src, out)
    assert verified.returncode == 1 and f"{shard} holds" in verified.stdout
    # A manifest written before sizes were listed is read as before.
    for info in found["splits"].values():
        del info["file_bytes"]
    (out / "manifest.json").write_text(json.dumps(found))
    reader.make_input_fn(str(out), seed=1, **options)()
