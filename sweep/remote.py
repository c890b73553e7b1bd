"""Remote storages (``s3://``, ``gs://``, any pyarrow filesystem URI): clients whose waits are bounded, and the
check that one answers before a sweep relies on it.

The clients' defaults wait a long time for a storage that does not answer: S3 about 100 s for an endpoint that
accepts connections but never replies, GCS without credentials 15 minutes and more while it looks for a cloud
metadata server. A sweep asks once, before anything else, and names what to check within REACH_TIMEOUT_S.
"""

from __future__ import annotations

import threading
from typing import Any

from sac_edge.common.errors import SacEdgeError

#: S3: the longest a connection may take, and a request may go without a byte moving, before an attempt
#: fails (three attempts in all, pyarrow's default; pyarrow's S3 URIs cannot set these).
CONNECT_TIMEOUT_S = 10.0
STALL_TIMEOUT_S = 10.0
#: The bound on the first answer of a remote storage: past it the sweep stops with one line. (GCS without
#: credentials waits for a metadata server however its retries are limited: only this bounds it.)
REACH_TIMEOUT_S = 60.0
#: What to check, by pyarrow's name of the filesystem.
HINTS = {
    "s3": "that its endpoint (endpoint_override=HOST:PORT, scheme=http or https) is up and reachable from here, "
    "the bucket, and the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)",
    "gcs": "the bucket and the credentials (GOOGLE_APPLICATION_CREDENTIALS naming a service-account key file; "
    "without credentials the client waits for a cloud metadata server)",
    "abfs": "the container and the credentials (AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY)",
}
DEFAULT_HINT = "that it is up and reachable from here, and the credentials its client reads"


def bounded(fs: Any, uri: str) -> Any:
    """``fs`` with the S3 waits above (its other settings kept); pyarrow's in-memory ``mock://`` refused: no
    trial in another process could reach it."""
    if fs.type_name == "mock":
        raise SacEdgeError(
            f"--storage {uri}: mock:// is a filesystem in one process's memory, which no trial reaches; give a path "
            "every node mounts or a storage URI such as s3://bucket/prefix"
        )
    if fs.type_name != "s3":
        return fs
    settings = fs.__reduce__()[1][0]  # what it was made with, as pickling rebuilds it
    return type(fs)(**{**settings, "connect_timeout": CONNECT_TIMEOUT_S, "request_timeout": STALL_TIMEOUT_S})


def hint(fs: Any) -> str:
    return HINTS.get(fs.type_name, DEFAULT_HINT)


def check_reachable(fs: Any, root: str, uri: str) -> None:
    """Refuse in one line, within REACH_TIMEOUT_S, a remote storage whose root cannot be looked up: its client
    asks in a thread of its own, so a client that waits on is left waiting and the sweep stops."""
    answer: dict[str, BaseException | None] = {}

    def ask() -> None:
        try:
            fs.get_file_info(root)
            answer["error"] = None
        except Exception as err:  # any failure of the storage client is the answer
            answer["error"] = err

    thread = threading.Thread(target=ask, name="sac-sweep-storage-check", daemon=True)
    thread.start()
    thread.join(REACH_TIMEOUT_S)
    if "error" not in answer:
        raise SacEdgeError(f"--storage {uri}: no answer within {REACH_TIMEOUT_S:g} s; check {hint(fs)}")
    err = answer["error"]
    if err is not None:
        raise SacEdgeError(f"--storage {uri}: cannot reach it ({first_line(err)}); check {hint(fs)}")


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
