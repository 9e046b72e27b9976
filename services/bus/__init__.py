"""The NATS plumbing every service shares: the embedded server, connections, the contract's streams, publishing,
the consumer shell, the channels and their AsyncAPI document, and the authority that keeps nats-server's accounts."""
