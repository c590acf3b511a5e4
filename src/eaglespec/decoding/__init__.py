"""The one decoding loop and its sampling rules."""
