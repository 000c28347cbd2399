"""What agentrl's HTTP services share (the environment server and the policy endpoint): bearer-token
authentication, one JSON error shape, request limits, and binding the listening socket."""
