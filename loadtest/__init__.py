"""The Locust load test of the chat server: ``locust -f loadtest/chat.py`` (loadtest/README.md)."""
