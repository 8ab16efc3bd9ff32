"""A real GCS endpoint on 127.0.0.1 that all three of our GCS clients talk to.

Used by the `gcs` fixture in conftest.py (and by benchmarks that want gs:// paths offline).

* google-cloud-storage and Beam's GCS IO honour `STORAGE_EMULATOR_HOST`, so they talk to the
  emulator (the PyPI package gcp-storage-emulator, run in its own process) directly.
* TensorFlow's own `gs://` filesystem has its endpoints compiled in
  (https://www.googleapis.com/... and https://storage.googleapis.com/...). It does honour
  `https_proxy` and `CURL_CA_BUNDLE`, so we run a CONNECT proxy that terminates TLS with a
  throwaway CA and relays each HTTP request to the emulator. The relay works at the HTTP level,
  not the byte level, because it must also smooth over emulator gaps seen with TF 2.21:
  bodies that arrive chunked are de-chunked and sent with a plain Content-Length (the emulator
  otherwise stores the chunk framing), empty media uploads become multipart ones (the emulator
  crashes on them), the Host it sees is the proxy's plain address (it builds stored links from
  Host) while resumable-upload `Location` headers go back to TF as https, and requests are
  serialised on short connections (the emulator is single-threaded, one connection at a time).
  The proxy also checks `ifGenerationMatch` preconditions, which the emulator ignores (real
  GCS honours them; the conversion's output claim relies on them), and answers a repeated
  final request of a finished resumable upload as GCS does (with the object; the emulator
  has forgotten the session and says 404, so a client retrying after a lost answer failed).
* Faults, on request (`LocalGcs.faults`): a share of requests answered 429 or 503, responses
  cut off mid-body, slow answers. Seeded, so that a failing run can be repeated.
* google-auth (used by Beam to find credentials) would otherwise retry for ~25 s per process
  before going anonymous. We give it an Application Default Credentials file of the ordinary
  "service_account" kind (a throwaway key) whose token endpoint is this same proxy, so the real
  credential code path runs and answers at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import http.client
import http.server
import json
import os
import pathlib
import random
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

# Hosts TensorFlow's GCS filesystem (and the OAuth flow) connect to.
INTERCEPTED_HOSTS = (
    "www.googleapis.com",
    "storage.googleapis.com",
    "oauth2.googleapis.com",
    "iamcredentials.googleapis.com",  # google-auth's regional access boundary look-up
)

# Headers that describe one hop of a connection, never forwarded as they are.
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "expect",
}


@dataclasses.dataclass(frozen=True)
class Faults:
    """What the proxy does wrong, on purpose.

    Attributes:
      error_rate: share of requests answered at once with 429 or 503 (nothing relayed).
      reset_rate: share of relayed requests whose response is cut off mid-body (the request
        itself took effect, as when a connection breaks on the way back).
      delay_s: added before each relayed request.
      seed: for the draws.
      spared: the first requests, relayed untouched (a storage that fails after a job's first
        look at it).
    """

    error_rate: float = 0.0
    reset_rate: float = 0.0
    delay_s: float = 0.0
    seed: int = 0
    spared: int = 0


_CONTROL_PATH = "/_test/faults"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a process started next to bind, that no other
    process is given meanwhile. Not one the OS picks (bind to port 0): the OS hands that one
    out again to the next process that binds port 0 (another worker's proxy, Gloo, a tf.data
    service) as soon as it is released. So one below the range the OS picks from."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        lowest_picked = int(ports.read().split()[0])
    draw = random.Random()  # (not the tests' seeded generator)
    for _ in range(100):
        port = draw.randrange(10_000, max(lowest_picked, 10_001))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # in use: another
                continue
        return port
    raise RuntimeError(f"no free TCP port found between 10000 and {lowest_picked}")


def wait_until_serving(url: str, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Polls `url` until it answers 200; fails at once if `process` died."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"GCS emulator exited with code {process.returncode} while starting")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError as err:
            last_error = err
        time.sleep(0.05)
    raise RuntimeError(f"GCS emulator did not answer {url} within {timeout_s} s: {last_error}")


def _make_ca_and_leaf(folder: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """Writes a throwaway CA and a leaf certificate for INTERCEPTED_HOSTS into `folder`."""
    now = datetime.datetime.now(datetime.timezone.utc)
    validity = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=7))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tfrecord-pipe test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, INTERCEPTED_HOSTS[0])]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(h) for h in INTERCEPTED_HOSTS]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )

    pem = serialization.Encoding.PEM
    ca_path = folder / "ca.pem"
    cert_path = folder / "leaf.pem"
    key_path = folder / "leaf.key"
    ca_path.write_bytes(ca_cert.public_bytes(pem))
    cert_path.write_bytes(leaf_cert.public_bytes(pem))
    key_path.write_bytes(
        leaf_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return ca_path, cert_path, key_path


def _service_account_info(token_uri: str) -> dict:
    """A service-account key file's fields, with a fresh key and a local token endpoint."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return {
        "type": "service_account",
        "project_id": "test-project",
        "private_key_id": "test-key",
        "private_key": pem.decode("ascii"),
        "client_email": "tests@test-project.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }


