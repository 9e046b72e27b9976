"""The alert engine: conditions in, messages to publish out. Pure: no clock, no I/O.

Rules of the contract, kept here so they can be tested with a fake clock:

* an alert's `key` names its condition; the first raise of a key is published at once;
* repeats of a key inside the fold window are counted, not published; when the window closes one
  message carries the episode's total `count`;
* when the condition ends a `resolved: true` message follows, if the alert was ever published;
* floods are rate-limited per key and per tenant (token buckets). A suppressed message is never lost:
  its count stays in the episode and shows in the next message for that key. An episode that came and
  went while suppressed is reported once, resolved, with its count, when the rate allows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.contract import events

SEVERITIES = ("info", "warning", "critical")


def severity_rank(severity: str) -> int:
    """Order of severities, for sinks that only want `warning` and above."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else 0


def alert_key(kind: str, *subject: str) -> str:
    """`kind:tenant/claim`, `kind:node`, `kind:node/device`: the key says what it is about."""
    return f"{kind}:{'/'.join(subject)}"


@dataclass(frozen=True)
class Alert:
    """One observation of a condition. Raising the same key again is a repeat of the same condition."""

    kind: str
    severity: str
    key: str
    summary: str
    details: Mapping[str, Any] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def tenant(self) -> str | None:
        return self.labels.get("tenant")


@dataclass(frozen=True)
class Message:
    """A message to publish, in the contract's payload shape."""

    alert: Alert
    first_seen: float
    last_seen: float
    count: int
    resolved: bool

    @property
    def payload(self) -> dict[str, Any]:
        a = self.alert
        return events.alert(kind=a.kind, severity=a.severity, key=a.key, summary=a.summary, details=a.details,
                            labels=a.labels, first_seen=self.first_seen, last_seen=self.last_seen,
                            count=self.count, resolved=self.resolved)

    @property
    def msg_id(self) -> str:
        """Derived from what the message says, so re-publishing it after a crash is a JetStream duplicate."""
        state = "resolved" if self.resolved else "firing"
        return f"alert:{self.alert.key}:{events.now_iso(self.first_seen)}:{self.count}:{state}"


@dataclass(frozen=True)
class AlertPolicy:
    """Rates are messages per minute, and also the burst a quiet key or tenant may send at once."""

    fold_window: float = 300.0
    rate_per_key: float = 6.0
    rate_per_tenant: float = 60.0


@dataclass
class _Bucket:
    tokens: float
    at: float

    def refill(self, now: float, per_minute: float) -> None:
        capacity = max(1.0, per_minute)
        self.tokens = min(capacity, self.tokens + max(0.0, now - self.at) * per_minute / 60.0)
        self.at = max(self.at, now)


@dataclass
class _Episode:
    alert: Alert
    first_seen: float
    last_seen: float
    count: int = 1
    reported: int = 0  # the count in the last published message; 0: never published
    window_end: float = 0.0
    ended: bool = False  # resolved before it could ever be published


