"""Bounded retries: which failures are transient, backoff with jitter, one clear error at the end.

Every request of a :class:`~readers.remote.store.Store` goes through
:meth:`Retrier.call`. The client libraries' own retries are switched off
(botocore ``max_attempts=1``, s3fs ``retries=1``) so that this module alone
decides, and the budget below is the whole budget:

* transient (HTTP 5xx, 408, 429, S3 ``SlowDown``/``InternalError``,
  connection refused/reset/closed, timeouts, truncated bodies): retried with
  exponential backoff (capped at ``max_delay_s``) and jitter until ``budget_s``
  seconds have passed (the last wait is shortened so that one more attempt
  starts when the budget ends; ``tries``, when set, also caps the attempts);
  then :class:`RemoteUnavailableError` names the URL, the count, the time and
  the last cause;
* 404: :class:`ObjectNotFoundError` naming the object, not retried;
* 401/403 and S3 credential errors: :class:`RemoteAuthError` saying where
  credentials were looked for, not retried;
* anything else from the client (400, 416, ...): :class:`RemoteError`, not retried.

Every request also has connect and read timeouts (set on the client), and a
call that reads (:meth:`Retrier.call` with ``deadline=True``) has a wall-clock
deadline of ``budget_s + read_timeout_s`` from its start over all its attempts:
each attempt is given the time left (``fn(timeout_s)``) and is cancelled when it
runs out, so a server trickling one byte at a time cannot keep a call alive
past it.
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
    "Forbidden", "401", "403", "AuthenticationFailed", "AuthorizationFailure", "AuthorizationPermissionMismatch",
})
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404", "BlobNotFound", "ContainerNotFound"})
TRANSIENT_CODES = frozenset({
    "SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "Throttling", "ThrottlingException",
    "RequestLimitExceeded", "TooManyRequests", "500", "502", "503", "504", "ServerBusy", "OperationTimedOut",
})
#: Modules whose exceptions are the client's (wrapped as RemoteError); anything else is a bug: re-raised.
CLIENT_MODULES = ("botocore", "aiobotocore", "aiohttp", "s3fs", "fsspec", "urllib3", "http.client", "ssl",
                  "gcsfs", "google", "adlfs", "azure")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try. Defaults: retry for 30 s; 10 s connect and 30 s read timeouts.

    ``budget_s`` is the time transient failures are retried for (a store that
    is back within it is ridden out); ``tries`` (None: no count limit) caps
    the attempts as well. A reading call ends by ``deadline_s`` (``budget_s +
    read_timeout_s``) whatever the server does.
    """

    tries: int | None = None
    budget_s: float = 30.0
    base_delay_s: float = 0.5
    max_delay_s: float = 8.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.tries is not None and self.tries < 1:
            raise ValueError(f"RetryPolicy.tries must be >= 1 (or None), got {self.tries}")
        if self.budget_s <= 0 or self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("RetryPolicy budget and timeouts must be > 0")
        if self.base_delay_s <= 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError("RetryPolicy delays: need 0 < base_delay_s <= max_delay_s")

    @property
    def deadline_s(self) -> float:
        """Wall-clock limit of one reading call, all attempts and waits included."""
        return self.budget_s + self.read_timeout_s

    def describe(self) -> str:
        """The budget as messages show it."""
        return f"{self.tries} tries / {self.budget_s:g}s" if self.tries is not None else f"{self.budget_s:g}s"

    def delays(self, rng: random.Random) -> Iterator[float]:
        """Waits between attempts: doubling from ``base_delay_s``, capped, jittered to [d/2, d].

        ``tries - 1`` of them when ``tries`` is set, else endless (the budget's time stops the retries).
        """
        attempt = 0
        while self.tries is None or attempt < self.tries - 1:
            d = min(self.max_delay_s, self.base_delay_s * (2 ** min(attempt, 60)))
            yield rng.uniform(d / 2, d)
            attempt += 1


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
    module = type(e).__module__
    status = getattr(e, "status", None)  # aiohttp ClientResponseError
    if isinstance(status, int) and module.startswith("aiohttp"):
        return status, None
    code = getattr(e, "code", None)  # gcsfs HttpError: the JSON API's status
    if isinstance(code, int) and module.startswith("gcsfs"):
        return code, None
    status = getattr(e, "status_code", None)  # azure.core HttpResponseError
    if isinstance(status, int) and module.startswith("azure"):
        return status, (str(getattr(e, "error_code", None) or "") or None)
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
    if module.startswith("azure"):
        return name in {"ServiceRequestError", "ServiceResponseError", "ServiceRequestTimeoutError",
                        "ServiceResponseTimeoutError", "IncompleteReadError"}
    if module.startswith("google.auth"):
        return name == "TransportError"
    return name in {"IncompleteRead", "ProtocolError", "RemoteDisconnected"}


