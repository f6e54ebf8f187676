"""Accuracy validation: reference logits, metrics and gates, and the runners that compute them."""
