"""What installs agentrl itself: scripts that run before its dependencies are there (standard library only)."""
