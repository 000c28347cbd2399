"""Small helpers with no agentrl dependencies: atomic file writes, a bounded LRU lookup, garbage-collection
tuning for long-running processes, and the one retry policy of every network client."""
