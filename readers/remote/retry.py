"""Bounded retries: which failures are transient, backoff with jitter, one clear error at the end.

Every request of a :class:`~readers.remote.store.Store` goes through
:meth:`Retrier.call`. The client libraries' own retries are switched off
(botocore ``max_attempts=1``, s3fs ``retries=1``) so that this module alone
decides, and the budget below is the whole budget:

* transient (HTTP 5xx, 408, 429, S3 ``SlowDown``/``InternalError``,
  connection refused/reset/closed, timeouts, truncated bodies): retried with
  exponential backoff and jitter, at most ``tries`` attempts and never past
  ``budget_s`` seconds; then :class:`RemoteUnavailableError` names the URL,
  the count, the time and the last cause;
* 404: :class:`ObjectNotFoundError` naming the object, not retried;
* 401/403 and S3 credential errors: :class:`RemoteAuthError` saying where
  credentials were looked for, not retried;
* anything else from the client (400, 416, ...): :class:`RemoteError`, not retried.

Every request also has connect and read timeouts (set on the client), so no
attempt waits forever and the whole call is bounded by about
``budget_s + read_timeout_s``.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

from readers.remote.errors import (
    ObjectNotFoundError,
    RemoteAuthError,
    RemoteError,
    RemoteUnavailableError,
    one_line,
)

log = logging.getLogger(__name__)

__all__ = ["RetryPolicy", "Retrier", "classify", "Failure"]

T = TypeVar("T")

AUTH_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
    "InvalidClientTokenId", "TokenRefreshRequired", "AuthorizationHeaderMalformed", "Unauthorized",
    "Forbidden", "401", "403",
})
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404"})
TRANSIENT_CODES = frozenset({
    "SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "Throttling", "ThrottlingException",
    "RequestLimitExceeded", "TooManyRequests", "500", "502", "503", "504",
})
#: Modules whose exceptions are the client's (wrapped as RemoteError); anything else is a bug: re-raised.
CLIENT_MODULES = ("botocore", "aiobotocore", "aiohttp", "s3fs", "fsspec", "urllib3", "http.client", "ssl")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. Defaults: 6 tries within 30 s; 10 s connect and 30 s read timeouts."""

    tries: int = 6
    budget_s: float = 30.0
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.tries < 1:
            raise ValueError(f"RetryPolicy.tries must be >= 1, got {self.tries}")
        if self.budget_s <= 0 or self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("RetryPolicy budget and timeouts must be > 0")

    def delays(self, rng: random.Random) -> Iterator[float]:
        """Waits between attempts: doubling from ``base_delay_s``, capped, jittered to [d/2, d]."""
        for attempt in range(self.tries - 1):
            d = min(self.max_delay_s, self.base_delay_s * (2 ** attempt))
            yield rng.uniform(d / 2, d)


@dataclass(frozen=True)
class Failure:
    """What went wrong: ``kind`` is transient, not_found, auth, client (other client error) or None (a bug)."""

    kind: str | None
    status: int | None = None
    code: str | None = None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < 8:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]


def _status_and_code(e: BaseException) -> tuple[int | None, str | None]:
    resp = getattr(e, "response", None)
    if isinstance(resp, dict) and "Error" in resp:  # botocore ClientError
        status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return (int(status) if status else None), str(resp["Error"].get("Code") or "") or None
    status = getattr(e, "status", None)  # aiohttp ClientResponseError
    if isinstance(status, int) and type(e).__module__.startswith("aiohttp"):
        return status, None
    return None, None


