"""How a committed message reaches this process's members and its sender's ack.

One interface, :class:`~chat_server.delivery.base.Delivery`, with two
implementations: :class:`~chat_server.delivery.local.LocalDelivery` (one process:
the service delivers each commit itself) and
:class:`~chat_server.delivery.shared.SharedDelivery` (rooms shared through a broker:
commits come back through it, acks wait for their delivery, joins wait for the
subscription). :mod:`chat_server.wiring` picks one; the service calls it
unconditionally.
"""
