"""A storage that fails now and then (429 and 503 answers, answers cut off mid-body): a
gs:// -> gs:// conversion on Beam's runner, and a list of gs:// images read once by the local
engine, end with every input accounted for, or with a clear error and no manifest; verify,
inspect and the reader on gs:// behave the same.

The faults come from the test GCS's proxy (local_gcs.py). Retries are the client
libraries' (google-cloud-storage for the job, TensorFlow's filesystem for reading) plus
verify's own resumption of a shard read; docs/conversion.md, "What we guarantee".
"""

import contextlib
import http.client
import urllib.request

import pytest
from google.cloud import storage

from beam_jobs import convert

from helpers import IN_PROCESS, run_command, run_python, write_image_folder

pytestmark = pytest.mark.slow

# TensorFlow's own retries, as many as users have (conftest lowers them to fail fast offline);
# its first wait a tenth of the default second, the later ones doubling as they do by default.
DEFAULT_TF_RETRIES = {
    "GCS_RETRY_CONFIG_MAX_RETRIES": "10",
    "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
}


def test_the_proxy_answers_errors_and_cuts_answers_off_when_asked(gcs):
    storage.Client().bucket(gcs.bucket).blob("faults/a.bin").upload_from_string(b"x" * 10000)
    url = gcs.environ["STORAGE_EMULATOR_HOST"] + f"/download/storage/v1/b/{gcs.bucket}/o/"
    with gcs.faults(error_rate=1.0):
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(url + "faults%2Fa.bin?alt=media", timeout=30)
        assert answer.value.code in (429, 503)
    with gcs.faults(reset_rate=1.0), pytest.raises(http.client.IncompleteRead):
        urllib.request.urlopen(url + "faults%2Fa.bin?alt=media", timeout=30).read()
    with urllib.request.urlopen(url + "faults%2Fa.bin?alt=media", timeout=30) as whole:
        assert len(whole.read()) == 10000  # and back to normal


def test_a_conversion_on_a_flaky_storage_loses_nothing_or_fails_clearly(gcs, tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=4, odd=("truncated_jpeg.jpg",))
    bucket = storage.Client().bucket(gcs.bucket)
    for path in src.rglob("*.jpg"):
        bucket.blob(f"flaky-src/{path.relative_to(src)}").upload_from_filename(path)
    source, out = gcs.url("flaky-src"), gcs.url("flaky-out")
    # Rates that give a few dozen faults: higher ones mostly add the clients' backoff sleeps.
    # Each part must meet some, or it would pass on a storage that never failed it.
    with gcs.faults(error_rate=0.05, reset_rate=0.03, seed=1) as dealt:
        for _ in range(3):  # a run may fail, said clearly with nothing finalised: run again
            try:
                result = convert.run([source, out, "--num_shards", "2", "--validation_fraction",
                                      "0.3", *IN_PROCESS])  # fmt: skip
                break
            except convert.JobFailedError as err:
                assert "Nothing was finalised" in str(err)
                assert not bucket.blob("flaky-out/manifest.json").exists()
        else:
            pytest.fail("three runs on the flaky storage failed: what they lose is never read")
    assert sum(dealt.values()), f"the conversion met no faults: {dealt}"
    assert sum(info.listed for info in result.splits.values()) == 13
    with gcs.faults(error_rate=0.05, reset_rate=0.03, seed=2) as dealt:
        verified = run_command("verify", source, out, env={**gcs.environ, **DEFAULT_TF_RETRIES})
        assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
        # `inspect --check` and the reader, in one process (TensorFlow starts once).
        read = run_python(
            "from tfrecord_pipe import reader\n"
            "from tfrecord_pipe._tools import cli\n"
            f"print('INSPECT EXIT', cli.main(['inspect', {out!r}, '--check']))\n"
            f"ds = reader.make_input_fn({out!r}, is_training=False, image_size=8, batch_size=4)()\n"
            "print('IMAGES', int(sum(int((w.numpy() > 0).sum()) for _, _, w in ds)))",
            env={**gcs.environ, **DEFAULT_TF_RETRIES},
        )
        assert "INSPECT EXIT 0" in read.stdout, read.stdout[-3000:] + read.stderr[-3000:]
        assert f"IMAGES {result.splits['validation'].num_examples}" in read.stdout, read.stderr[-3000:]
    assert sum(dealt.values()), f"verify, inspect and the reader met no faults: {dealt}"


