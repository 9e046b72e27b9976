"""The ledger's reads and writes that services/notifier/service.py calls by these names: the alert history
(shared/ledger/alerts.py), tenants' own pendingAlertAfter (tenants.py), who waits (pending.py). Kept until
service.py imports those modules itself."""

from shared.ledger.alerts import changed_since, open_alerts, record
from shared.ledger.pending import waiting_since as waiting_claims
from shared.ledger.tenants import pending_alert_after as tenant_thresholds

__all__ = ["changed_since", "open_alerts", "record", "tenant_thresholds", "waiting_claims"]
