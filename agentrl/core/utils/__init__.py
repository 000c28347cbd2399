"""Small helpers with no agentrl dependencies: atomic file writes, a bounded LRU lookup, garbage-collection
tuning for long-running processes, the one retry policy of every network client, the standard error
of a rate, the process table, and the warden that ends what a process started when it dies."""
