"""The OpenAI-compatible server: the engine thread, the request schema, the app and its page."""