def test_a_storage_that_does_not_answer_is_said_while_the_client_retries(gcs, monkeypatch, caplog):
    # The client library retries for two minutes in silence; each wait is now said, and the
    # call still ends in an error once the retries are spent.
    from google.api_core import exceptions as cloud

    from beam_jobs import storage as storage_lib

    monkeypatch.setattr(storage_lib, "GCS_RETRY_S", 2.0)
    storage_lib.gcs_retry.cache_clear()
    try:
        with gcs.faults(error_rate=1.0), pytest.raises(cloud.GoogleAPIError):
            storage_lib.children(gcs.url("anything"))
    finally:
        storage_lib.gcs_retry.cache_clear()
    said = [r.getMessage() for r in caplog.records if r.name == "beam_jobs.storage"]
    assert said and said[0].startswith("Cloud Storage did not answer; retrying for up to 2 s")


def test_a_storage_that_fails_every_read_stops_the_job_rather_than_reject_its_inputs(
    gcs, tmp_path, monkeypatch
):
    # A CSV list of gs:// images, read while the storage answers nothing but 503s (a network
    # down, a region out): every input was rejected `unreadable` and the job succeeded, a
    # dataset shrunk by an outage. Now the job stops, naming the storage, and writes nothing.
    from apache_beam.io.gcp import gcsio_retry
    from google.cloud.storage.retry import DEFAULT_RETRY

    src = write_image_folder(tmp_path / "src", per_label=1, odd=())
    bucket = storage.Client().bucket(gcs.bucket)
    lines = []
    for path in sorted(src.rglob("*.jpg")):
        bucket.blob(f"outage/{path.name}").upload_from_filename(path)
        lines.append(f"{gcs.url('outage/' + path.name)},{path.parent.name}")
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    # The client retries for two minutes by default; a test cannot wait that long. (Beam
    # passes its own policy to some calls, and leaves the library's default to others.)
    monkeypatch.setattr(gcsio_retry, "get_retry", lambda options: DEFAULT_RETRY.with_timeout(1.0))
    monkeypatch.setattr(DEFAULT_RETRY, "_timeout", 1.0)
    out = tmp_path / "out"
    # The launcher's look at the first line's storage answered; then nothing does.
    with gcs.exported(), gcs.faults(error_rate=1.0, spared=1) as dealt:
        with pytest.raises(convert.JobFailedError) as failed:
            # Beam's runner, in this process (where the shorter retries are): the local
            # engine's workers fail the job the same way, by the same `outcome.decide`.
            convert.run([str(tmp_path / "list.csv"), str(out), "--runner", "DirectRunner"])
    assert sum(dealt.values())
    assert "the storage failed, not the file" in str(failed.value), str(failed.value)
    assert "It is not rejected" in str(failed.value) and not (out / "manifest.json").exists()


