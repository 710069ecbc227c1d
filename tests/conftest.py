"""Shared test settings: hypothesis runs without deadlines (CI machines vary) and a bounded budget."""

from hypothesis import HealthCheck, settings

settings.register_profile("zbopt", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("zbopt")
