"""The eager PyTorch reference policy from ``learner.safetensors`` (torch imported only when opened)."""
