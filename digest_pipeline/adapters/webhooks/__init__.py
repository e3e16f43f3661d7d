"""Provider webhooks whose verification needs more than the standard library (ECDSA, X.509)."""