class AlertBook:
    """Open episodes per key. Each call takes `now` and returns what to publish, in order."""

    def __init__(self, policy: AlertPolicy | None = None) -> None:
        self.policy = policy or AlertPolicy()
        self._open: dict[str, _Episode] = {}
        self._last_first_seen: dict[str, float] = {}
        self._key_buckets: dict[str, _Bucket] = {}
        self._tenant_buckets: dict[str, _Bucket] = {}
        self.suppressed = 0  # messages held back by the rate limits so far (for metrics and logs)

    def is_open(self, key: str) -> bool:
        return key in self._open

    def open_keys(self) -> list[str]:
        return list(self._open)

    def restore(self, alert: Alert, *, first_seen: float, last_seen: float, count: int) -> None:
        """An alert published before a restart: later repeats fold into it and its resolve is sent."""
        self._open[alert.key] = _Episode(alert, first_seen, last_seen, count=count, reported=count,
                                         window_end=last_seen + self.policy.fold_window)
        self._last_first_seen[alert.key] = first_seen

    def raise_(self, alert: Alert, now: float) -> list[Message]:
        episode = self._open.get(alert.key)
        if episode is None:
            first = now
            previous = self._last_first_seen.get(alert.key)
            if previous is not None and first < previous + 0.000002:
                # (key, firstSeen) names an episode, to the microsecond: keep episodes distinct
                first = previous + 0.001
            self._last_first_seen[alert.key] = first
            episode = _Episode(alert, first, now, window_end=first + self.policy.fold_window)
            self._open[alert.key] = episode
            return self._try_send(episode, now)
        episode.alert, episode.last_seen = alert, max(episode.last_seen, now)
        episode.count += 1
        if episode.ended:  # came back before its end could be reported: one episode, still unreported
            episode.ended = False
        if episode.reported == 0 or now >= episode.window_end:
            return self._try_send(episode, now)
        return []  # folded: counted, reported when the window closes

    def resolve(self, key: str, now: float, summary: str | None = None) -> list[Message]:
        episode = self._open.get(key)
        if episode is None or episode.ended:
            return []
        if summary is not None:
            episode.alert = Alert(episode.alert.kind, episode.alert.severity, key, summary,
                                  episode.alert.details, episode.alert.labels)
        episode.last_seen = max(episode.last_seen, now)
        if episode.reported > 0:
            # A subscriber saw it open: the end is always sent, rate or not, or it would stay open forever.
            self._take(episode.alert, now, force=True)
            del self._open[key]
            return [self._message(episode, resolved=True)]
        episode.ended = True
        return self._try_send(episode, now)

    def flush(self, now: float) -> list[Message]:
        """Close fold windows and send what the rate limits held back; call it on a timer."""
        out: list[Message] = []
        for episode in list(self._open.values()):
            unreported = episode.reported == 0 or episode.ended
            window_closed = episode.count > episode.reported and now >= episode.window_end
            if unreported or window_closed:
                out.extend(self._try_send(episode, now))
        self._forget(now)
        return out

    def _forget(self, now: float) -> None:
        """Drop what closed keys left behind once it no longer matters (full buckets, old episode starts),
        so a long-running book does not grow with every claim it ever saw."""
        for key in [k for k, first in self._last_first_seen.items() if k not in self._open and first < now - 1.0]:
            del self._last_first_seen[key]
        for buckets, rate in ((self._key_buckets, self.policy.rate_per_key),
                              (self._tenant_buckets, self.policy.rate_per_tenant)):
            for name, bucket in list(buckets.items()):
                bucket.refill(now, rate)
                if bucket.tokens >= max(1.0, rate) and name not in self._open:
                    del buckets[name]

    def _try_send(self, episode: _Episode, now: float) -> list[Message]:
        if not self._take(episode.alert, now):
            self.suppressed += 1
            return []
        if episode.ended:
            del self._open[episode.alert.key]
            return [self._message(episode, resolved=True)]
        episode.reported = episode.count
        episode.window_end = now + self.policy.fold_window
        return [self._message(episode, resolved=False)]

    def _take(self, alert: Alert, now: float, *, force: bool = False) -> bool:
        buckets = []
        if self.policy.rate_per_key > 0:  # a rate of 0 turns that limit off
            buckets.append((self._bucket(self._key_buckets, alert.key, self.policy.rate_per_key, now),
                            self.policy.rate_per_key))
        if alert.tenant is not None and self.policy.rate_per_tenant > 0:
            buckets.append((self._bucket(self._tenant_buckets, alert.tenant, self.policy.rate_per_tenant, now),
                            self.policy.rate_per_tenant))
        for bucket, rate in buckets:
            bucket.refill(now, rate)
        allowed = all(bucket.tokens >= 1.0 for bucket, _ in buckets)
        if allowed or force:
            for bucket, _ in buckets:
                bucket.tokens = max(0.0, bucket.tokens - 1.0)
        return allowed

    @staticmethod
    def _bucket(buckets: dict[str, _Bucket], name: str, per_minute: float, now: float) -> _Bucket:
        return buckets.setdefault(name, _Bucket(tokens=max(1.0, per_minute), at=now))

    @staticmethod
    def _message(episode: _Episode, *, resolved: bool) -> Message:
        return Message(episode.alert, episode.first_seen, episode.last_seen, episode.count, resolved)


def apply(book: AlertBook, actions: Iterable[Raise | Resolve], now: float) -> list[Message]:
    """Run rule actions through the book, in order."""
    out: list[Message] = []
    for action in actions:
        if isinstance(action, Raise):
            out.extend(book.raise_(action.alert, now))
        else:
            out.extend(book.resolve(action.key, now, action.summary))
    return out


@dataclass(frozen=True)
class Raise:
    """A rule saw its condition (again)."""

    alert: Alert


@dataclass(frozen=True)
class Resolve:
    """A rule saw its condition end; resolving a key that is not open does nothing."""

    key: str
    summary: str | None = None


Action = Raise | Resolve