_TOKEN = {"access_token": "test-token", "expires_in": 3600, "token_type": "Bearer"}


def _as_multipart_upload(path: str, headers: dict) -> tuple[str, bytes, dict]:
    """Rewrites an empty `uploadType=media` upload (which crashes the emulator) as multipart.

    TF sends these when it creates a "directory" object such as `gs://bucket/dir/`.
    """
    url = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(url.query)
    name = query.pop("name", [""])[0]
    query["uploadType"] = ["multipart"]
    boundary = "tfrecord-pipe-test-boundary"
    body = (
        f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
        f"{json.dumps({'name': name})}\r\n"
        f"--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n\r\n"
        f"--{boundary}--\r\n"
    ).encode()
    headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
    headers["Content-Type"] = f"multipart/related; boundary={boundary}"
    headers["Content-Length"] = str(len(body))
    new_path = url.path + "?" + urllib.parse.urlencode(query, doseq=True)
    return new_path, body, headers


class _RelayHandler(http.server.BaseHTTPRequestHandler):
    """The proxy's one handler: relays HTTP/1.1 requests to the emulator, one at a time.

    Plain requests (from Python clients, via STORAGE_EMULATOR_HOST) and requests inside a
    CONNECT tunnel (from TensorFlow, TLS terminated here) take the same path. Each relayed
    request uses its own short connection to the emulator: the emulator is a single-threaded
    HTTP/1.1 server, so one client's idle keep-alive connection would otherwise block all others.
    """

    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's signature
        pass

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _answer_json(self, payload: dict):
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _relay(self):
        body = self._read_body()
        host = self.headers.get("Host", "").split(":")[0]
        if host == "iamcredentials.googleapis.com":
            self._answer_json({"encodedLocations": "", "locations": []})  # no boundary
            return
        if host == "oauth2.googleapis.com" or self.path == "/token":
            self._answer_json(_TOKEN)  # any token refresh succeeds
            return
        proxy: _Proxy = self.server  # type: ignore[assignment]
        if self.path == _CONTROL_PATH:  # answers with the faults dealt under the last settings
            self._answer_json(proxy.set_faults(Faults(**json.loads(body or b"{}"))))
            return
        fault = proxy.draw_fault()
        if fault == "error":
            proxy.count("error")
            self._answer_error(proxy.random_status(), "injected by the test proxy")
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        # The emulator builds the links it stores (mediaLink, upload Location) from Host. Give it
        # our plain address, so links stored by a TF upload work for the Python clients too.
        plain_host = f"127.0.0.1:{proxy.server_address[1]}"
        headers["Host"] = plain_host
        path = self.path
        if self.command == "POST" and not body and "uploadType=media" in path:
            path, body, headers = _as_multipart_upload(path, headers)
        if body or self.command in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))
        if proxy.faults.delay_s:
            time.sleep(proxy.faults.delay_s)
        with proxy.emulator_lock:  # one request at a time: a precondition holds until it runs
            failed = _failed_precondition(proxy.emulator_port, self.command, path, body)
            if failed:
                self._answer_error(412, failed)
                return
            connection = http.client.HTTPConnection("127.0.0.1", proxy.emulator_port, timeout=120)
            try:
                connection.request(self.command, path, body=body, headers=headers)
                response = connection.getresponse()
                status, reason, data = response.status, response.reason, response.read()
                response_headers = response.getheaders()
            finally:
                connection.close()
            session = _upload_session(path) if self.command == "PUT" else None
            if session and status in (200, 201):
                proxy.finished_uploads[session] = (status, reason, data, response_headers)
            elif session and status == 404 and session in proxy.finished_uploads:
                status, reason, data, response_headers = proxy.finished_uploads[session]
        self.send_response(status, reason)
        for key, value in response_headers:
            if key.lower() in _HOP_BY_HOP:
                continue
            if key.lower() == "location" and host in INTERCEPTED_HOSTS:
                value = value.replace(f"http://{plain_host}", f"https://{host}")
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if fault == "reset" and len(data) > 1:  # the answer breaks off: half the body, then gone
            proxy.count("reset")
            if "alt=media" in path:  # a file's bytes, not its metadata
                proxy.count("reset_media")
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)

    def _answer_error(self, status: int, message: str):
        data = json.dumps({"error": {"code": status, "message": message}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _relay

    def do_CONNECT(self):
        host = self.path.rsplit(":", 1)[0]
        if host not in INTERCEPTED_HOSTS:
            self.send_error(403, f"this test proxy only intercepts {INTERCEPTED_HOSTS}")
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        proxy: _Proxy = self.server  # type: ignore[assignment]
        self.close_connection = True
        try:
            tls = proxy.tls_context.wrap_socket(self.connection, server_side=True)
            _RelayHandler(tls, self.client_address, proxy)  # serves the tunnel until it closes
        except (ssl.SSLError, ConnectionError):
            pass


def _upload_session(path: str) -> str | None:
    """The resumable upload session a request continues, if any."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    return query.get("upload_id", [None])[0]


def _failed_precondition(emulator_port: int, command: str, path: str, body: bytes) -> str:
    """Why `ifGenerationMatch` fails for this request ("" if it holds or is not asked for).

    Generation 0 means "no such object", as GCS has it.
    """
    url = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(url.query)
    if "ifGenerationMatch" not in query:
        return ""
    wanted = int(query["ifGenerationMatch"][0])
    bucket, name = _object_of(url.path, query, body)
    connection = http.client.HTTPConnection("127.0.0.1", emulator_port, timeout=120)
    try:
        quoted = urllib.parse.quote(name, safe="")
        connection.request("GET", f"/storage/v1/b/{bucket}/o/{quoted}")
        response = connection.getresponse()
        metadata = response.read()
    finally:
        connection.close()
    current = int(json.loads(metadata)["generation"]) if response.status == 200 else 0
    if current != wanted:
        return f"conditionNotMet: {name} is at generation {current}, not {wanted}"
    return ""


def _object_of(path: str, query: dict, body: bytes) -> tuple[str, str]:
    """(bucket, object name) a request writes or deletes: the copy's destination, an upload's
    name (from the query, or the JSON metadata of a multipart or resumable upload)."""
    parts = [urllib.parse.unquote(part) for part in path.split("/")]
    bucket = parts[parts.index("b") + 1]
    for verb in ("rewriteTo", "copyTo"):
        if verb in parts:
            at = parts.index(verb)
            return parts[at + 2], "/".join(parts[at + 4 :])
    if path.startswith("/upload/"):
        if "name" in query:
            return bucket, query["name"][0]
        found = re.search(rb'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', body)
        return bucket, json.loads(b'"' + found.group(1) + b'"') if found else ""
    return bucket, "/".join(parts[parts.index("o") + 1 :])


class _Proxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, emulator_port: int, tls_context: ssl.SSLContext):
        super().__init__(("127.0.0.1", 0), _RelayHandler)
        self.emulator_port = emulator_port
        self.tls_context = tls_context
        self.emulator_lock = threading.Lock()
        self.faults = Faults()
        self.finished_uploads: dict[str, tuple] = {}  # upload_id -> the final answer
        self._random = random.Random(0)
        self._random_lock = threading.Lock()
        self._spared = 0
        self._dealt = {"error": 0, "reset": 0, "reset_media": 0}

    def set_faults(self, faults: Faults) -> dict[str, int]:
        """Deals `faults` from now on; returns the faults dealt since the last call."""
        with self._random_lock:
            self.faults = faults
            self._random = random.Random(faults.seed)
            self._spared = 0
            dealt, self._dealt = self._dealt, {"error": 0, "reset": 0, "reset_media": 0}
        return dealt

    def count(self, fault: str) -> None:
        with self._random_lock:
            self._dealt[fault] += 1

    def draw_fault(self) -> str | None:
        """"error", "reset" or None for the next request, by the configured rates."""
        with self._random_lock:
            if self._spared < self.faults.spared:
                self._spared += 1
                return None
            draw = self._random.random()
        if draw < self.faults.error_rate:
            return "error"
        if draw < self.faults.error_rate + self.faults.reset_rate:
            return "reset"
        return None

    def random_status(self) -> int:
        with self._random_lock:
            return self._random.choice((429, 503))


class LocalGcs:
    """A GCS emulator process plus the TLS proxy, with the environment that points clients at it.

    Use as a context manager; `environ` holds the variables to export to any process (this one
    or a subprocess) that should see the local GCS. Everything started is stopped on exit.
    """

    def __init__(self, workdir: pathlib.Path, bucket: str = "test-bucket"):
        self.workdir = pathlib.Path(workdir)
        self.bucket = bucket
        self.environ: dict[str, str] = {}
        self._emulator: subprocess.Popen | None = None
        self._proxy: subprocess.Popen | None = None

    def __enter__(self) -> "LocalGcs":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _start(self):
        self.workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        log = open(self.workdir / "emulator.log", "wb")  # noqa: SIM115 - lives with the process
        self._emulator = subprocess.Popen(
            [
                sys.executable, "-m", "gcp_storage_emulator", "start",
                "--host", "127.0.0.1", "--port", str(port),
                "--in-memory", "--default-bucket", self.bucket,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # so a Ctrl-C in pytest does not orphan it mid-request
        )
        log.close()
        self.endpoint = f"http://127.0.0.1:{port}"
        wait_until_serving(self.endpoint + "/", self._emulator)

        ca_path, cert_path, key_path = _make_ca_and_leaf(self.workdir)
        # The proxy runs in its own process too: TensorFlow holds the GIL through some of its
        # gs:// calls (TFRecordWriter.close uploads while holding it), so a proxy thread in the
        # test process would deadlock against it.
        self._proxy = subprocess.Popen(
            [
                sys.executable, __file__,
                "--emulator-port", str(port), "--cert", str(cert_path), "--key", str(key_path),
            ],
            stdout=subprocess.PIPE,
            stderr=open(self.workdir / "proxy.log", "wb"),  # noqa: SIM115
            start_new_session=True,
        )
        ready = self._proxy.stdout.readline().decode().split()
        if len(ready) != 2 or ready[0] != "serving":
            raise RuntimeError(
                f"GCS test proxy failed to start; see {self.workdir / 'proxy.log'}"
            )
        proxy_url = f"http://127.0.0.1:{ready[1]}"

        credentials = self.workdir / "application_default_credentials.json"
        credentials.write_text(json.dumps(_service_account_info(proxy_url + "/token")))
        self.environ = {
            # google-cloud-storage and Beam's GCS IO, through the proxy's plain-HTTP side.
            "STORAGE_EMULATOR_HOST": proxy_url,
            "GOOGLE_CLOUD_PROJECT": "test-project",
            "GOOGLE_APPLICATION_CREDENTIALS": str(credentials),
            # TensorFlow's gs:// filesystem (curl): through the proxy, trusting the test CA.
            "https_proxy": proxy_url,
            "HTTPS_PROXY": proxy_url,
            "CURL_CA_BUNDLE": str(ca_path),
            "REQUESTS_CA_BUNDLE": str(ca_path),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",
            "NO_GCE_CHECK": "true",
            "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
            # Python clients reach the proxy as an ordinary server, not as their proxy.
            "no_proxy": "127.0.0.1,localhost",
            "NO_PROXY": "127.0.0.1,localhost",
        }

    def close(self):
        for process in (self._proxy, self._emulator):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self._proxy = self._emulator = None

    def image_list(self, folder: pathlib.Path, prefix: str, listed: pathlib.Path) -> pathlib.Path:
        """`folder`'s JPEGs uploaded under `prefix`, and a CSV list of their gs:// URLs and
        labels (their folders' names) written to `listed`, which is returned."""
        from google.cloud import storage

        bucket = storage.Client().bucket(self.bucket)
        lines = []
        for path in sorted(folder.rglob("*.jpg")):
            name = f"{prefix}/{path.relative_to(folder)}"
            bucket.blob(name).upload_from_filename(path)
            lines.append(f"{self.url(name)},{path.parent.name}")
        listed.write_text("\n".join(lines) + "\n")
        return listed

    def url(self, *parts: str) -> str:
        """A gs:// URL in the test bucket."""
        return "gs://" + "/".join([self.bucket, *parts])

    @contextlib.contextmanager
    def faults(self, **faults):
        """Injects `Faults(**faults)` into every request for the duration of the block. Yields
        a dict that, after the block, says how many of each fault were dealt ("error",
        "reset", and "reset_media" of those cut off a file's bytes): a test can show that
        its run met them."""
        dealt: dict[str, int] = {}
        self._set_faults(Faults(**faults))
        try:
            yield dealt
        finally:
            dealt.update(self._set_faults(Faults()))

    def _set_faults(self, faults: Faults) -> dict[str, int]:
        request = urllib.request.Request(
            self.environ["STORAGE_EMULATOR_HOST"] + _CONTROL_PATH,
            data=json.dumps(dataclasses.asdict(faults)).encode(),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    @contextlib.contextmanager
    def exported(self):
        """Sets `environ` in this process for the duration of the block."""
        saved = {key: os.environ.get(key) for key in self.environ}
        os.environ.update(self.environ)
        try:
            yield self
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def _serve_proxy(argv: list[str] | None = None) -> None:
    """Entry point of the proxy process: prints `serving PORT` once it accepts connections."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emulator-port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    tls_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls_context.load_cert_chain(args.cert, args.key)
    proxy = _Proxy(args.emulator_port, tls_context)
    print("serving", proxy.server_address[1], flush=True)
    proxy.serve_forever()


if __name__ == "__main__":
    _serve_proxy()
