"""Small helpers with no agentrl dependencies: atomic file writes, a bounded LRU lookup, garbage-collection
tuning for long-running processes, the one retry policy of every network client, and the standard error
of a rate."""
