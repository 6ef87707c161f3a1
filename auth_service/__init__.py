"""chatlab's auth service: registers users, checks passwords, issues the chat server's JWTs.

Run it with ``python -m auth_service``; the HTTP API and its error codes are fixed
by the contract (``docs/protocol.md``, section "Auth service").
"""
