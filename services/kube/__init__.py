"""Kubernetes plumbing shared by the services that talk to a cluster: the connection and the list/watch
loop (the watcher's inventory, the allocator's cluster claims)."""
