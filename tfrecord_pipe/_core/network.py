"""A probe for servers we are about to depend on (a TPU, a tf.data service dispatcher).

TensorFlow retries an unreachable gRPC address without end, in silence; one TCP connection,
with a timeout, says at once whether anything listens there.
"""

from __future__ import annotations

import socket
from urllib import parse


def check_reachable(address: str, timeout_s: float) -> None:
    """Opens and closes a TCP connection to `address` ("grpc://host:port" or "host:port").

    Raises:
      ValueError: `address` holds no host and port.
      OSError: nothing accepted a connection within `timeout_s` (refused, timed out, unknown
        host).
    """
    url = parse.urlparse(address if "://" in address else f"grpc://{address}")
    try:
        host, port = url.hostname, url.port
    except ValueError as err:  # a port that is not a number
        raise ValueError(f"no HOST:PORT in {address!r} ({err})") from err
    if not host or port is None:
        raise ValueError(f"no HOST:PORT in {address!r}")
    with socket.create_connection((host, port), timeout_s):
        pass