#: "found no credentials to sign with" (botocore, google.auth, azure.identity; nothing was sent): an auth failure.
NO_CREDENTIALS = frozenset({"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                            "DefaultCredentialsError", "CredentialUnavailableError", "ClientAuthenticationError"})


def classify(exc: BaseException) -> Failure:
    """Sort a client exception into transient / not_found / auth / client, or None when it is not the client's."""
    if any(type(e).__name__ in NO_CREDENTIALS for e in _chain(exc)):
        return Failure("auth", None, "NoCredentials")
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


#: What to do when no credentials were found, by URL scheme.
HOW_TO_SIGN = {
    "s3": "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, an AWS profile, or pass storage_options={'key': ..., "
          "'secret': ...} (or {'anon': True} for a public bucket)",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, run 'gcloud auth application-default "
          "login', or pass storage_options={'token': ...} (or {'token': 'anon'} for a public bucket)",
    "az": "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY / "
          "AZURE_STORAGE_SAS_TOKEN, run 'az login', or pass storage_options={'account_name': ..., 'account_key': ...}",
}
HOW_TO_SIGN["abfs"] = HOW_TO_SIGN["az"]


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

    def call(self, fn: Callable[..., T], url: str, what: str = "GET", *, deadline: bool = False) -> T:
        """``fn()`` with retries; with ``deadline``, ``fn(timeout_s)`` gets the seconds this attempt may take.

        A ``deadline`` call ends within ``policy.deadline_s`` of its start; ``fn``
        must stop (raise a timeout) when its ``timeout_s`` runs out.
        """
        policy, start = self.policy, time.monotonic()
        end = start + policy.deadline_s
        delays = policy.delays(self._rng)
        attempt = 0
        while True:
            attempt += 1
            try:
                if not deadline:
                    return fn()
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no time left of the {policy.deadline_s:g}s deadline")
                return fn(left)
            except RemoteError:
                raise
            except Exception as exc:  # sorted below; non-client exceptions re-raised unchanged
                failure = classify(exc)
                if failure.kind is None:
                    raise  # a bug, not a network failure: keep the original exception
                if failure.kind != "transient":
                    raise self._final(exc, failure, url, what) from exc
                now = time.monotonic()
                elapsed, left_budget = now - start, policy.budget_s - (now - start)
                if deadline and end - now <= 0.05:
                    raise RemoteUnavailableError(
                        f"{url}: {what} did not finish within its deadline of {policy.deadline_s:g}s (retry "
                        f"budget {policy.describe()} + read timeout {policy.read_timeout_s:g}s; {attempt} "
                        f"{'try' if attempt == 1 else 'tries'}): the server is stalled or too slow; last error: "
                        f"{one_line(exc, kind=True)}") from exc
                delay = next(delays, None)
                if delay is None or left_budget <= 0.05:
                    raise RemoteUnavailableError(
                        f"{url}: {what} failed after {attempt} tries in {elapsed:.1f}s (retry budget "
                        f"{policy.describe()}); last error: {one_line(exc, kind=True)}"
                    ) from exc
                delay = min(delay, left_budget)  # the last attempt starts as the budget ends
                log.warning("%s: %s failed (%s); retry %d in %.1fs (%.1fs of the %gs budget left)", url, what,
                            one_line(exc, 120, kind=True), attempt, delay, left_budget, policy.budget_s)
                self._sleep(delay)

    def _final(self, exc: Exception, failure: Failure, url: str, what: str) -> RemoteError:
        status = f"HTTP {failure.status}" if failure.status else ""
        detail = " ".join(x for x in (status, failure.code if failure.code != str(failure.status) else "") if x)
        if failure.kind == "not_found":
            what_missing = "bucket" if failure.code == "NoSuchBucket" else "object"
            return ObjectNotFoundError(f"{url}: no such {what_missing} ({detail or 'HTTP 404'})")
        if failure.kind == "auth":
            where = self.credential_sources() or "the request headers given in storage_options"
            if failure.code == "NoCredentials":
                hint = HOW_TO_SIGN.get(url.split("://", 1)[0].lower(), HOW_TO_SIGN["s3"])
                return RemoteAuthError(f"{url}: no credentials found ({one_line(exc, 160, kind=True)}); looked in: "
                                       f"{where}; {hint}")
            return RemoteAuthError(f"{url}: access denied ({detail or one_line(exc, kind=True)}); "
                                   f"credentials were looked for in: {where}")
        return RemoteError(f"{url}: {what} failed: {detail + '; ' if detail else ''}{one_line(exc, kind=True)}")
