"""What both services and the lab share: settings machinery, the event-loop choice, key ids,
log redaction, the supervisor of background work, and the process harness that runs chatlab
for real.

Neither service's package imports the other's; both import this one, which imports neither.
"""
