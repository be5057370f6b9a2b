from django.apps import AppConfig


class SessionsConfig(AppConfig):
    """Opt-in app: lease-backed remote HTTP sessions (``browser``) and their revocation handler."""

    name = "leases.contrib.sessions"
    # Not "sessions": that label belongs to django.contrib.sessions.
    label = "leases_sessions"
    verbose_name = "Lease reference consumer: remote sessions"

    def ready(self) -> None:
        # Every process registers the handler: a session of a dead pod is closed by whichever
        # pod reaps its lease.
        from leases.revocation.handlers import register_handler

        from . import SessionHandler

        register_handler(SessionHandler())
