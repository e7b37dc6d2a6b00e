"""nnrp-vllm-gateway: serve a co-located vLLM OpenAI server over NNRP/1 sessions."""

__version__ = "0.1.0"
