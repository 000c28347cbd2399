"""Inference side: an owned vLLM server process and an async, token-faithful client."""

from agentrl.config.inference import VLLMServerConfig
from agentrl.inference.client import (
    ContextLengthError,
    EndpointPool,
    Generation,
    InferenceClient,
    InferenceError,
)
from agentrl.inference.server import (
    ServerStartError,
    VLLMServer,
    reap_stale,
    validate_model_dir,
)

__all__ = [
    "ContextLengthError",
    "EndpointPool",
    "Generation",
    "InferenceClient",
    "InferenceError",
    "ServerStartError",
    "VLLMServer",
    "VLLMServerConfig",
    "reap_stale",
    "validate_model_dir",
]
