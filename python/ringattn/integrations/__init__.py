"""Integrations of ringattn with other libraries (``ringattn.integrations.transformers``)."""
