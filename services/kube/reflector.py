"""A list/watch loop over one kind of object, as client-go's reflector does it, on `kubernetes.aio`.

Why `kubernetes.aio` and not the sync client in a thread: the services are asyncio, and a thread blocked in
a watch read cannot be cancelled, so Ctrl-C or a pod stop would wait for the next event or the server's
watch timeout. The aio client is cancelled like any other task.

Why our own loop instead of `Watch.stream`'s reconnects or the bundled SharedInformer: we need bookmarks, a
relist on 410 Gone, capped exponential backoff after errors and a resume from the last resourceVersion after
a dropped connection, and neither gives all of that (the informer has no backoff and no bookmarks; `stream`
retries a 410 once with the same stale version). So each watch is one connection (`timeout_seconds`), and
this module decides what happens when it ends.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.aio import client, config, watch
from kubernetes.aio.client.exceptions import ApiException

log = logging.getLogger("claimbroker.kube")

Replace = Callable[[list[dict[str, Any]]], Awaitable[None]]
Apply = Callable[[str, dict[str, Any]], Awaitable[None]]


async def api_client(kubeconfig: Path | None = None) -> client.ApiClient:
    """An explicit kubeconfig wins; otherwise in-cluster (the pod's ServiceAccount), then ~/.kube/config."""
    configuration = client.Configuration()
    if kubeconfig is not None:
        await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            await config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


@dataclass
class Backoff:
    """Capped exponential backoff with jitter; the first retry after a 410 is immediate (a relist is the
    normal answer to an expired version), repeated failures wait longer, so an API server in trouble is
    not hammered."""

    initial: float = 0.5
    cap: float = 30.0
    failures: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next_delay(self, *, gone: bool = False) -> float:
        self.failures += 1
        if gone and self.failures == 1:
            return 0.0
        return min(self.cap, self.initial * 2 ** (self.failures - 1)) * self.rng.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.failures = 0


@dataclass
class Reflector:
    """Lists, then watches from the listed version; on 410 relists; on errors backs off and resumes. `replace`
    gets every object of a (re)list, `apply` each event's type and object, both in the API's JSON (camelCase
    dicts); each returns once its effects are done, so a failure replays what it missed."""

    api: client.ApiClient
    backoff_initial: float = 0.5
    backoff_cap: float = 30.0
    watch_timeout_s: int = 300
    lists: Counter[str] = field(default_factory=Counter)
    watched_from: dict[str, list[str]] = field(default_factory=dict)

    async def reflect(self, kind: str, list_fn: Callable[..., Awaitable[Any]], replace: Replace, apply: Apply,
                      **params: Any) -> None:
        """`params` go to the list and to each watch (a field or label selector)."""
        backoff = Backoff(self.backoff_initial, self.backoff_cap)
        version: str | None = None
        while True:
            gone = False
            try:
                if version is None:
                    listing = await list_fn(**params)
                    self.lists[kind] += 1
                    await replace([self.as_dict(item) for item in listing.items])
                    version = str(listing.metadata.resource_version)  # only once applied: else list again
                self.watched_from.setdefault(kind, []).append(version)
                # events as the API's JSON: the client's own model lookup misses some kinds (it derives
                # "V1ResourceClaim" from ResourceV1ResourceClaimList), and we want dicts anyway
                async with watch.Watch(return_type=object) as stream:
                    # the client's own timeout outlasts the server's, so a quiet watch ends cleanly, not in error
                    async for event in stream.stream(list_fn, **params, resource_version=version,
                                                     allow_watch_bookmarks=True,
                                                     timeout_seconds=self.watch_timeout_s,
                                                     _request_timeout=float(self.watch_timeout_s + 30)):
                        if event["type"] != "BOOKMARK":
                            await apply(event["type"], self.as_dict(event["object"]))
                        version = stream.resource_version or version  # after applying: a failure replays it
                        backoff.reset()
                continue  # the server ended the watch (its timeout): resume at once from where we are
            except asyncio.CancelledError:
                raise
            except ApiException as error:
                gone = error.status == 410
                if gone:
                    log.info("%s: resource version %s expired (410 Gone); relisting", kind, version)
                    version = None
                else:
                    log.warning("%s: list/watch failed: %s %s", kind, error.status, error.reason)
            except Exception as error:  # the watch loop's guard: dropped connections, timeouts, a server down
                log.warning("%s: watch interrupted (%r); resuming from %s", kind, error, version)
            await asyncio.sleep(backoff.next_delay(gone=gone))

    def as_dict(self, obj: Any) -> dict[str, Any]:
        """Client models to the API's camelCase JSON (bookmark objects are dicts already)."""
        return obj if isinstance(obj, dict) else dict(self.api.sanitize_for_serialization(obj))
