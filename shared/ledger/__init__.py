"""The SQL ledger: tenants, quotas, claims, allocations, and the inbox/outbox for exactly-once effects."""
