"""The notifier's app: its FastStream broker with the notifier's router (the inventory it reads, the alerts
it sends), and the notifier's status loop on the broker's connection."""

from __future__ import annotations

from pathlib import Path

from services.bus import channels
from services.notifier.service import Notifier
from services.runtime.service_app import ServiceApp
from shared.ledger.handles import AsyncEngine
from shared.settings import NotifierSettings


def notifier_app(nats_url: str, notifier: Notifier, tls_ca: Path | None = None) -> ServiceApp:
    return ServiceApp("notifier", nats_url, notifier.run, channels.notifier_router(notifier.on_inventory),
                      service=notifier, not_ready=notifier.not_ready, tls_ca=tls_ca)


def create_app(settings: NotifierSettings, engine: AsyncEngine, nats_url: str) -> ServiceApp:
    return notifier_app(nats_url, Notifier(engine, settings), settings.tls_ca)