def test_a_list_of_gs_images_out_of_reach_is_refused_before_the_job(gcs, tmp_path, monkeypatch,
                                                                     caplog):  # fmt: skip
    # Its reads connected anonymously (Beam's GCS reads) and each failed after two minutes of
    # silent retries, where a source folder on gs:// is refused at once (a helper's trial);
    # then the error was cut off mid-sentence ("It is not rejected: run )").
    from beam_jobs import storage as storage_lib

    image = sorted(write_image_folder(tmp_path / "src", per_label=1, odd=()).rglob("*.jpg"))[0]
    listed = tmp_path / "list.csv"
    listed.write_text(f"{image},cat\n{gcs.url('missing/b.jpg')},dog\n")
    out = tmp_path / "out"
    monkeypatch.setattr(storage_lib, "GCS_RETRY_S", 1.0)
    storage_lib.gcs_retry.cache_clear()
    try:
        with gcs.exported(), gcs.faults(error_rate=1.0) as dealt:
            with pytest.raises(ConnectionError) as refused:
                convert.run([str(listed), str(out), *IN_PROCESS])
    finally:
        storage_lib.gcs_retry.cache_clear()
    assert sum(dealt.values()) and not out.exists()  # refused before the output was claimed
    assert str(refused.value).startswith(
        f"CSV list {listed} line 2: its path {gcs.url('missing/b.jpg')}: Cloud Storage cannot "
        "be reached (")  # fmt: skip
    assert str(refused.value).endswith("Check the network, then run the command again.")
    said = [r.getMessage() for r in caplog.records if r.name == "beam_jobs.storage"]
    assert said and said[0].startswith("Cloud Storage did not answer; retrying for up to 1 s")
    # Without credentials (nor the test GCS, to which a client needs none) gs:// is read
    # anonymously, as Beam's filesystem reads: public data (a tutorial's list on
    # gs://cloud-ml-data) needs none (a reviewer: this check refused it at first).
    no_credentials = {"GOOGLE_APPLICATION_CREDENTIALS": "", "CLOUDSDK_CONFIG": str(tmp_path),
                      "NO_GCE_CHECK": "true", "STORAGE_EMULATOR_HOST": ""}  # fmt: skip
    ran = run_python(
        "from beam_jobs import storage\n"
        "print(type(storage._gcs_reader()._credentials).__name__)\n"
        "storage.gcs_client()\n",
        env=no_credentials, preloaded=True,
    )
    assert ran.stdout == "AnonymousCredentials\n", ran.stderr[-2000:]
    assert ran.stderr.strip().splitlines()[-1] == f"ConnectionError: {storage_lib.NO_CREDENTIALS}"
    # The storage answers: a missing object is the job's to reject, naming it.
    with gcs.exported():
        result = convert.run([str(listed), str(out), *IN_PROCESS])
    assert [sum(info.num_examples for info in result.splits.values()),
            sum(info.rejected for info in result.splits.values())] == [1, 1]


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_an_outage_mid_run_ends_the_conversion_in_one_error_line(gcs, tmp_path, monkeypatch,
                                                                 capsys, caplog):  # fmt: skip
    # With the storage gone after the claim was taken, the failed job asked whether it had
    # lost its claim, whether it had written anything, whether it had begun to finalise, and
    # gave the claim up: a storage call each, retried two minutes each (eight minutes, in a
    # helper's trial), and the last one's error escaped as a traceback.
    from apache_beam.io.gcp import gcsio_retry
    from google.cloud.storage.retry import DEFAULT_RETRY

    from beam_jobs import storage as storage_lib

    src = write_image_folder(tmp_path / "src", per_label=1, odd=())
    monkeypatch.setattr(gcsio_retry, "get_retry", lambda options: DEFAULT_RETRY.with_timeout(1.0))
    monkeypatch.setattr(DEFAULT_RETRY, "_timeout", 1.0)
    monkeypatch.setattr(storage_lib, "GCS_RETRY_S", 1.0)
    storage_lib.gcs_retry.cache_clear()
    outage, start_job = contextlib.ExitStack(), convert._run_pipeline

    def in_an_outage(*args, **kwargs):  # the claim is taken: the storage goes away
        outage.enter_context(gcs.faults(error_rate=1.0))
        return start_job(*args, **kwargs)

    monkeypatch.setattr(convert, "_run_pipeline", in_an_outage)
    try:
        with gcs.exported(), outage:
            code = convert.main([str(src), gcs.url("outage-out"), "--runner", "DirectRunner"])
    finally:
        storage_lib.gcs_retry.cache_clear()
    said = capsys.readouterr().err
    assert code == 1 and "Traceback" not in said, said[-3000:]
    [error] = [line for line in said.splitlines() if line.startswith("error:")]
    assert ("The storage, or the network to it, failed. Run the same command again once it "
            "answers") in error, said[-3000:]  # fmt: skip
    assert "Could not give up the claim" in caplog.text  # (it expires)