def _transient_type(e: BaseException) -> bool:
    if isinstance(e, (ConnectionError, TimeoutError)):  # refused, reset, aborted, socket timeouts
        return True
    name, module = type(e).__name__, type(e).__module__
    if module.startswith(("botocore", "aiobotocore")):
        return name in {"EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
                        "ConnectTimeoutError", "ResponseStreamingError", "IncompleteReadError",
                        "HTTPClientError", "ProxyConnectionError", "ConnectionError"}
    if module.startswith("aiohttp"):
        return name in {"ClientConnectionError", "ClientOSError", "ServerDisconnectedError",
                        "ClientPayloadError", "ServerTimeoutError", "ClientConnectorError",
                        "ConnectionTimeoutError", "SocketTimeoutError", "ClientConnectionResetError"}
    if module.startswith("fsspec"):
        return name == "FSTimeoutError"
    return name in {"IncompleteRead", "ProtocolError", "RemoteDisconnected"}


def classify(exc: BaseException) -> Failure:
    """Sort a client exception into transient / not_found / auth / client, or None when it is not the client's."""
    statuses = [sc for sc in (_status_and_code(e) for e in _chain(exc)) if sc != (None, None)]
    for status, code in statuses:
        if status == 404 or code in NOT_FOUND_CODES:
            return Failure("not_found", status, code)
        if status in (401, 403) or code in AUTH_CODES:
            return Failure("auth", status, code)
        if (status is not None and (status >= 500 or status in (408, 429))) or code in TRANSIENT_CODES:
            return Failure("transient", status, code)
    chain = list(_chain(exc))
    if any(_transient_type(e) for e in chain):
        return Failure("transient")
    if isinstance(exc, FileNotFoundError):  # fsspec's HTTP 404 carries no response
        return Failure("not_found", 404)
    if statuses:
        return Failure("client", *statuses[0])
    if isinstance(exc, OSError) or any(type(e).__module__.startswith(CLIENT_MODULES) for e in chain):
        return Failure("client")
    return Failure(None)


class Retrier:
    """Runs one request with the policy; turns failures into one-line :class:`RemoteError` s."""

    def __init__(self, policy: RetryPolicy, credential_sources: Callable[[], str] | str = "",
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.policy = policy
        self._credential_sources = credential_sources
        self._sleep = sleep
        self._rng = random.Random()

    def credential_sources(self) -> str:
        cs = self._credential_sources
        return cs() if callable(cs) else cs

    def call(self, fn: Callable[[], T], url: str, what: str = "GET") -> T:
        policy, start = self.policy, time.monotonic()
        delays = policy.delays(self._rng)
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except RemoteError:
                raise
            except Exception as exc:  # sorted below; non-client exceptions re-raised unchanged
                failure = classify(exc)
                if failure.kind is None:
                    raise  # a bug, not a network failure: keep the original exception
                if failure.kind != "transient":
                    raise self._final(exc, failure, url, what) from exc
                elapsed = time.monotonic() - start
                delay = next(delays, None)
                if delay is None or elapsed + delay > policy.budget_s:
                    raise RemoteUnavailableError(
                        f"{url}: {what} failed after {attempt} tries in {elapsed:.1f}s (retry budget "
                        f"{policy.tries} tries / {policy.budget_s:g}s); last error: {one_line(exc)}"
                    ) from exc
                log.warning("%s: %s failed (%s); retry %d/%d in %.1fs", url, what, one_line(exc, 120),
                            attempt, policy.tries - 1, delay)
                self._sleep(delay)

    def _final(self, exc: Exception, failure: Failure, url: str, what: str) -> RemoteError:
        status = f"HTTP {failure.status}" if failure.status else ""
        detail = " ".join(x for x in (status, failure.code if failure.code != str(failure.status) else "") if x)
        if failure.kind == "not_found":
            what_missing = "bucket" if failure.code == "NoSuchBucket" else "object"
            return ObjectNotFoundError(f"{url}: no such {what_missing} ({detail or 'HTTP 404'})")
        if failure.kind == "auth":
            where = self.credential_sources() or "the request headers given in storage_options"
            return RemoteAuthError(f"{url}: access denied ({detail or one_line(exc)}); "
                                   f"credentials were looked for in: {where}")
        return RemoteError(f"{url}: {what} failed: {detail + '; ' if detail else ''}{one_line(exc)}")