def test_an_outage_is_told_from_a_file_that_cannot_be_read():
    from google.api_core import exceptions as cloud
    from requests import exceptions as http

    from beam_jobs import outcome, storage as storage_lib
    from beam_jobs.source_file import SourceFile
    from tfrecord_pipe._core import images

    def failing(err):
        def read():
            raise err

        return read

    given_up = cloud.RetryError("Timeout of 120.0s exceeded", cause=http.ConnectionError("DNS"))
    try:
        raise OSError("Beam's wrapper") from given_up
    except OSError as wrapped:
        outage = wrapped
    source = SourceFile("gs://b/a.jpg", "a.jpg", "cat", "train", None)
    for err in (outage, cloud.ServiceUnavailable("503"), TimeoutError("NFS"),
                http.ReadTimeout("read timed out")):  # fmt: skip
        with pytest.raises(storage_lib.StorageFailed, match="gs://b/a.jpg: the storage failed"):
            outcome.decide(source, {"cat"}, images.ImagePolicy(), failing(err))
    for err in (cloud.NotFound("404"), cloud.Forbidden("403"), PermissionError(13, "denied"),
                IsADirectoryError(21, "a folder")):  # fmt: skip
        decided = outcome.decide(source, {"cat"}, images.ImagePolicy(), failing(err))
        assert decided.reason == images.UNREADABLE, err
    # A worker's error comes back as text: whether it was an outage comes with it.
    from beam_jobs import worker_pool

    for err, was in ((outage, True), (cloud.NotFound("404"), False)):
        with pytest.raises(worker_pool.WorkerError) as back:
            worker_pool.in_worker(failing(err))()
        assert storage_lib.is_outage(back.value) is was


def test_the_local_engine_reading_gs_inputs_once_on_a_flaky_storage_loses_nothing(gcs, tmp_path):
    # The default engine, its workers reading a local list's gs:// images once as they write
    # the records (pieces.py): a read cut short must be retried, or fail the job, never be
    # taken for a truncated JPEG and rejected.
    from test_engines import files_of

    src = write_image_folder(tmp_path / "src", per_label=6, odd=("truncated_jpeg.jpg",))
    listed = gcs.image_list(src, "flaky-once", tmp_path / "list.csv")
    flags = ["--num_shards", "2", "--validation_fraction", "0.3"]
    met = []  # the image reads cut off in each run that ended
    with gcs.exported():
        convert.run([str(listed), str(tmp_path / "calm"), *flags])
        # Which request a fault falls on depends on the workers' order: a run meets 1-4 cut-off
        # image reads, or none (all of 3 runs met none, once). Runs until one has met one.
        for seed in range(1, 9):
            out = tmp_path / f"flaky-{seed}"
            with gcs.faults(error_rate=0.05, reset_rate=0.1, seed=seed) as dealt:
                try:
                    convert.run([str(listed), str(out), *flags])
                except convert.JobFailedError as err:  # allowed: said clearly, nothing finalised
                    assert "Nothing was finalised" in str(err)
                    assert not (out / "manifest.json").exists()
                    continue
            assert files_of(out) == files_of(tmp_path / "calm")  # each input's fate, as calm
            met.append(dealt["reset_media"])
            if dealt["reset_media"]:
                break  # (enough: the runs cost seconds each)
    # A run that met a cut-off image read and still gave the calm dataset: the read was
    # retried (not only a listing's or a metadata request's).
    assert any(met), f"no run that ended met a cut-off image read: {met}"
